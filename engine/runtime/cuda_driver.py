"""An expert block's host-to-device copy issued straight through the CUDA driver (ctypes), for the decode thread.

Where RAM holds the model, the decode thread is the bottleneck, and torch's `copy_` (its dispatch, checks and a
lookup in torch's pinned-memory allocator) costs more host time a copy than cuMemcpyHtoDAsync itself. Both enqueue the same asynchronous copy on the same stream. Where the
driver library cannot be loaded (no NVIDIA driver, another platform), `HostToDevice.load()` gives None
and the caller keeps torch's copy.
"""
from __future__ import annotations

import ctypes
import ctypes.util



def _driver() -> ctypes.CDLL | None:
    for name in ("libcuda.so.1", ctypes.util.find_library("cuda"), "nvcuda.dll"):
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


class HostToDevice:
    def __init__(self, lib: ctypes.CDLL):
        self._copy = lib.cuMemcpyHtoDAsync_v2
        self._copy.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self._copy.restype = ctypes.c_int

    @classmethod
    def load(cls) -> HostToDevice | None:
        lib = _driver()
        try:
            return cls(lib) if lib is not None else None
        except AttributeError:
            return None

    def __call__(self, dst_ptr: int, src_ptr: int, num_bytes: int, stream: int) -> None:
        """Enqueue a copy of num_bytes from pinned host memory at src_ptr to device memory at dst_ptr on the
        stream (its raw handle, `torch.cuda.Stream.cuda_stream`)."""
        err = self._copy(dst_ptr, src_ptr, num_bytes, stream)
        if err:
            raise RuntimeError(f"cuMemcpyHtoDAsync failed (CUDA driver error {err})")
