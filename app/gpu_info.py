"""GPU load and memory from NVML (nvidia-ml-py) when present; None everywhere else. Qt-free."""
from __future__ import annotations


class GpuInfo:
    def __init__(self):
        self._handle = None
        self.name: str | None = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(self._handle)
            self.name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:     # no library, no driver, no GPU: the panels say "CPU"
            self._handle = None

    @property
    def available(self) -> bool:
        return self._handle is not None

    def sample(self) -> dict | None:
        """{'util_percent', 'mem_used_bytes', 'mem_total_bytes'} or None."""
        if self._handle is None:
            return None
        try:
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            mem = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        except Exception:
            return None
        return {"util_percent": util.gpu, "mem_used_bytes": mem.used, "mem_total_bytes": mem.total}
