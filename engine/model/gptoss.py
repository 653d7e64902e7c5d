"""The math gpt-oss adds to the standard pieces, written as transformers' `gpt_oss` computes it.

- Attention sinks: one learned logit per head joins each query's softmax as an extra column and is
  dropped afterwards, so a query may attend to "nothing" (its weights sum to less than 1).
- Router: top-k on the raw logits (+ bias), then a softmax over those k values only.
- Experts: biased gate/up/down and a clamped SwiGLU,
      glu = min(g, limit) * sigmoid(alpha * min(g, limit)),  out = (clamp(u, -limit, limit) + 1) * glu.
  (The checkpoint interleaves gate and up rows in one fused gate_up_proj; repack splits them.)
Alternating sliding-window / full attention, q/k/v/o biases and YaRN rope are the standard pieces'
(a window per layer, biases when present, rope from transformers' own init function).
"""
from __future__ import annotations

import torch

from engine.model.layers import linear

# Query rows per chunk of the sink attention: bounds the [Hq, rows, S] scores a long prompt materialises.
SINK_ATTENTION_ROWS = 256


def sink_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor,
                   window: int | None, sinks: torch.Tensor) -> torch.Tensor:
    """Causal (optionally sliding-window) grouped-query attention with a sink logit per head.

    q [T, Hq, D]; k, v [S, Hkv, D] hold positions 0..S-1 (a static buffer may hold more: keys past
    each query's position are masked); q_positions [T]; sinks [Hq]. Returns [T, Hq * D].
    """
    num_tokens, num_q_heads, head_dim = q.shape
    group = num_q_heads // k.shape[1]
    k = k.repeat_interleave(group, dim=1)                               # [S, Hq, D]
    v = v.repeat_interleave(group, dim=1)
    key_positions = torch.arange(k.shape[0], device=q.device)
    sink_column = sinks.to(q.dtype)[:, None, None]                       # [Hq, 1, 1]
    outputs = []
    for r0 in range(0, num_tokens, SINK_ATTENTION_ROWS):
        rows = slice(r0, r0 + SINK_ATTENTION_ROWS)
        scores = torch.einsum("thd,shd->hts", q[rows], k) * head_dim ** -0.5        # [Hq, t, S]
        visible = key_positions[None, :] <= q_positions[rows, None]                 # [t, S]
        if window:
            visible &= key_positions[None, :] > q_positions[rows, None] - window
        scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
        logits = torch.cat([scores, sink_column.expand(-1, scores.shape[1], 1)], dim=-1)   # [Hq, t, S+1]
        logits = logits - logits.amax(dim=-1, keepdim=True)
        probs = torch.softmax(logits, dim=-1, dtype=logits.dtype)[..., :-1]          # the sink column dropped
        outputs.append(torch.einsum("hts,shd->thd", probs.to(v.dtype), v))
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
    return out.reshape(num_tokens, num_q_heads * head_dim)


class TopKSoftmaxRouter:
    """gpt-oss routing: top-k of the biased logits, softmax over the k (in the logits' dtype)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, top_k: int):
        self.weight, self.bias, self.top_k = weight, bias, top_k

    def __call__(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # h [T, H] -> weights [T, K] (h's dtype), expert ids [T, K]
        logits = linear(h, self.weight, self.bias)                                    # [T, E]
        top, ids = torch.topk(logits, self.top_k, dim=-1)
        return torch.softmax(top, dim=-1, dtype=top.dtype), ids


def clamped_swiglu_expert(x: torch.Tensor, w: dict[str, torch.Tensor], alpha: float, limit: float) -> torch.Tensor:
    """One gpt-oss expert: x [T, H], gate/up [I, H], down [H, I] and their biases -> [T, H]."""
    gate = linear(x, w["gate"], w["gate_bias"]).clamp(max=limit)                     # [T, I]
    up = linear(x, w["up"], w["up_bias"]).clamp(min=-limit, max=limit)               # [T, I]
    glu = gate * torch.sigmoid(gate * alpha)
    return linear((up + 1) * glu, w["down"], w["down_bias"])                          # [T, H]


def split_gate_up(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A fused gate_up along its last dim (gate at even, up at odd positions) -> (gate, up)."""
    return gate_up[..., 0::2], gate_up[..., 1::2]

