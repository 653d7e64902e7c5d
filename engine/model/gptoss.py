"""The math gpt-oss adds to the standard pieces, written as transformers' `gpt_oss` computes it.

- Attention sinks: one learned logit per head joins each query's softmax as an extra column and is
  dropped afterwards, so a query may attend to "nothing" (its weights sum to less than 1):
  the one attention core's `sinks` (kernels/attention_ref.py).
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
from kernels.softmax_topk import topk_softmax_ref


class TopKSoftmaxRouter:
    """gpt-oss routing: top-k of the biased logits, softmax over the k (in the logits' dtype)."""

    best_first = True               # its ids come best first (torch.topk sorted; the kernel the same)

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, top_k: int):
        self.weight, self.bias, self.top_k = weight, bias, top_k
        self.kernel = None          # kernels.router (topk_first), attached at load

    def __call__(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # h [T, H] -> weights [T, K] (h's dtype), expert ids [T, K]
        if self.kernel is None:
            return topk_softmax_ref(h, self.weight, self.bias, self.top_k)
        weights, ids = self.kernel(h, self.weight, self.top_k, False, bias=self.bias, topk_first=True)
        return weights.to(h.dtype), ids


def clamped_swiglu_expert(x: torch.Tensor, w: dict[str, torch.Tensor], alpha: float, limit: float) -> torch.Tensor:
    """One gpt-oss expert: x [T, H], gate/up [I, H], down [H, I] and their biases -> [T, H]."""
    gate = linear(x, w["gate"], w["gate_bias"]).clamp(max=limit)                     # [T, I]
    up = linear(x, w["up"], w["up_bias"]).clamp(min=-limit, max=limit)               # [T, I]
    glu = gate * torch.sigmoid(gate * alpha)
    return linear((up + 1) * glu, w["down"], w["down_bias"])                          # [T, H]


def split_gate_up(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A fused gate_up along its last dim (gate at even, up at odd positions) -> (gate, up)."""
    return gate_up[..., 0::2], gate_up[..., 1::2]

