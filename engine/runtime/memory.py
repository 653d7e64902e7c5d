"""What the process holds, as the operating system and the GPU driver see it.

The VRAM budget is meant as the user sees it in `nvidia-smi`: the driver's per-process figure
includes the CUDA context and the allocator's reserve, which torch's own counters do not. The RAM
side is split into the RAM cache and everything else (torch, CUDA host allocations, Python, the
dense weights' page cache), so the default cache can take what the machine allows minus the rest.
"""
from __future__ import annotations

import os


def process_rss_bytes() -> int:
    try:
        import psutil
        return psutil.Process().memory_info().rss
    except Exception:       # noqa: BLE001 - psutil missing or the platform refuses: report nothing
        return 0


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
