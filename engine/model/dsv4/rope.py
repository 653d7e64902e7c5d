"""Interleaved RoPE on the trailing rope channels of each head (DeepSeek-V4 layout: [nope | rope]).

cos / sin hold one entry per rotated pair (R/2 of them); pairs are channels (2i, 2i+1) of the slice.
"""
from __future__ import annotations

import torch


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype):
    # positions [T] -> cos, sin [T, R/2]
    freqs = positions[:, None].float() * inv_freq.to(positions.device, torch.float32)
    return (freqs.cos() * scaling).to(dtype), (freqs.sin() * scaling).to(dtype)


def apply_tail_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, ..., D] (any head dims between); cos, sin [T, R/2]. Rotates x[..., -R:] in float32."""
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (-1,)
    cos = cos.repeat_interleave(2, dim=-1).reshape(shape)
    sin = sin.repeat_interleave(2, dim=-1).reshape(shape)
    rope_dim = cos.shape[-1]
    nope, rope = x[..., :-rope_dim], x[..., -rope_dim:]
    rotated_half = torch.stack((rope[..., 1::2] * -1, rope[..., 0::2]), dim=-1).flatten(-2)
    rotated = (rope.float() * cos + rotated_half.float() * sin).to(x.dtype)
    return torch.cat([nope, rotated], dim=-1)
