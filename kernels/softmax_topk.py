"""The routers in plain torch (no Triton: the CPU app imports them): the engine's paths and the references
of their Triton kernel (kernels/router.py).

  router_ref          softmax over the experts, then top k (engine.model.block.Router)
  topk_softmax_ref    top k of the biased logits, then a softmax over those k (gpt-oss)

  h [T, H], router weight [E, H] (bias [E]) -> weights [T, K] (best first), expert ids [T, K] int64
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def router_ref(h: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool
               ) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(F.linear(h, weight), dim=-1, dtype=torch.float32)              # [T, E]
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def topk_softmax_ref(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss's routing, as transformers computes it: weights in the logits' dtype."""
    top, ids = torch.topk(F.linear(h, weight, bias), top_k, dim=-1)
    return torch.softmax(top, dim=-1, dtype=top.dtype), ids
