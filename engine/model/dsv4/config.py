"""The DeepSeek-V4 fields the pieces need, read from the transformers config, with the refusals."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from engine.errors import SluiceError
from engine.model.dsv4.attention import SLIDING
from engine.model.dsv4.moe import SCORING_FUNCS
from engine.model.rotary import rope_frequencies


@dataclass(frozen=True)
class Dsv4Config:
    hidden_size: int
    num_heads: int
    head_dim: int
    eps: float
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    layer_types: tuple[str, ...]
    mlp_layer_types: tuple[str, ...]
    sliding_window: int
    compress_rates: dict
    scoring: str
    top_k: int
    routed_scaling: float
    swiglu_limit: float
    o_groups: int
    index_topk: int
    index_head_dim: int
    main_rope: tuple[torch.Tensor, float]        # inv_freq [R/2], attention scaling
    compress_rope: tuple[torch.Tensor, float]

    def to(self, device: torch.device) -> "Dsv4Config":
        """The rope tables on the device: a decode step captured in a CUDA graph copies nothing from the host."""
        return dataclasses.replace(self, main_rope=(self.main_rope[0].to(device), self.main_rope[1]),
                                   compress_rope=(self.compress_rope[0].to(device), self.compress_rope[1]))


def read_dsv4_config(cfg) -> Dsv4Config:
    """cfg: a DeepseekV4Config (its own validation already refused bad layer_types / mlp_layer_types)."""
    if cfg.scoring_func not in SCORING_FUNCS:
        raise SluiceError(f"This DeepSeek-V4 model scores experts with '{cfg.scoring_func}', which the reference "
                          f"implementation cannot run either; Sluice runs {' and '.join(SCORING_FUNCS)}.")
    if cfg.hidden_act != "silu":
        raise SluiceError(f"This DeepSeek-V4 model's experts use '{cfg.hidden_act}'; Sluice runs the shipped 'silu' only.")
    main_rope, compress_rope = (rope_frequencies(cfg, label) for label in ("main", "compress"))
    for kind in set(cfg.layer_types) - {SLIDING}:
        if kind not in cfg.compress_rates:
            raise SluiceError(f"This DeepSeek-V4 config has {kind} layers but no compress rate for them; "
                              "the reference cannot build it either: download the model again.")
    return Dsv4Config(
        hidden_size=cfg.hidden_size, num_heads=cfg.num_attention_heads, head_dim=cfg.head_dim, eps=cfg.rms_norm_eps,
        hc_mult=cfg.hc_mult, hc_sinkhorn_iters=cfg.hc_sinkhorn_iters, hc_eps=cfg.hc_eps,
        layer_types=tuple(cfg.layer_types), mlp_layer_types=tuple(cfg.mlp_layer_types),
        sliding_window=cfg.sliding_window, compress_rates=dict(cfg.compress_rates), scoring=cfg.scoring_func,
        top_k=cfg.num_experts_per_tok, routed_scaling=float(cfg.routed_scaling_factor),
        swiglu_limit=float(cfg.swiglu_limit), o_groups=cfg.o_groups, index_topk=cfg.index_topk,
        index_head_dim=cfg.index_head_dim,
        main_rope=main_rope, compress_rope=compress_rope)
