"""Rotary position embedding variants, read from a transformers config object.

Every variant uses the same tables: cos, sin = cat(freqs, freqs) * attention_scaling ([T, 1, R],
R = rotary dim, broadcast over heads; `engine.model.layers.rope_cos_sin`). They differ in which
dimensions are paired:
  half        (Llama, GLM, MiniMax)   x[i] with x[i + R/2]; with R < head_dim only the first R
                                      dims rotate and the rest pass through (partial rotary):
                                      `engine.model.layers.apply_rope`
  interleaved (DeepSeek, GLM-Lite)    x[2i] with x[2i+1]; the result is laid out de-interleaved
                                      (all first members, then all second members), as in
                                      transformers. Query and key get the same permutation, so
                                      their dot products equal DeepSeek's complex-number form.
"""
from __future__ import annotations

import torch

from engine.errors import SluiceError

SUPPORTED_ROPE_TYPES = ("default", "linear", "yarn", "llama3", "proportional")


def rope_frequencies(cfg, layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [R/2] and the cos/sin scaling (YaRN's mscale ratio), exactly as transformers computes
    them: the one reader of a config's rope for every family.

    `cfg.head_dim` is the head size the rope covers (DeepSeek configs set it to qk_rope_head_dim);
    `partial_rotary_factor` (GLM-4.5, Qwen3-Next, MiniMax-M2's `rotary_dim`) shrinks it. `layer_type`: the entry
    of a config whose rope_parameters hold one rope per kind of layer (DeepSeek-V4's "main" and "compress").
    """
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    if layer_type is not None:
        params = dict(params[layer_type])
    rope_type = params.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise SluiceError(f"RoPE type '{rope_type}' is not supported yet; Sluice supports {', '.join(SUPPORTED_ROPE_TYPES)}.")
    if rope_type == "default":
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
        base = float(params.get("rope_theta", 10000.0))
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    extra = {} if layer_type is None else {"layer_type": layer_type}
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu", **extra)
    return inv_freq.float(), float(scaling)


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, R] with rotation pairs (x[2i], x[2i+1]) -> rotated, de-interleaved [T, heads, R]."""
    half = cos.shape[-1] // 2
    cos, sin = cos[..., :half], sin[..., :half]          # cat(freqs, freqs): the first half has each angle once
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.cat((even * cos - odd * sin, odd * cos + even * sin), dim=-1)
