"""The routers in plain torch (no Triton: the CPU app imports them): the engine's paths and the references
of their Triton kernels (kernels/router.py).

  router_ref              softmax over the experts, then top k (engine.model.block.Router)
  topk_softmax_ref        top k of the biased logits, then a softmax over those k (gpt-oss)
  GroupedRouting.route    group-limited sigmoid or softmax routing (engine.model.routers.GroupedRouter)

  h [T, H], router weight [E, H] (bias [E]) -> weights [T, K], expert ids [T, K] int64
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def router_ref(h: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights float32 best first."""
    probs = torch.softmax(F.linear(h, weight), dim=-1, dtype=torch.float32)              # [T, E]
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def topk_softmax_ref(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss's routing, as transformers computes it: weights in the logits' dtype, best first."""
    top, ids = torch.topk(F.linear(h, weight, bias), top_k, dim=-1)
    return torch.softmax(top, dim=-1, dtype=top.dtype), ids


@dataclass(frozen=True)
class GroupedRouting:
    """Group-limited routing (DeepSeek-V2/V3, Kimi-K2, GLM-4.x, MiniMax-M2, dots1, ERNIE-4.5, Nemotron-H):
      scores    softmax or sigmoid of the float32 logits
      choice    scores + the correction bias (the choice only: the weights use the unbiased scores)
      groups    experts split into num_groups groups; a group's score is its max (V2) or the sum of its top-2
                choice scores (V3, GLM); only the keep_groups best groups stay selectable
      weights   the chosen scores, divided by their sum (clamped to at least renorm_min, plus renorm_eps) when
                renormalize, times scaling
    The engine's GroupedRouter reads these from a config; route is its torch path and the kernel's reference."""
    top_k: int
    scoring: str = "sigmoid"              # "softmax" | "sigmoid"
    num_groups: int = 1
    keep_groups: int = 1
    group_score: str = "top2_sum"         # "max" (V2) | "top2_sum" (V3, GLM)
    renormalize: bool = True
    renorm_eps: float = 1e-20             # V3/GLM add 1e-20 to the sum; MiniMax-M2 and ERNIE add nothing
    renorm_min: float = 0.0               # ERNIE clamps the sum to at least this (moe_norm_min)
    scaling: float = 1.0

    def route(self, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """h [T, H], router weight [E, H], correction bias [E] or None -> weights [T, K] float32, expert ids [T, K]
        (in no particular order: topk unsorted)."""
        scores = self.scores(h, weight)                                                    # [T, E]
        expert_ids = torch.topk(self.choice(scores, bias), self.top_k, dim=-1, sorted=False).indices   # [T, K]
        return self.weights(scores, expert_ids), expert_ids

    def scores(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        logits = F.linear(h.float(), weight.float())                                       # [T, E]
        return logits.softmax(dim=-1) if self.scoring == "softmax" else logits.sigmoid()

    def choice(self, scores: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """What the top k is taken of [T, E]: the biased scores, those outside the kept groups masked."""
        # T = tokens, E = experts, G = groups
        choice = scores if bias is None else scores + bias.float()
        if self.num_groups == 1:
            return choice
        grouped = choice.view(scores.shape[0], self.num_groups, -1)                         # [T, G, E/G]
        if self.group_score == "max":
            group_scores = grouped.max(dim=-1).values
        else:
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)                      # [T, G]
        kept = torch.topk(group_scores, self.keep_groups, dim=-1, sorted=False).indices
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
        expert_mask = group_mask[:, :, None].expand_as(grouped).reshape(scores.shape[0], -1)  # [T, E]
        # V2 masks with 0 (softmax scores are positive), V3 with -inf: same choice unless ties at 0
        return choice.masked_fill(~expert_mask, 0.0 if self.scoring == "softmax" else float("-inf"))

    def weights(self, scores: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        """The routing weights [T, K] float32 of the experts [T, K]."""
        weights = scores.gather(1, expert_ids)
        if self.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True).clamp(min=self.renorm_min) + self.renorm_eps)
        return weights * self.scaling
