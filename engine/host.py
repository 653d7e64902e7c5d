"""What this host lets the process have: the memory it may still take (cgroup v2 aware), the most it could
ever hold, and the CPU's name. Plain facts below the runtime and the plan, which both read them."""
from __future__ import annotations

from pathlib import Path


def available_memory(cgroup_root: str | Path = "/sys/fs/cgroup", proc_cgroup: str | Path = "/proc/self/cgroup") -> int:
    """Bytes of RAM this process can still take: the system's available memory, or less when the
    process runs inside a cgroup v2 with a `memory.max` (a container, a systemd slice): there the
    limit minus what the group already uses, the tightest of its ancestors. The group's page cache
    (files read, the libraries' pages) does not count: the kernel drops it under the cap. The part of it
    in use (the code being run) is the caller's to reserve; shared memory (a pinned cache) counts."""
    import psutil
    available = psutil.virtual_memory().available
    try:
        line = next(l for l in Path(proc_cgroup).read_text().splitlines() if l.startswith("0::"))
    except (OSError, StopIteration):
        return available
    group = Path(cgroup_root) / line[3:].strip().lstrip("/")
    root = Path(cgroup_root)
    while True:
        try:
            limit = (group / "memory.max").read_text().strip()
            if limit != "max":
                used = int((group / "memory.current").read_text()) - _droppable_file(group)
                available = min(available, max(int(limit) - used, 0))
        except (OSError, ValueError):
            pass
        if group == root or root not in group.parents:
            return available
        group = group.parent


def _droppable_file(group: Path) -> int:
    """The group's file pages the kernel can drop: all of its page cache but shared memory (which is
    counted in `file` too, and stays); where the stats have no `file`, the inactive part only."""
    try:
        stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines() if line.count(" ") == 1)
    except (OSError, ValueError):
        return 0
    try:
        if "file" in stat:
            return max(int(stat["file"]) - int(stat.get("shmem", 0)), 0)
        return int(stat.get("inactive_file", 0))
    except ValueError:
        return 0


def memory_limit(cgroup_root: str | Path = "/sys/fs/cgroup",
                 proc_cgroup: str | Path = "/proc/self/cgroup") -> tuple[int, str]:
    """(bytes, what) of all the memory this process could ever hold: the machine's RAM, or its cgroup
    v2's tightest `memory.max` when lower; `what` names which, for the sentence."""
    import psutil
    limit, what = psutil.virtual_memory().total, "the machine's memory"
    try:
        line = next(l for l in Path(proc_cgroup).read_text().splitlines() if l.startswith("0::"))
    except (OSError, StopIteration):
        return limit, what
    root = Path(cgroup_root)
    group = root / line[3:].strip().lstrip("/")
    while True:
        try:
            text = (group / "memory.max").read_text().strip()
            if text != "max" and int(text) < limit:
                limit, what = int(text), "the memory limit of this process's cgroup"
        except (OSError, ValueError):
            pass
        if group == root or root not in group.parents:
            return limit, what
        group = group.parent


def cgroup_capped() -> bool:
    """Whether a cgroup v2 `memory.max` below the machine's memory applies to this process."""
    import psutil
    return memory_limit()[0] < psutil.virtual_memory().total


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()
