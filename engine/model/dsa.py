"""DeepSeek Sparse Attention (DSA: DeepSeek-V3.2, GLM-5): MLA whose queries each attend only to the `index_topk`
past tokens a lightning indexer scores highest.

The indexer has one small key per token (index_head_dim, kept in the state as "index_k"), queries of its own
(index_n_heads heads, from MLA's normed q LoRA) and a weight per head read from the hidden state:
    score(t, s) = sum_h w[t, h] * relu(q[t, h] . k[s] / sqrt(Di)),    w = weights_proj(x) / sqrt(Hi)
Its rope rotates the first qk_rope_head_dim channels of q and k, in halves (V3.2) or in pairs (GLM-5).
GLM-5's "shared" layers (indexer_types) have no indexer: they reuse the last "full" layer's selection.
Checkpoint tensors, under `self_attn.indexer.`: wq_b.weight, wk.weight, weights_proj.weight, k_norm.weight and
k_norm.bias (a LayerNorm, eps 1e-6).

  T = tokens, S = positions held, Hi = indexer heads, Di = indexer head dim, R = rope dims
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.errors import SluiceError
from engine.model.block import Rope, Step
from engine.model.layers import apply_rope, attention, linear
from engine.model.mla import MlaAttention, MlaMixer, MlaShape
from engine.model.rotary import apply_rope_interleaved
from engine.model.state import StateSpec
from kernels.attention_ref import QUERY_CHUNK, top_k_rows, top_k_visible, visible_keys

INDEX_NORM_EPS = 1e-6         # the indexer's k_norm: nn.LayerNorm(index_head_dim, eps=1e-6) in every reference
SCORE_ELEMENTS = 1 << 24      # float32 indexer scores [rows, Hi, S] one call holds: bounds a long prompt's


@dataclass(frozen=True)
class IndexerShape:
    num_heads: int
    head_dim: int
    rope_dim: int
    top_k: int
    rope_interleave: bool     # GLM-5 rotates pairs (2i, 2i+1); DeepSeek-V3.2 halves

    @classmethod
    def from_config(cls, cfg) -> "IndexerShape":
        return cls(cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim, cfg.index_topk,
                   cfg.model_type == "glm_moe_dsa")

    def weight_count(self, hidden: int, q_lora_rank: int) -> int:
        """Parameters of one indexer: wq_b, wk, k_norm (weight and bias), weights_proj."""
        return (q_lora_rank * self.num_heads * self.head_dim + hidden * self.head_dim + 2 * self.head_dim
                + hidden * self.num_heads)


def indexer_sources(cfg) -> list[int]:
    """Per layer, the layer whose indexer picks its keys: itself, or (GLM-5's "shared" layers) the last full one."""
    types = getattr(cfg, "indexer_types", None) or ["full"] * cfg.num_hidden_layers
    sources, last = [], None
    for layer, kind in enumerate(types):
        last = layer if kind == "full" else last
        if last is None:
            raise SluiceError(f"This {cfg.model_type} model's layer {layer} reuses an earlier layer's sparse "
                              "selection, but no earlier layer has an indexer; the config.json is damaged.")
        sources.append(last)
    return sources


class Indexer:
    """One layer's lightning indexer over its weights (`self_attn.indexer.*` without the prefix)."""

    def __init__(self, shape: IndexerShape, w: dict[str, torch.Tensor]):
        self.shape = shape
        self.wq_b, self.wk = w["wq_b.weight"], w["wk.weight"]
        self.k_norm = (w["k_norm.weight"], w["k_norm.bias"])
        self.weights_proj = w["weights_proj.weight"].float()      # float32, as transformers keeps it

    def keys(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, D] -> the tokens' indexer keys [T, Di] (normed, rope part rotated)."""
        k = F.layer_norm(linear(x, self.wk), (self.shape.head_dim,), *self.k_norm, INDEX_NORM_EPS)
        return self._rope(k[:, None, :], cos, sin)[:, 0]

    def select(self, x: torch.Tensor, q_residual: torch.Tensor, keys: torch.Tensor, q_positions: torch.Tensor,
               cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """[T, S] bool: each query's top_k causally visible keys (keys [S, Di], position s at row s) by score."""
        q, head_weights = self._queries(x, q_residual, cos, sin)
        keys_t, causal = keys.float().T, visible_keys(q_positions, keys.shape[0])              # [Di, S], [T, S]
        rows = max(1, min(QUERY_CHUNK, SCORE_ELEMENTS // (self.shape.num_heads * max(keys.shape[0], 1))))
        picked = [top_k_visible(_index_scores(q[r], head_weights[r], keys_t), causal[r], self.shape.top_k)
                  for r in (slice(first, first + rows) for first in range(0, x.shape[0], rows))]
        return picked[0] if len(picked) == 1 else torch.cat(picked)

    def picked_rows(self, x: torch.Tensor, q_residual: torch.Tensor, keys: torch.Tensor, position: torch.Tensor,
                    cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A CUDA graph's one query over the whole static state (keys [S, Di]): the rows of its top_k causally
        visible keys and which of them count (attention_ref.top_k_rows)."""
        q, head_weights = self._queries(x, q_residual, cos, sin)
        return top_k_rows(_index_scores(q, head_weights, keys.float().T), visible_keys(position, keys.shape[0]),
                          self.shape.top_k)

    def _queries(self, x: torch.Tensor, q_residual: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """-> the indexer's queries [T, Hi, Di] (float32, rotated) and their head weights [T, Hi]."""
        s, num_tokens = self.shape, x.shape[0]
        q = linear(q_residual, self.wq_b).view(num_tokens, s.num_heads, s.head_dim)
        return self._rope(q, cos, sin).float(), linear(x.float(), self.weights_proj) * s.num_heads ** -0.5

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, heads, Di]: the first R channels rotated, the rest passed through."""
        rotate = apply_rope_interleaved if self.shape.rope_interleave else apply_rope
        rope_dim = self.shape.rope_dim
        return torch.cat((rotate(x[..., :rope_dim], cos, sin), x[..., rope_dim:]), dim=-1)


def _index_scores(q: torch.Tensor, head_weights: torch.Tensor, keys_t: torch.Tensor) -> torch.Tensor:
    """q [t, Hi, Di], head weights [t, Hi], keys [Di, S] -> scores [t, S] = sum_h w[h] * relu(q[h] . k / sqrt(Di))."""
    scores = F.relu(torch.matmul(q, keys_t) * q.shape[-1] ** -0.5)                           # [t, Hi, S]
    return torch.matmul(head_weights[:, None, :], scores)[:, 0]


class DsaMixer(MlaMixer):
    """MLA restricted to the indexer's selection, as a Block mixer. A layer with an indexer also keeps its keys
    ("index_k" [Di] per token) and leaves its selection in the step's memo for the shared layers after it."""

    def __init__(self, layer: int, attention: MlaAttention, rope: Rope, indexer: Indexer | None, source: int):
        super().__init__(layer, attention, rope)
        self.indexer, self.source = indexer, source       # source: the layer whose selection this one uses

    @staticmethod
    def dsa_specs(shape: MlaShape, indexer: IndexerShape | None) -> dict[str, StateSpec]:
        specs = MlaMixer.specs(shape)
        return specs if indexer is None else {**specs, "index_k": StateSpec((indexer.head_dim,))}

    def state_specs(self) -> dict[str, StateSpec]:
        return self.dsa_specs(self.attention.shape, None if self.indexer is None else self.indexer.shape)

    def __call__(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        a = self.attention
        cos, sin = self.rope.cos_sin(step)
        q_residual = a.query_residual(x)                                                       # [T, q_lora]
        q = a.query(x, cos, sin, q_residual)                                                   # [T, H, nope+rope]
        kv_latent, k_rope = self.store(step, *a.latent(x, cos, sin))                           # [S, r], [S, dr]
        selected = step.memo(("dsa", self.source), lambda: self._select(x, q_residual, step, cos, sin))
        if step.start is None:           # a graph's one token over the whole static state: the picked rows only
            rows, visible = selected
            out = a.attend_absorbed(q, kv_latent[rows], k_rope[rows], visible)
        elif x.shape[0] == 1:
            out = a.attend_absorbed(q, kv_latent, k_rope, selected)
        else:
            k, v = a.expand(kv_latent, k_rope)                                                 # [S, H, *]
            out = attention(q, k, v, step.positions, scale=a.shape.softmax_scale, visible=selected)  # [T, H * v]
        return linear(out, a.w["o_proj.weight"], a.w.get("o_proj.bias"))

    def _select(self, x: torch.Tensor, q_residual: torch.Tensor, step: Step, cos: torch.Tensor, sin: torch.Tensor):
        """[T, S] bool (Indexer.select); in a graph the rows picked and which count (Indexer.picked_rows)."""
        if self.indexer is None:        # the full layer before it runs first in every pass
            raise RuntimeError(f"layer {self.layer} ran before layer {self.source}, whose selection it uses")
        keys = step.state.append(self.layer, "index_k", step.positions, step.start, self.indexer.keys(x, cos, sin))
        pick = self.indexer.picked_rows if step.start is None else self.indexer.select
        return pick(x, q_residual, keys, step.positions, cos, sin)
