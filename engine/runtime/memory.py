"""What the process holds, as the operating system and the GPU driver see it.

The VRAM budget is meant as the user sees it in `nvidia-smi`: the driver's per-process figure
includes the CUDA context and the allocator's reserve, which torch's own counters do not. The RAM
side is split into the RAM cache and everything else (torch, CUDA host allocations, Python, the
dense weights' page cache), so the default cache can take what the machine allows minus the rest.
"""
from __future__ import annotations

import os


def process_memory() -> tuple[int, int]:
    """(resident bytes, of which anonymous). File-backed pages (the libraries' code) can be dropped
    and read again under memory pressure; anonymous ones are what the process really holds."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        anon = int(fields["RssAnon"].split()[0]) + int(fields["RssShmem"].split()[0])   # the RAM cache is shared anonymous
        return int(fields["VmRSS"].split()[0]) << 10, anon << 10
    except (OSError, KeyError, ValueError):
        pass
    try:
        import psutil
        rss = psutil.Process().memory_info().rss
        return rss, rss
    except Exception:       # noqa: BLE001 - psutil missing or the platform refuses: report nothing
        return 0, 0


def anonymous_by_mapping(top: int = 6, min_region: int = 64 << 20) -> list[tuple[str, int]]:
    """Where the process's anonymous memory sits, largest first: [(what, bytes)] from /proc/self/smaps.
    A library's name stands for its private copies (data, relocations); "[heap]" is the C heap (glibc's
    other arenas are "anonymous maps"); maps of `min_region` or more are the RAM cache's chunks and
    large tensors ("shared" ones: the RAM cache). Empty where smaps cannot be read."""
    totals: dict[str, int] = {}
    name, field = "", "Rss:"
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 5)
                if not head[0].endswith(":"):                        # a mapping's header line
                    start, end = (int(a, 16) for a in head[0].split("-"))
                    path = head[5].strip() if len(head) > 5 else ""
                    name, field = _mapping_name(path, end - start >= min_region, head[1]), "Rss:"
                    if path.startswith("/") and not path.startswith("/dev/zero"):
                        field = "Anonymous:"                        # a file: only its private copies
                elif head[0] == field:
                    totals[name] = totals.get(name, 0) + (int(head[1]) << 10)
    except (OSError, ValueError, IndexError):
        return []
    return sorted(((k, v) for k, v in totals.items() if v), key=lambda kv: -kv[1])[:top]


def _mapping_name(path: str, large: bool, perms: str) -> str:
    if path.startswith("/") and not path.startswith("/dev/zero"):
        return os.path.basename(path)
    if path.startswith("[") and not path.startswith("[anon"):
        return path
    kind = "shared" if perms.endswith("s") else "private"
    return f"{'large' if large else 'small'} {kind} anonymous maps"


def drop_file_cache(path) -> None:
    """Let the kernel drop a file's cached pages (read once, not needed again soon): under a memory cap
    they would count against the RAM cache's room. Where posix_fadvise is missing, the pages just stay."""
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except OSError:
        pass


def release_free_heap() -> None:
    """Give the C heap's free pages back to the system (glibc keeps what large transient buffers
    freed, e.g. dense weights read on their way to the GPU: measured 0.79 GB kept after 0.4 GB of
    tensors were freed). Elsewhere, nothing to do."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class DriverMemory:
    """This process's memory on one GPU as NVML reports it (nvidia-ml-py), or None where NVML is not
    available (no library, no driver, a GPU without per-process accounting)."""

    def __init__(self, device_index: int):
        self._handle = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        except Exception:    # noqa: BLE001
            self._handle = None

    def used_bytes(self) -> int | None:
        if self._handle is None:
            return None
        try:
            processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except Exception:    # noqa: BLE001
            return None
        pid = os.getpid()
        return next((p.usedGpuMemory for p in processes if p.pid == pid and p.usedGpuMemory is not None), None)
