"""RMS norm in one Triton launch a row (its references: kernels/norms.rms_norm_ref, the models' torch path, and
norms.grouped_norm_ref).

  rms_norm_kernel:     rows of x [R, N] -> out [R, N] in the dtype torch's `weight * x` gives
The row's mean square in float32 (the sum times 1/N, as torch's mean), rsqrt, the product rounded to x's
dtype, then times the weight in float32 and rounded once more (what torch's bf16 product computes). Why a
kernel: the torch path's `rsqrt` and `mean` each load a CUDA module that holds host memory for the
process's life (26.3 + 11.5 MiB).
  grouped_norm_kernel: x [T, n * G] normed over each G -> out in x's dtype, times scale [n * G] (float32) before
the one rounding: a row a group, the scale's row cycling over the n groups (one launch, where the torch path
runs seven kernels).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .norms import MAX_N, grouped_norm_ref, rms_norm_ref  # noqa: F401  (the kernels' references, beside them)

KERNEL_VERSION = 2     # bump on any change to the kernel below: cached self-check verdicts are keyed on it


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, N, W_ROWS, inv_n, eps, ROUND_FIRST: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) * inv_n
    y = x * tl.math.rsqrt(mean_square + eps)
    if ROUND_FIRST:
        y = y.to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + (row % W_ROWS) * N + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * N + cols, (w * y).to(out_ptr.dtype.element_ty), mask=ok)


def _launch(rows: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float, round_first: bool) -> None:
    n = rows.shape[-1]
    block = triton.next_power_of_2(n)
    _rms_norm_kernel[(rows.shape[0],)](rows, weight.contiguous(), out, n, weight.numel() // n, 1.0 / n, eps,
                                       ROUND_FIRST=round_first, BLOCK=block, num_warps=4 if block <= 2048 else 8)


def rms_norm_kernel(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty(rows.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    _launch(rows, weight, out, eps, round_first=True)
    return out.reshape(x.shape)


def grouped_norm_kernel(x: torch.Tensor, scale: torch.Tensor, group: int, eps: float) -> torch.Tensor:
    rows = x.reshape(-1, group).contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    _launch(rows, scale, out, eps, round_first=False)
    return out.reshape(x.shape)
