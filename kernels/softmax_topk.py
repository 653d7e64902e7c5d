"""The softmax top-k router in plain torch (no Triton: the CPU app imports it): the engine's path
(engine.model.block.Router) and the reference of its Triton kernel (kernels/router.py).

  h [T, H], router weight [E, H] -> weights [T, K] float32 (best first), expert ids [T, K] int64
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
