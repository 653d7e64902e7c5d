"""Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi-K2, GLM-4.7-Flash; reused by DeepSeek-V4).

Per token the state keeps only the compressed latent (kv_lora_rank values, after its RMSNorm) and
the one shared rope key (qk_rope_head_dim values, already rotated): DeepSeek-V3 stores 576 values
per token and layer instead of 128 heads x (192 + 128) for full K/V. Keys and values of all heads
are expanded from the latents at each step (kv_b_proj), as transformers does.

Weights are the layer's `self_attn.*` tensors under their checkpoint names without the prefix:
  q_proj.weight                                   (q_lora_rank absent: V2-Lite)
  q_a_proj.weight [+bias], q_a_layernorm.weight, q_b_proj.weight     (q_lora_rank set: V2, V3)
  kv_a_proj_with_mqa.weight [+bias], kv_a_layernorm.weight, kv_b_proj.weight, o_proj.weight [+bias]
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from engine.model.block import Rope, Step
from engine.model.layers import RmsNorm, apply_rope, attention, linear
from engine.model.rotary import apply_rope_interleaved
from engine.model.state import StateSpec
from kernels.attention_ref import latent_attention, visible_keys

# q_a_layernorm and kv_a_layernorm are built without the config's rms_norm_eps in every reference
# implementation (DeepseekV2RMSNorm(rank) -> eps 1e-6), also where rms_norm_eps is 1e-5 (GLM-4.7-Flash).
LATENT_NORM_EPS = 1e-6


@dataclass(frozen=True)
class MlaShape:
    num_heads: int
    q_lora_rank: int | None          # None: one q_proj (V2-Lite); else q_a -> norm -> q_b
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool            # DeepSeek pairs (2i, 2i+1); False: halves (rope_interleave=false configs)
    softmax_scale: float             # qk_head_dim^-0.5, times mscale^2 with YaRN's mscale_all_dim

    @classmethod
    def from_config(cls, cfg) -> "MlaShape":
        qk_head_dim = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        return cls(num_heads=cfg.num_attention_heads, q_lora_rank=getattr(cfg, "q_lora_rank", None) or None,
                   kv_lora_rank=cfg.kv_lora_rank, qk_nope_head_dim=cfg.qk_nope_head_dim,
                   qk_rope_head_dim=cfg.qk_rope_head_dim, v_head_dim=cfg.v_head_dim,
                   rope_interleave=bool(getattr(cfg, "rope_interleave", True)),
                   softmax_scale=qk_head_dim ** -0.5 * yarn_softmax_factor(getattr(cfg, "rope_parameters", None) or {}))

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def state_widths(self) -> dict[str, int]:
        """Per-token state of one layer: name -> values per token."""
        return {"kv_latent": self.kv_lora_rank, "k_rope": self.qk_rope_head_dim}

    def state_bytes_per_token(self, dtype_bytes: int) -> int:
        return sum(self.state_widths().values()) * dtype_bytes


def yarn_softmax_factor(rope_parameters: dict) -> float:
    """DeepSeek's YaRN softmax correction: mscale(factor, mscale_all_dim)^2, 1 without it."""
    mscale_all_dim = rope_parameters.get("mscale_all_dim") or 0
    factor = rope_parameters.get("factor") or 1.0
    if rope_parameters.get("rope_type", "default") == "default" or not mscale_all_dim or factor <= 1:
        return 1.0
    mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0
    return mscale * mscale


