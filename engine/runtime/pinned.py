"""Page-locked host buffers of exactly the size asked for.

torch's pinned allocator rounds each request up to a power of two and keeps freed blocks cached,
so a 75 MB chunk would pin 128 MB: past the RAM budget. Here each chunk is an anonymous mmap
(page-aligned, as O_DIRECT needs) registered with cudaHostRegister, so the pinned total is exactly
what the RAM cache has grown to. Without CUDA the buffer is plain (unpinned) memory.
"""
from __future__ import annotations

import mmap
import weakref

import torch

_REGISTERED: dict[int, int] = {}     # data_ptr -> bytes, for accounting and tests


def pinned_bytes() -> int:
    """Bytes currently page-locked through this module."""
    return sum(_REGISTERED.values())


def pinned_buffer(num_bytes: int) -> torch.Tensor:
    """uint8 tensor of num_bytes over fresh page-aligned memory, page-locked when CUDA is available, for as
    long as this tensor object lives: views of it keep the memory but not the page-locking (copies from
    pageable memory run at a tenth of the speed and block the host), so keep the tensor itself."""
    region = mmap.mmap(-1, num_bytes)
    tensor = torch.frombuffer(region, dtype=torch.uint8)
    if torch.cuda.is_available() and num_bytes:
        ptr = tensor.data_ptr()
        err = torch.cuda.cudart().cudaHostRegister(ptr, num_bytes, 0)
        if int(err) != 0:
            raise MemoryError(f"cudaHostRegister of {num_bytes} bytes failed (error {int(err)})")
        _REGISTERED[ptr] = num_bytes
        weakref.finalize(tensor, _unregister, ptr, region)
    else:
        weakref.finalize(tensor, lambda r: None, region)     # keep the mapping alive with the tensor
    return tensor


def _unregister(ptr: int, region: mmap.mmap) -> None:
    torch.cuda.cudart().cudaHostUnregister(ptr)
    _REGISTERED.pop(ptr, None)
