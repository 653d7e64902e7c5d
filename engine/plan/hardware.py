"""What this machine has: RAM, GPUs, cores, and how fast its disk, memory and PCIe really move bytes.

The bandwidths feed the speed estimate (engine.plan.estimate). The disk test reads with O_DIRECT so
the page cache cannot flatter it: that is how the engine reads experts.
"""
from __future__ import annotations

import mmap
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.host import available_memory, cpu_name, memory_limit
from engine.runtime.memory import drop_file_cache

MiB = 2**20
DIRECT_ALIGN = 4096


@dataclass
class GpuInfo:
    name: str
    vram_total_bytes: int
    vram_free_bytes: int


@dataclass
class Hardware:
    cpu_name: str
    num_cpus: int
    performance_cores: list[int]
    ram_total_bytes: int
    ram_available_bytes: int
    mem_bw_bps: float                      # host memory copy bandwidth (bytes/s read+written counted once)
    gpus: list[GpuInfo] = field(default_factory=list)
    pcie_bps: float | None = None          # host pinned -> device copies, None without a GPU
    gpu_mem_bw_bps: float | None = None    # device-to-device copy bandwidth
    disk_read_bps: float | None = None     # O_DIRECT reads on the models folder, None if not measured

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)


def probe(models_dir: str | Path | None = None, disk_test_bytes: int = 256 * MiB, measure_gpu: bool = True) -> Hardware:
    """Probe everything; measuring takes about a second (most of it the disk test)."""
    import psutil
    vm = psutil.virtual_memory()
    hw = Hardware(cpu_name=cpu_name(), num_cpus=os.cpu_count() or 1, performance_cores=performance_cores(),
                  ram_total_bytes=vm.total, ram_available_bytes=available_memory(), mem_bw_bps=memory_bandwidth())
    if measure_gpu:
        hw.gpus, hw.pcie_bps, hw.gpu_mem_bw_bps = _probe_gpu()
    if models_dir is not None:
        hw.disk_read_bps = disk_read_bandwidth(models_dir, disk_test_bytes)
    return hw


def check_ram_cache_fits(ram_cache_bytes: int | None) -> None:
    """Refuse a RAM cache larger than all the memory this process could hold, with the numbers."""
    if ram_cache_bytes is None:
        return
    from engine.errors import SluiceError
    from engine.sizes import format_size
    limit, what = memory_limit()
    if ram_cache_bytes > limit:
        raise SluiceError(f"A RAM cache of {format_size(ram_cache_bytes)} is larger than {what} "
                          f"({format_size(limit)}); choose a smaller --ram-cache (or RAM cache in Settings).")


