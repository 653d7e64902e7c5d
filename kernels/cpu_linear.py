"""x @ W.T on the CPU straight from an expert block's quantised parts (no dequantised copy of W).

int8 (row-scaled, bf16 scales) with bf16 activations runs torch's packed int8 kernel; bf16 weights
run F.linear; every other case dequantises first (exact, slow): the specification is
formats._dequantize.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.formats import _dequantize


def packed_linear(x: torch.Tensor, parts: dict[str, torch.Tensor], fmt: str) -> torch.Tensor:
    """x [T, in] (any float dtype) -> [T, out] in x's dtype."""
    if fmt == "int8" and x.dtype == torch.bfloat16:
        return torch.ops.aten._weight_int8pack_mm(x.contiguous(), parts["w"], parts["scale"])
    if fmt == "bf16" and x.dtype == torch.bfloat16:
        return F.linear(x, parts["w"])
    return F.linear(x, _dequantize(parts, fmt).to(x.dtype))
