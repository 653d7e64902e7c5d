"""Group-limited MoE routers (DeepSeek-V2/V3, Kimi-K2, GLM-4.x, MiniMax-M2, dots1, ERNIE-4.5; reused by DeepSeek-V4).

One parameterised router covers them, read from the config:
  scores    softmax (V2, ERNIE) or sigmoid (V3, GLM, MiniMax, dots1) of the float32 router logits
  choice    scores + e_score_correction_bias (selection only: the weights use the unbiased scores)
  groups    experts split into n_group groups; a group's score is its max (V2) or the sum of its
            top-2 choice scores (V3, GLM); only the topk_group best groups stay selectable
  weights   the chosen scores, renormalised to sum 1 if norm_topk_prob (V2 never; ERNIE divides by the sum
            clamped to at least moe_norm_min), times routed_scaling_factor
`route` is a pure function of its input, so the runtime may call layer L+1's router on layer L's
hidden state to guess the next experts (speculative prefetch).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.errors import SluiceError


@dataclass(frozen=True)
class GroupedRouter:
    top_k: int
    scoring: str = "sigmoid"              # "softmax" | "sigmoid"
    num_groups: int = 1
    keep_groups: int = 1
    group_score: str = "top2_sum"         # "max" (V2) | "top2_sum" (V3, GLM)
    renormalize: bool = True
    renorm_eps: float = 1e-20             # V3/GLM add 1e-20 to the sum; MiniMax-M2 and ERNIE add nothing
    renorm_min: float = 0.0               # ERNIE clamps the sum to at least this (moe_norm_min)
    scaling: float = 1.0

    @classmethod
    def from_config(cls, cfg) -> "GroupedRouter":
        family, top_k = cfg.model_type, cfg.num_experts_per_tok
        if family == "deepseek_v2":
            method = getattr(cfg, "topk_method", "greedy") or "greedy"
            if method not in ("greedy", "group_limited_greedy"):
                raise SluiceError(f"This DeepSeek-V2 model routes with topk_method '{method}', which Sluice does not "
                                  "support yet (it runs 'greedy' and 'group_limited_greedy').")
            grouped = method == "group_limited_greedy"
            return cls(top_k, "softmax", cfg.n_group if grouped else 1, cfg.topk_group if grouped else 1, "max",
                       renormalize=False, scaling=float(cfg.routed_scaling_factor))
        if family == "minimax_m2":
            return cls(top_k, "sigmoid", renormalize=True, renorm_eps=0.0)
        if family == "ernie4_5_moe":
            return cls(top_k, "softmax", renormalize=True, renorm_eps=0.0, renorm_min=float(cfg.moe_norm_min))
        # deepseek_v3 (Kimi-K2), glm4_moe, glm4_moe_lite, dots1: identical code in transformers
        return cls(top_k, "sigmoid", getattr(cfg, "n_group", None) or 1, getattr(cfg, "topk_group", None) or 1,
                   "top2_sum", renormalize=bool(cfg.norm_topk_prob),
                   scaling=float(getattr(cfg, "routed_scaling_factor", 1.0) or 1.0))

    def check(self, num_experts: int) -> None:
        if num_experts % self.num_groups or self.keep_groups > self.num_groups:
            raise SluiceError(f"The router config is inconsistent ({num_experts} experts in {self.num_groups} groups, "
                              f"keeping {self.keep_groups}); the config.json is damaged.")

    def route(self, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """h [T, D], router weight [E, D], correction bias [E] or None -> weights [T, K] float32, expert ids [T, K]."""
        # T = tokens, E = experts, G = groups, K = experts per token
        logits = F.linear(h.float(), weight.float())                                       # [T, E]
        scores = logits.softmax(dim=-1) if self.scoring == "softmax" else logits.sigmoid()
        choice = scores if bias is None else scores + bias.float()
        if self.num_groups > 1:
            grouped = choice.view(h.shape[0], self.num_groups, -1)                          # [T, G, E/G]
            if self.group_score == "max":
                group_scores = grouped.max(dim=-1).values
            else:
                group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)                  # [T, G]
            kept = torch.topk(group_scores, self.keep_groups, dim=-1, sorted=False).indices
            group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
            expert_mask = group_mask[:, :, None].expand_as(grouped).reshape(h.shape[0], -1)  # [T, E]
            # V2 masks with 0 (softmax scores are positive), V3 with -inf: same choice unless ties at 0
            choice = choice.masked_fill(~expert_mask, 0.0 if self.scoring == "softmax" else float("-inf"))
        expert_ids = torch.topk(choice, self.top_k, dim=-1, sorted=False).indices          # [T, K]
        weights = scores.gather(1, expert_ids)
        if self.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True).clamp(min=self.renorm_min) + self.renorm_eps)
        return weights * self.scaling, expert_ids
