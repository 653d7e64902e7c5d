"""int8 dense weights times float32 tokens on the CPU: a few (decode) reading the int8 codes once (numba,
compiled on first use; no C compiler), more (a prompt) through kernels/cpu_gemm.py.

  T = tokens, I = in features, O = out features
  x [T, I] float32, q int8 [O, I], scale bf16 [O] (one per row), tile: cpu_gemm.scratch()
  -> x @ (q * scale).T   [T, O] float32

The reference is kernels.cpu_linear.int8_linear_ref: the weight dequantised (q * scale, exact in float32) and
multiplied in float32. Here a row's products are those very weights' (several tokens: the row dequantised once
into a scratch row) or, one token, the codes' with the scale applied to the sum (kernels/cpu_rows.py); only the
order and rounding of the sums differ. Why: the reference turns every weight into a float32 copy each token, and
even a float32 weight is read at 4 bytes a weight; this reads 1 (a 2048 x 2048 projection, one token, the 2-core
dev machine: 0.16 ms against 1.07 for the same weight in float32).
More tokens (a prompt) go to kernels.cpu_gemm, whose GEMM is compute-bound there: the codes converted into the
caller's reused tile, not the reference's fresh dequantised copy of the weight at every call. `available()` is
False where numba is missing; callers then keep the reference.
"""
from __future__ import annotations

import numpy as np
import torch

from . import cpu_gemm
from .cpu_linear import int8_linear_ref

try:
    import numba
    from numba import njit, prange
except ImportError:                        # noqa: the reference serves
    numba = None
else:
    from .cpu_rows import FAST, bf16_scales, dots, row, row_dot

MAX_TOKENS = 8     # tokens up to which the rows are read once for all of them; more take kernels.cpu_gemm
ROWS = 16          # weight rows a parallel iteration takes


def available() -> bool:
    return numba is not None


if numba is not None:
    @njit(cache=True, nogil=True, parallel=True, fastmath=FAST)
    def _int8_rows(x, q, bits, out):
        """out[:, r] = x @ (q[r] * scale[r]) for every row r, ROWS rows a parallel iteration (bits: the bf16
        scales' int16 patterns)."""
        tokens, rows_total = x.shape[0], q.shape[0]
        for c in prange((rows_total + ROWS - 1) // ROWS):
            rows = min(ROWS, rows_total - c * ROWS)
            scales = np.empty(ROWS, np.float32)
            bf16_scales(bits, c * ROWS, rows, scales)
            w = np.empty(q.shape[1], np.float32)
            d = np.empty(tokens, np.float32)
            for i in range(rows):
                r = c * ROWS + i
                if tokens == 1:
                    out[0, r] = row_dot(x[0], q, r, scales[i])
                else:
                    row(q, r, scales[i], w)
                    dots(x, w, d)
                    for t in range(tokens):
                        out[t, r] = d[t]


def int8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, tile: torch.Tensor) -> torch.Tensor:
    """x [..., I] @ (q * scale).T -> [..., O], as kernels.cpu_linear.int8_linear_ref: float32 activations of up
    to MAX_TOKENS tokens and contiguous CPU weights through the numba rows, more tokens through
    kernels.cpu_gemm.int8_linear (tile: its scratch(), used from one thread at a time), anything else the
    reference."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.shape[0] > MAX_TOKENS:
        return cpu_gemm.int8_linear(x, q, scale, tile)
    if (x.dtype != torch.float32 or x.device.type != "cpu" or not (q.is_contiguous() and scale.is_contiguous())
            or scale.dtype != torch.bfloat16):
        return int8_linear_ref(x, q, scale)
    out = torch.empty(flat.shape[0], q.shape[0])
    _int8_rows(flat.contiguous().numpy(), q.numpy(), scale.view(torch.int16).numpy(), out.numpy())
    return out.reshape(*x.shape[:-1], q.shape[0])


def check(out_features: int, in_features: int, rtol: float = 1e-4, seed: int = 0) -> str | None:
    """None where int8_linear equals the reference at this shape on this CPU (one token, MAX_TOKENS and a
    prompt's MAX_TOKENS + 1, random codes, scales and inputs; its largest error within rtol of the reference's
    largest value), else why not."""
    if numba is None:
        return "numba is not installed"
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8, generator=g)
    scale = (torch.rand(out_features, generator=g) * 0.02 + 1e-3).to(torch.bfloat16)
    tile = cpu_gemm.scratch()
    for tokens in (1, MAX_TOKENS, MAX_TOKENS + 1):
        x = torch.randn(tokens, in_features, generator=g)
        ref, got = int8_linear_ref(x, q, scale), int8_linear(x, q, scale, tile)
        err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
        if not err <= rtol:            # NaN fails too
            return f"its {tokens}-token result differs from the reference by {err:.1e} of its largest value"
    return None