class MlaAttention:
    """One layer's MLA. `forward` is the whole mixer; query/latent/attend are its parts (prefill, decode)."""

    def __init__(self, shape: MlaShape, weights: dict[str, torch.Tensor]):
        self.shape, self.w = shape, weights
        self.q_a_norm = RmsNorm(weights["q_a_layernorm.weight"], LATENT_NORM_EPS) if shape.q_lora_rank else None
        self.kv_a_norm = RmsNorm(weights["kv_a_layernorm.weight"], LATENT_NORM_EPS)
        self.decode_kernel = None       # kernels.mla_decode (mla_decode_ref's signature), attached at load

    def query_residual(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, D] -> the normed q LoRA [T, q_lora] (q_lora_rank set; DSA's indexer reads it too)."""
        return self.q_a_norm(linear(x, self.w["q_a_proj.weight"], self.w.get("q_a_proj.bias")))

    def query(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              q_residual: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, D] -> q [T, H, nope + rope], rope part rotated (q_residual: query_residual(x), if known)."""
        s, w = self.shape, self.w
        if s.q_lora_rank is None:
            q = linear(x, w["q_proj.weight"])
        else:
            q = linear(self.query_residual(x) if q_residual is None else q_residual, w["q_b_proj.weight"])
        q = q.view(x.shape[0], s.num_heads, s.qk_head_dim)                                 # [T, H, nope+rope]
        q_nope, q_rope = q.split([s.qk_nope_head_dim, s.qk_rope_head_dim], dim=-1)
        return torch.cat((q_nope, self._rope(q_rope, cos, sin)), dim=-1)

    def latent(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, D] -> what the state keeps per token: kv_latent [T, r] (normed), k_rope [T, dr] (rotated)."""
        s, w = self.shape, self.w
        compressed = linear(x, w["kv_a_proj_with_mqa.weight"], w.get("kv_a_proj_with_mqa.bias"))   # [T, r + dr]
        kv_latent, k_rope = compressed.split([s.kv_lora_rank, s.qk_rope_head_dim], dim=-1)
        kv_latent = self.kv_a_norm(kv_latent)
        k_rope = self._rope(k_rope[:, None, :], cos, sin)[:, 0, :]                          # one head shared by all
        return kv_latent, k_rope

    def attend(self, q: torch.Tensor, kv_latent: torch.Tensor, k_rope: torch.Tensor,
               q_positions: torch.Tensor) -> torch.Tensor:
        """q [T, H, nope+rope] at q_positions [T]; kv_latent [S, r], k_rope [S, dr] at positions 0..S-1 -> [T, H*v]."""
        # S = tokens so far, H = heads
        if q.shape[0] == 1 and self.decode_kernel is not None:     # reads the keys 0..position only, on the device
            q_latent, q_rope = self.absorb_query(q)
            return self.apply_values(self.decode_kernel(q_latent, q_rope, kv_latent, k_rope, q_positions,
                                                        self.shape.softmax_scale))
        if q.shape[0] == 1:
            return self.attend_absorbed(q, kv_latent, k_rope, visible_keys(q_positions, kv_latent.shape[0]))
        k, v = self.expand(kv_latent, k_rope)
        return attention(q, k, v, q_positions, None, scale=self.shape.softmax_scale)       # [T, H * v]

    def expand(self, kv_latent: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_latent [S, r], k_rope [S, dr] -> every head's keys [S, H, nope+rope] and values [S, H, v]."""
        s = self.shape
        kv = linear(kv_latent, self.w["kv_b_proj.weight"]).view(-1, s.num_heads, s.qk_nope_head_dim + s.v_head_dim)
        k_nope, v = kv.split([s.qk_nope_head_dim, s.v_head_dim], dim=-1)                   # [S, H, nope], [S, H, v]
        return torch.cat((k_nope, k_rope[:, None, :].expand(-1, s.num_heads, -1)), dim=-1), v

    def attend_absorbed(self, q: torch.Tensor, kv_latent: torch.Tensor, k_rope: torch.Tensor,
                        visible: torch.Tensor) -> torch.Tensor:
        """One decode token q [1, H, nope+rope] over the keys `visible` [1, S] lets it see, in the latent space:
        kv_b_proj's key half is folded into the query and its value half applied after the softmax, so the step
        costs O(S x r) per head instead of expanding every cached latent into full keys and values
        (O(S x r x H x (nope+v)): on CUDA the state is static and holds the whole context, so that expansion
        would run over all of it at every token)."""
        q_latent, q_rope = self.absorb_query(q)                                             # [H, r], [H, dr]
        out_latent = latent_attention(q_latent, q_rope, kv_latent, k_rope, visible, self.shape.softmax_scale)
        return self.apply_values(out_latent)

    def absorb_query(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [1, H, nope+rope] -> q_latent [H, r] (q_nope through kv_b_proj's key half), q_rope [H, dr]."""
        s = self.shape
        q_nope, q_rope = q[0].split([s.qk_nope_head_dim, s.qk_rope_head_dim], dim=-1)   # [H, n], [H, dr]
        return torch.einsum("hn,hnr->hr", q_nope, self._kv_b()[0]), q_rope

    def apply_values(self, out_latent: torch.Tensor) -> torch.Tensor:
        """out_latent [H, r] -> [1, H * v] through kv_b_proj's value half."""
        s = self.shape
        return torch.einsum("hr,hvr->hv", out_latent, self._kv_b()[1]).reshape(1, s.num_heads * s.v_head_dim)

    def _kv_b(self) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_b_proj per head: its key half [H, n, r] and value half [H, dv, r] (views, no copies)."""
        # H = heads, r = kv_lora_rank, n = nope dim, dv = value dim
        s = self.shape
        w_kv = self.w["kv_b_proj.weight"].view(s.num_heads, s.qk_nope_head_dim + s.v_head_dim, s.kv_lora_rank)
        return w_kv.split([s.qk_nope_head_dim, s.v_head_dim], dim=1)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                store: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """x [T, D] (normed) at positions [T] -> attention output [T, D].

        store(kv_latent [T, r], k_rope [T, dr]) keeps this step's per-token state (state_widths) and
        returns all of it so far ([S, r], [S, dr]).
        """
        q = self.query(x, cos, sin)
        kv_latent, k_rope = self.latent(x, cos, sin)
        out = self.attend(q, *store(kv_latent, k_rope), positions)
        return linear(out, self.w["o_proj.weight"], self.w.get("o_proj.bias"))

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rope_interleaved(x, cos, sin) if self.shape.rope_interleave else apply_rope(x, cos, sin)


class MlaMixer:
    """MLA as a Block mixer: per token the state keeps "kv_latent" [r] and "k_rope" [dr]."""

    def __init__(self, layer: int, attention: MlaAttention, rope: Rope):
        self.layer, self.attention, self.rope = layer, attention, rope

    @staticmethod
    def specs(shape: MlaShape) -> dict[str, StateSpec]:
        return {name: StateSpec((width,)) for name, width in shape.state_widths().items()}

    def state_specs(self) -> dict[str, StateSpec]:
        return self.specs(self.attention.shape)

    def store(self, step: Step, kv_latent: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep the step's latents [T, r] and rope keys [T, dr]; return all of them so far ([S, r], [S, dr])."""
        return (step.state.append(self.layer, "kv_latent", step.positions, step.start, kv_latent),
                step.state.append(self.layer, "k_rope", step.positions, step.start, k_rope))

    def __call__(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        cos, sin = self.rope.cos_sin(step)
        return self.attention.forward(x, cos, sin, step.positions, lambda *latents: self.store(step, *latents))
