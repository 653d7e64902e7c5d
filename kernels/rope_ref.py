"""Rotary position embedding, rotate-half form, in plain torch (no Triton: the CPU app imports it): the models'
path (engine.model.layers.apply_rope) and the reference of its Triton kernel (kernels/rope.py).

  x [T, heads, D], cos / sin [T, 1, R] (R <= D, cat(freqs, freqs) * scaling in x's dtype):
  the first R dims rotate in halves, x[i] with x[i + R/2]; the rest pass through (partial rotary:
  GLM-4.5, MiniMax-M2). Each product is rounded to x's dtype, then the two are added: torch's order.
"""
from __future__ import annotations

import torch


def apply_rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rotary = cos.shape[-1]
    if rotary < x.shape[-1]:
        return torch.cat((apply_rope_ref(x[..., :rotary], cos, sin), x[..., rotary:]), dim=-1)
    half = rotary // 2
    rotated = torch.cat((x[..., half:] * -1, x[..., :half]), dim=-1)       # * -1 is neg's value without its module
    return x * cos + rotated * sin


def rope_pair_ref(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """A step's queries [T, Hq, D] and keys [T, Hkv, D], each rotated: (q', k')."""
    return apply_rope_ref(q, cos, sin), apply_rope_ref(k, cos, sin)
