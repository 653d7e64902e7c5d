"""x @ W.T for one expert projection stored in a block format, fast on the CPU.

  T = tokens, I = in features, O = out features
  x [T, I] (any float dtype), parts {"w", "scale", ...} of formats.part_specs(fmt, O, I) -> [T, O] in x's dtype

int8 with bf16 activations, a few tokens (decode): torch's own CPU int8 matmul (`_weight_int8pack_mm`:
int8 weights, one scale per output row in the activation dtype, ~70 us for a 768 x 2048 projection
on two cores). The format stores its scales as bf16 for exactly this, so the CPU multiplies by the same
dequantized weights W = w * scale the GPU kernels use. More tokens (prefill): the int8 codes as bf16
(exact: |w| <= 127 fits bf16's 8 bits) through a bf16 GEMM, the row scale applied to its output, which
is faster past ~12 tokens. float32 activations (the CPU engine's compute dtype, and the token-exact
tests) take the plain dequantized float32 weights, so those results stay exact.
"""
from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F

from .formats import dequantize_parts

# _weight_int8pack_mm's CPU kernel reduces over K in vectors of 16: other widths give NaN or crash
# (measured on AVX-512, torch 2.13).
INT8PACK_K_MULTIPLE = 16
# Tokens up to which _weight_int8pack_mm beats converting the codes to bf16 for a GEMM (2 cores,
# AVX-512 + AMX, 768 x 2048 and 2048 x 768: 0.7 vs 1.8 ms at 8 tokens, even at 12-16).
INT8PACK_MAX_TOKENS = 12
SLAB_BYTES = 32 << 20  # int8_linear_ref's dequantised scratch at most (a 50k-vocab head would be 200 MB)
# On the CPU one buffer a call, dequantised into slab by slab: a fresh float32 copy of each 32 MB slab every token
# (two, with the cast) is mapped and faulted in anew each time (a 50k x 2048 head, 2 cores: ~900 ms against 46 for
# its float32 weight; ~50 with this buffer, below glibc's 32 MB mmap threshold so the heap keeps it).
CPU_SLAB_BYTES = 16 << 20


def packed_linear(x: torch.Tensor, parts: Mapping[str, torch.Tensor], fmt: str) -> torch.Tensor:
    """x [..., I] @ W.T -> [..., O] in x's dtype, W the dequantized weight of `parts` in `fmt`."""
    w = parts["w"]
    if fmt == "int8" and x.dtype == torch.bfloat16 and x.device.type == "cpu":
        flat = x.reshape(-1, x.shape[-1])                                                # [T, I]
        if _int8pack_applies(flat, w):
            out = torch.ops.aten._weight_int8pack_mm(flat.contiguous(), w.contiguous(), parts["scale"].contiguous())
        else:
            out = F.linear(flat, w.to(torch.bfloat16)) * parts["scale"]                   # [T, O]
        return out.reshape(*x.shape[:-1], w.shape[0])
    if fmt == "bf16":
        return F.linear(x, w.to(x.dtype))
    if fmt == "int8":       # a GPU, or float32: the reference's own weights, a slab of rows at a time
        return int8_linear_ref(x, w, parts["scale"])
    return F.linear(x, dequantize_parts(parts, fmt).to(x.dtype))


def _int8pack_applies(flat: torch.Tensor, w: torch.Tensor) -> bool:
    return (flat.device.type == "cpu" and w.device.type == "cpu" and flat.shape[0] <= INT8PACK_MAX_TOKENS
            and flat.shape[1] % INT8PACK_K_MULTIPLE == 0)


def dequantized(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The reference weight: each element q * scale rounded once to `dtype` (engine.format.quant)."""
    return dequantize_parts({"w": q, "scale": scale}, "int8").to(dtype)


def slab_rows(in_features: int, slab_bytes: int = SLAB_BYTES) -> int:
    """Rows of an [out, in_features] weight whose float32 copy fits slab_bytes, a multiple of 16 (at least 16): a GEMM
    of a few output rows may take another kernel than the whole product's (MKL on AVX-512 does below 8), whose sums
    would differ in the last bit."""
    return max(16, slab_bytes // (in_features * 4) // 16 * 16)


def int8_linear_ref(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x @ W.T with W the int8 weight dequantised as the reference does it, a slab of rows at a time."""
    if q.device.type == "cpu":
        return _int8_linear_cpu(x, q, scale)
    rows = slab_rows(q.shape[1])                           # the float32 intermediate is the largest
    if q.shape[0] <= rows:
        return F.linear(x, dequantized(q, scale, x.dtype))
    return torch.cat([F.linear(x, dequantized(q[r:r + rows], scale[r:r + rows], x.dtype))
                      for r in range(0, q.shape[0], rows)], dim=-1)


def _int8_linear_cpu(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """int8_linear_ref on the CPU: each slab dequantised into one reused float32 buffer, in one pass (q * scale
    is exact in float32: 8 bits of code times bf16's 8 of mantissa), so the weights are the reference's, bit for bit."""
    rows = min(q.shape[0], slab_rows(q.shape[1], CPU_SLAB_BYTES))
    scratch = torch.empty(rows, q.shape[1])                                              # [rows, K] float32
    row_scale = scale.float()[:, None]                                                   # [N, 1]
    outs = []
    for r in range(0, q.shape[0], rows):
        w = torch.mul(q[r:r + rows], row_scale[r:r + rows], out=scratch[:min(rows, q.shape[0] - r)])
        outs.append(F.linear(x, w.to(x.dtype)))                                          # [..., rows]
    return torch.cat(outs, dim=-1)
