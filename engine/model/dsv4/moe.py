"""DeepSeek-V4 routing (score top-k or hash table) and the clamped SwiGLU of experts and shared expert."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.model.layers import linear

SCORING_FUNCS = {
    "sqrtsoftplus": lambda logits: F.softplus(logits).sqrt(),
    "sigmoid": torch.sigmoid,
}


def _normalised(scores: torch.Tensor, ids: torch.Tensor, routed_scaling: float) -> torch.Tensor:
    weights = scores.gather(1, ids)                                             # [T, K]
    return weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * routed_scaling


def route_topk(h: torch.Tensor, gate: torch.Tensor, correction_bias: torch.Tensor, scoring: str, top_k: int,
               routed_scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """h [T, H], gate [E, H], correction_bias [E] -> weights [T, K], expert ids [T, K]."""
    scores = SCORING_FUNCS[scoring](F.linear(h, gate))                          # [T, E]
    ids = torch.topk(scores + correction_bias, top_k, dim=-1, sorted=False).indices
    return _normalised(scores, ids, routed_scaling), ids


def route_hash(h: torch.Tensor, gate: torch.Tensor, tid2eid: torch.Tensor, token_ids: torch.Tensor, scoring: str,
               routed_scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Experts fixed per token id (tid2eid [vocab, K]); weights from the gate's scores. token_ids [T]."""
    scores = SCORING_FUNCS[scoring](F.linear(h, gate))                          # [T, E]
    ids = tid2eid[token_ids].long()                                             # [T, K]
    return _normalised(scores, ids, routed_scaling), ids


def clamped_swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, limit: float,
                   gate_bias=None, up_bias=None, down_bias=None) -> torch.Tensor:
    """down(silu(min(x W_g, limit)) * clamp(x W_u, -limit, limit)): routed experts and the shared expert."""
    g = linear(x, gate, gate_bias).clamp(max=limit)
    u = linear(x, up, up_bias).clamp(min=-limit, max=limit)
    return linear(F.silu(g) * u, down, down_bias)
