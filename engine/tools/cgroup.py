"""A cgroup v2 memory cap for one benchmarked process (process + its page cache, mmap'd weights
included), where the OS lets us set one: a fresh group under the cgroup v2 root with `memory.max`, a
command started inside it, and its `memory.peak` read afterwards. Where that is not possible (no
cgroup v2, no memory controller, no permission) `MemoryCap.create` says why in one sentence, and the
caller falls back to budgets only.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# set in the environment of a process started inside a cap: the group's path
CAP_ENV = "SLUICE_MEMORY_CAP"


class CgroupUnavailable(Exception):
    """No cgroup v2 memory cap can be set here; the message says why."""


class MemoryCap:
    def __init__(self, path: Path, limit_bytes: int):
        self.path, self.limit_bytes = path, limit_bytes

    @classmethod
    def create(cls, name: str, limit_bytes: int, root: Path | None = None) -> "MemoryCap":
        """A new, empty group `root/name` (an old one of that name is removed first, so its peak starts at 0)."""
        root = Path(root or CGROUP_ROOT)
        try:
            controllers = (root / "cgroup.controllers").read_text().split()
        except OSError:
            raise CgroupUnavailable(f"{root} is not a cgroup v2 hierarchy") from None
        if "memory" not in controllers:
            raise CgroupUnavailable(f"the cgroup v2 memory controller is not available in {root}")
        path = root / name
        try:
            if "memory" not in (root / "cgroup.subtree_control").read_text().split():
                (root / "cgroup.subtree_control").write_text("+memory")
            if path.exists():
                path.rmdir()
            path.mkdir()
            (path / "memory.max").write_text(str(limit_bytes))
        except OSError as exc:
            raise CgroupUnavailable(f"cannot create a cgroup with a memory limit in {root} ({exc.strerror or exc})") from None
        return cls(path, limit_bytes)

    def command(self, argv: list[str]) -> list[str]:
        """`argv` started inside the group: the shell moves itself in, then execs (same pid)."""
        return ["sh", "-c", f'echo $$ > "{self.path}/cgroup.procs" && exec "$0" "$@"', *argv]

    def env(self) -> dict[str, str]:
        return {**os.environ, CAP_ENV: str(self.path)}

    def peak_bytes(self) -> int | None:
        """High-water mark of the group's memory (kernels >= 5.19), or None."""
        try:
            return int((self.path / "memory.peak").read_text())
        except (OSError, ValueError):
            return None

    def remove(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass         # a process is still inside, or it is gone already: the group is harmless


def drop_page_cache() -> bool:
    """Write dirty pages and drop the page cache, so that a run starts cold; False without permission."""
    subprocess.run(["sync"], check=False)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3")
        return True
    except OSError:
        return False


def own_cap() -> dict | None:
    """The cap this process was started under (by MemoryCap.command), as its group reports it."""
    path = os.environ.get(CAP_ENV)
    if not path:
        return None
    try:
        limit = (Path(path) / "memory.max").read_text().strip()
        inside = (Path(path) / "cgroup.procs").read_text().split()
    except OSError:
        return None
    return {"cgroup": path, "memory_max_bytes": int(limit) if limit.isdigit() else None,
            "this_process_inside": str(os.getpid()) in inside}


STAT_KEYS = ("anon", "file", "shmem", "active_file", "inactive_file", "kernel")


def own_cap_stat() -> dict[str, int] | None:
    """Where the cap's memory sits now (its memory.stat, bytes): anonymous, page cache (of which shared
    memory: the pinned RAM cache), kernel; None outside a cap. Read at the end of a capped bench, it says how
    much of the cap the libraries' page cache kept beside the process and the RAM cache."""
    path = os.environ.get(CAP_ENV)
    if not path:
        return None
    try:
        pairs = (line.split() for line in (Path(path) / "memory.stat").read_text().splitlines())
        stat = {key: int(value) for key, value in pairs if key in STAT_KEYS}
    except (OSError, ValueError):
        return None
    return stat or None
