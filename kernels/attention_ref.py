"""Attention in plain torch (no Triton: the CPU app imports it): the models' path (engine.model.layers.attention)
and the reference of the one-token decode kernel (kernels/decode_attention.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor,
                  window: int | None) -> torch.Tensor:
    """Causal (optionally sliding-window) attention with grouped KV heads.

    q [T, Hq, D]; k, v [S, Hkv, D] hold positions 0..S-1; q_positions [T]. Returns [T, Hq * D].
    """
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    if q.is_cuda:
        # Fused attention: never materialises the [Hq, T, S] scores. Prompts (T > 1) expand grouped KV
        # heads first (SDPA with enable_gqa may take the math kernel); one decode token (T = 1, the
        # CUDA-graphed step) keeps enable_gqa: its scores are one row.
        group = num_q_heads // k.shape[1]
        if q.shape[0] > 1 and group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        # 4-D [1, heads, tokens, D]: with 3-D inputs SDPA silently takes the math kernel, which
        # materialises the scores (measured: +0.37 GB at 2048 tokens on OLMoE, +1 GB on Qwen3-30B).
        qt, kt, vt = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        gqa = k.shape[1] != num_q_heads
        if q.shape[0] == k.shape[0] and not window:
            # A prompt from position 0: plain causal (flash kernel, no mask tensor at all).
            out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=gqa)
        else:
            key_positions = torch.arange(k.shape[0], device=q.device)
            visible = key_positions[None, :] <= q_positions[:, None]        # [T, S]
            if window:
                visible &= key_positions[None, :] > q_positions[:, None] - window
            out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=visible, enable_gqa=gqa)   # [Hq, T, D]
        return out[0].transpose(0, 1).reshape(q.shape[0], num_q_heads * head_dim)
    group = num_q_heads // k.shape[1]
    k = k.repeat_interleave(group, dim=1)                           # [S, Hq, D]
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) * head_dim ** -0.5  # [Hq, T, S]
    key_positions = torch.arange(k.shape[0], device=q.device)
    visible = key_positions[None, :] <= q_positions[:, None]        # [T, S]
    if window:
        visible &= key_positions[None, :] > q_positions[:, None] - window
    scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.einsum("hts,shd->thd", probs, v).reshape(q.shape[0], num_q_heads * head_dim)
