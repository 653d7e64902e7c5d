"""A cgroup v2 memory cap for one benchmarked process (process + its page cache, mmap'd weights
included), where the OS lets us set one: a fresh group under the cgroup v2 root with `memory.max`, a
command started inside it, and its `memory.peak` read afterwards. Where that is not possible (no
cgroup v2, no memory controller, no permission) `MemoryCap.create` says why in one sentence, and the
caller falls back to budgets only.
"""
from __future__ import annotations

import subprocess
import threading
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
STAT_KEYS = ("anon", "file", "shmem", "active_file", "inactive_file", "kernel")


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


class StatPoller:
    """Where a cap's memory sits (its memory.stat) at the group's highest use while a command runs in it:
    anonymous, page cache (of which shared memory: the pinned RAM cache), kernel."""

    def __init__(self, cap: MemoryCap, interval_s: float = 0.5):
        self.cap, self.interval_s = cap, interval_s
        self.at_peak: dict[str, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> "StatPoller":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            stat = memory_stat(self.cap.path)
            used = lambda s: s.get("anon", 0) + s.get("file", 0)              # noqa: E731
            if stat and (self.at_peak is None or used(stat) >= used(self.at_peak)):
                self.at_peak = stat


def memory_stat(group: Path) -> dict[str, int] | None:
    try:
        pairs = (line.split() for line in (group / "memory.stat").read_text().splitlines())
        stat = {key: int(value) for key, value in pairs if key in STAT_KEYS}
    except (OSError, ValueError):
        return None
    return stat or None