# --- bandwidth self-tests --------------------------------------------------------------------------
def disk_read_bandwidth(folder: str | Path, test_bytes: int = 256 * MiB, read_bytes: int = 4 * MiB) -> float:
    """Bytes/s reading a fresh test file in `folder` in `read_bytes` pieces in random order.

    Linux: O_DIRECT (page cache bypassed), falling back to buffered reads after
    posix_fadvise(DONTNEED) where the file system refuses O_DIRECT. Other systems: buffered
    (may read high if the OS caches). Random order, like expert reads, not a sequential stream."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    read_bytes = max(DIRECT_ALIGN, read_bytes // DIRECT_ALIGN * DIRECT_ALIGN)
    num_reads = max(1, test_bytes // read_bytes)
    path = folder / f".sluice-disktest-{os.getpid()}"
    try:
        _write_test_file(path, num_reads * read_bytes, read_bytes)
        offsets = [i * read_bytes for i in range(num_reads)]
        random.Random(0).shuffle(offsets)
        return _timed_reads(path, offsets, read_bytes)
    finally:
        path.unlink(missing_ok=True)


def _write_test_file(path: Path, size: int, piece: int) -> None:
    pattern = os.urandom(piece)         # incompressible, so compressing file systems cannot cheat
    with open(path, "wb") as fh:
        for _ in range(size // piece):
            fh.write(pattern)
        fh.flush()
        os.fsync(fh.fileno())
    drop_file_cache(path)


def _timed_reads(path: Path, offsets: list[int], read_bytes: int) -> float:
    buf = mmap.mmap(-1, read_bytes)     # page-aligned, as O_DIRECT requires
    flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0)
    try:
        fd = os.open(path, flags)
    except OSError:                      # file system without O_DIRECT (some tmpfs, network mounts)
        fd = os.open(path, os.O_RDONLY)
    try:
        start = time.perf_counter()
        for off in offsets:
            try:
                got = os.preadv(fd, [buf], off) if hasattr(os, "preadv") else _pread_into(fd, buf, off)
            except OSError:              # EINVAL: O_DIRECT accepted at open but not for reads
                os.close(fd)
                fd = os.open(path, os.O_RDONLY)
                got = _pread_into(fd, buf, off)
            if got != read_bytes:
                raise OSError(f"short read of the disk test file ({got} of {read_bytes} bytes)")
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        buf.close()
    return len(offsets) * read_bytes / max(elapsed, 1e-9)


def _pread_into(fd: int, buf: mmap.mmap, off: int) -> int:
    data = os.pread(fd, len(buf), off)
    buf[:len(data)] = data
    return len(data)


def memory_bandwidth(test_bytes: int = 64 * MiB, repeats: int = 3) -> float:
    """Host memcpy bytes/s (best of `repeats`): the CPU device's 'PCIe' and its compute bound."""
    import numpy as np
    src = np.ones(test_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return test_bytes / max(best, 1e-9)


def _probe_gpu() -> tuple[list[GpuInfo], float | None, float | None]:
    try:
        import torch
    except ImportError:
        return [], None, None
    if not torch.cuda.is_available():
        return [], None, None
    gpus = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        gpus.append(GpuInfo(torch.cuda.get_device_name(i), total, free))
    from engine.plan.bandwidth import h2d_bps, hbm_copy_bps      # the same probes `sluice bench` measures with
    pcie = h2d_bps("cuda", 256 * MiB)
    gpu_mem = hbm_copy_bps("cuda", 256 * MiB)                 # read + write
    torch.cuda.empty_cache()
    return gpus, pcie, gpu_mem


# --- performance cores -------------------------------------------------------------------------------
def parse_cpu_list(text: str) -> list[int]:
    """Kernel cpulist format: '0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def format_cpu_list(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8, 10, 11] -> '0-3,8,10-11' (the kernel's cpulist format)."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def performance_cores(sysfs_root: str | Path = "/sys") -> list[int]:
    """The fastest cores: Intel hybrid P-cores (/sys/devices/cpu_core/cpus); else the cores with the
    highest cpufreq/cpuinfo_max_freq (ARM big.LITTLE, AMD preferred cores); else every core."""
    root = Path(sysfs_root)
    try:
        return parse_cpu_list((root / "devices/cpu_core/cpus").read_text())
    except (OSError, ValueError):
        pass
    max_freq: dict[int, int] = {}
    for freq_file in (root / "devices/system/cpu").glob("cpu[0-9]*/cpufreq/cpuinfo_max_freq"):
        try:
            max_freq[int(freq_file.parent.parent.name[3:])] = int(freq_file.read_text())
        except (OSError, ValueError):
            continue
    if max_freq:
        top = max(max_freq.values())
        return sorted(cpu for cpu, freq in max_freq.items() if freq == top)
    try:
        return parse_cpu_list((root / "devices/system/cpu/online").read_text())
    except (OSError, ValueError):
        return list(range(os.cpu_count() or 1))


def pin_current_thread_to_performance_cores(sysfs_root: str | Path = "/sys") -> list[int] | None:
    """Keep the calling (decode) thread on the performance cores it may run on; returns them, or None
    where the OS offers no affinity call (macOS, Windows: best effort = leave it to the scheduler).

    Threads started from here inherit the set (torch's intra-op pool, the expert reader threads), so
    torch's pool is sized to it (`compute_threads`): more compute threads than cores made decoding ~170x
    slower here.
    """
    if not hasattr(os, "sched_setaffinity") or sys.platform != "linux":
        return None
    allowed = os.sched_getaffinity(0)
    cores = [c for c in performance_cores(sysfs_root) if c in allowed] or sorted(allowed)
    try:
        os.sched_setaffinity(0, set(cores))   # pid 0 = the calling thread on Linux
    except OSError:
        return None
    import torch
    torch.set_num_threads(min(torch.get_num_threads(), compute_threads(cores, sysfs_root)))
    return cores


def compute_threads(cores: list[int], sysfs_root: str | Path = "/sys") -> int:
    """torch's intra-op threads for the decode thread's cores: one per physical core where the cores have
    SMT siblings (the siblings are left to the GUI, the disk readers and other programs, as llama.cpp does);
    without SMT, all of them, but one where there are 8 or more.

    Every parallel op waits for its slowest thread: a compute thread that other work pushes off its core
    stalls each op for a scheduler time slice. On the 2-core dev machine (`scripts/probe_threads.py`, a
    16-layer OLMoE at hidden 1024) one core spinning elsewhere took decoding from 5.3-6.1 tok/s on 1 thread
    to 2.7-2.9 on 2, but on an idle machine 2 threads gave 10.5-10.7 against 6.5-6.6: with few cores every
    one counts; with 8 or more, one fewer costs little of a memory-bound decode and keeps a core free."""
    root, wanted = Path(sysfs_root), set(cores)
    physical = set()
    for core in cores:
        try:
            siblings = set(parse_cpu_list((root / f"devices/system/cpu/cpu{core}/topology/thread_siblings_list").read_text()))
        except (OSError, ValueError):
            siblings = {core}
        physical.add(frozenset(siblings & wanted or {core}))
    if len(physical) < len(cores):
        return len(physical)
    return len(cores) - 1 if len(cores) >= 8 else len(cores)
