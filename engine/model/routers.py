"""Group-limited MoE routers (DeepSeek-V2/V3, Kimi-K2, GLM-4.x, MiniMax-M2, dots1, ERNIE-4.5; reused by Nemotron-H).

One parameterised router covers them: kernels.softmax_topk.GroupedRouting (its `route` is the torch path and the
Triton kernel's reference), its parameters read from the config here:
  scoring       softmax (V2, ERNIE) or sigmoid (V3, GLM, MiniMax, dots1)
  groups        n_group and topk_group; a group's score its max (V2) or its top-2 sum (V3, GLM)
  renormalize   norm_topk_prob (V2 never; ERNIE clamps the sum to at least moe_norm_min)
  scaling       routed_scaling_factor
`route` is a pure function of its input, so the runtime may call layer L+1's router on layer L's
hidden state to guess the next experts (speculative prefetch).
"""
from __future__ import annotations

from engine.errors import SluiceError
from kernels.softmax_topk import GroupedRouting


class GroupedRouter(GroupedRouting):
    """The routing's parameters read from a model's config; `route` (GroupedRouting's) is the torch path."""

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
