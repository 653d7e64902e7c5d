"""RMS norm in one Triton launch a row (its reference: kernels/norms.rms_norm_ref, the models' torch path).

  rows of x [R, N] -> out [R, N] in the dtype torch's `weight * x` gives
The row's mean square in float32 (the sum times 1/N, as torch's mean), rsqrt, the product rounded to x's
dtype, then times the weight in float32 and rounded once more (what torch's bf16 product computes). Why a
kernel: the torch path's `rsqrt` and `mean` each load a CUDA module that holds host memory for the
process's life (26.3 + 11.5 MiB).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .norms import MAX_N, rms_norm_ref  # noqa: F401  (the kernel's reference, beside it)

KERNEL_VERSION = 1     # bump on any change to the kernel below: cached self-check verdicts are keyed on it


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, N, inv_n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) * inv_n
    y = (x * tl.math.rsqrt(mean_square + eps)).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * N + cols, (w * y).to(out_ptr.dtype.element_ty), mask=ok)


def rms_norm_kernel(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    rows = x.reshape(-1, n).contiguous()
    out = torch.empty(rows.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    block = triton.next_power_of_2(n)
    _rms_norm_kernel[(rows.shape[0],)](rows, weight.contiguous(), out, n, 1.0 / n, eps, BLOCK=block,
                                       num_warps=4 if block <= 2048 else 8)
    return out.reshape(x.shape)
