"""x @ W.T for one expert projection stored in a block format, fast on the CPU.

  T = tokens, I = in features, O = out features
  x [T, I] (any float dtype), parts {"w", "scale", ...} of formats.part_specs(fmt, O, I) -> [T, O] in x's dtype

int8 with bf16 activations goes through torch's own CPU int8 matmul (`_weight_int8pack_mm`: int8
weights, one scale per output row in the activation dtype, about 19 GB/s of int8 on two cores): the
format stores its scales as bf16 for exactly this, so the CPU multiplies by the same dequantized
weights W = w * scale the GPU kernels use. float32 activations (the CPU engine's compute dtype, and
the token-exact tests) take the plain dequantized float32 weights, so those results stay exact.
"""
from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F

from .formats import dequantize_parts

# _weight_int8pack_mm's CPU kernel reduces over K in vectors of 16: other widths give NaN or crash
# (measured on AVX-512, torch 2.13).
INT8PACK_K_MULTIPLE = 16


def packed_linear(x: torch.Tensor, parts: Mapping[str, torch.Tensor], fmt: str) -> torch.Tensor:
    """x [..., I] @ W.T -> [..., O] in x's dtype, W the dequantized weight of `parts` in `fmt`."""
    w = parts["w"]
    if fmt == "int8" and _int8pack_applies(x, w):
        flat = x.reshape(-1, x.shape[-1]).contiguous()                                    # [T, I]
        out = torch.ops.aten._weight_int8pack_mm(flat, w.contiguous(), parts["scale"].contiguous())   # [T, O]
        return out.reshape(*x.shape[:-1], w.shape[0])
    if fmt == "bf16":
        return F.linear(x, w.to(x.dtype))
    if fmt == "int8" and x.dtype == torch.bfloat16:       # a width the int8 kernel cannot take: float32 math
        return F.linear(x.float(), dequantize_parts(parts, fmt)).to(x.dtype)
    return F.linear(x, dequantize_parts(parts, fmt).to(x.dtype))


def _int8pack_applies(x: torch.Tensor, w: torch.Tensor) -> bool:
    return (x.dtype == torch.bfloat16 and x.device.type == "cpu" and w.device.type == "cpu"
            and x.shape[-1] % INT8PACK_K_MULTIPLE == 0)
