"""deepseek_v4 (DeepSeek-V4 Flash / Pro): mHC residual streams [T, n, H] around every block, shared-KV
attention with sliding, compressed (HCA) and sparse compressed (CSA) layers, hash-routed first layers,
sqrtsoftplus scores, clamped SwiGLU experts and one shared expert. The math is in engine.model.dsv4
(see docs/families/deepseek_v4.md); here it is wired into the runtime's Block and Model.

Hash routing needs the token ids, which `route(h)` does not receive: the model's `embed` keeps the
step's ids in a holder the hash blocks read (in decode, the step's static input row).
"""
from __future__ import annotations

import functools

import torch

from engine.model.block import Block, Step
from engine.model.dsv4.config import read_dsv4_config
from engine.model.dsv4.hyper import hyper_head
from engine.model.dsv4.layer import Dsv4Layer, Mixed, rope_for
from engine.model.dsv4.moe import clamped_swiglu
from engine.model.dsv4.norms import Dsv4RmsNorm
from engine.model.dsv4.state import layer_state_specs
from engine.model.layers import embedding, linear
from engine.model.model import Model
from engine.model.spec import ModelSpec, as_ids
from engine.model.state import StateSpec
from kernels.activation import clamped_silu
from engine.model.param_counts import ModelShape

# What `dense_quant` may keep as int8 (engine.model.dense_quant): the projections only `linear` multiplies
# by (attention's q_a, q_b, kv, o_a (a group of rows at a time) and o_b, the shared expert), the head and the
# embedding table. The compressors, the indexer, the mHC mixers and the router stay exact.
DENSE_INT8 = (r"^model\.embed_tokens\.weight$|^lm_head\.weight$|\.self_attn\.(q_a|q_b|kv|o_a|o_b)_proj\.weight$"
              r"|\.mlp\.shared_experts\.(gate|up|down)_proj\.weight$")
EMBEDS_ITSELF = True      # its embed is not a plain row lookup: the table is loaded to the device (file_table)


def read_spec(cfg) -> ModelSpec:
    read_dsv4_config(cfg)                                  # its refusals, before anything is read or written
    return ModelSpec(
        family=cfg.model_type, num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size,
        vocab_size=cfg.vocab_size, num_heads=cfg.num_attention_heads, num_kv_heads=1, head_dim=cfg.head_dim,
        rms_eps=cfg.rms_norm_eps, num_experts=cfg.n_routed_experts, top_k=cfg.num_experts_per_tok,
        expert_intermediate=cfg.moe_intermediate_size, norm_topk_prob=True,
        moe_layers=tuple(range(cfg.num_hidden_layers)), dense_intermediate=cfg.moe_intermediate_size,
        shared_expert_intermediate=cfg.moe_intermediate_size, qk_norm="none", clip_qkv=None,
        sliding_windows=(cfg.sliding_window,) * cfg.num_hidden_layers,
        tie_word_embeddings=bool(cfg.tie_word_embeddings), eos_token_ids=as_ids(cfg.eos_token_id),
        max_position_embeddings=cfg.max_position_embeddings, rope_type="default", rope_theta=float(cfg.rope_theta),
        cfg=cfg)


def state_specs(spec: ModelSpec) -> list[dict[str, StateSpec]]:
    """Per layer the shared K = V head of every position and its compressors' buffers (dsv4/state.py)."""
    cfg = read_dsv4_config(spec.cfg)
    return [layer_state_specs(cfg, kind) for kind in cfg.layer_types]


class TokenIds:
    """The current step's token ids [T], set by the model's embed, read by the hash-routed blocks."""
    value: torch.Tensor | None = None


class Dsv4Block:
    is_moe = True
    expert_rows_per_token, expert_rows = 1, Block.expert_rows       # the experts run on h, as routed

    def __init__(self, layer: Dsv4Layer, token_ids: TokenIds, dtype: torch.dtype):
        self.layer, self.token_ids, self.dtype = layer, token_ids, dtype

    def state_specs(self) -> dict[str, StateSpec]:
        return layer_state_specs(self.layer.cfg, self.layer.kind)          # as state_specs(spec) declares

    def mix(self, x: torch.Tensor, step: Step) -> tuple[Mixed, torch.Tensor]:
        rope = step.memo("dsv4-rope", lambda: rope_for(self.layer.cfg, step.positions, self.dtype))
        return self.layer.mix(x, step, rope)

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weights, ids = self.layer.route(h, self.token_ids.value)
        return weights.to(h.dtype), ids

    def combine(self, x: Mixed, h: torch.Tensor, moe_out: torch.Tensor) -> torch.Tensor:
        return self.layer.combine(x, h, moe_out)


class Dsv4Model(Model):
    norm_type = Dsv4RmsNorm

    def __init__(self, spec: ModelSpec, blocks: list, token_ids: TokenIds, w: dict[str, torch.Tensor]):
        cfg = blocks[0].layer.cfg
        super().__init__(spec, blocks, w["model.embed_tokens.weight"], w["model.norm.weight"], w["lm_head.weight"],
                         cfg.eps, expert_mlp=functools.partial(_expert, limit=cfg.swiglu_limit),
                         expert_kernel=clamped_silu(cfg.swiglu_limit))
        self.cfg, self.token_ids = cfg, token_ids
        self.hc_head = tuple(w[f"model.hc_head.hc_{n}"] for n in ("fn", "base", "scale"))

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """[T] -> the n residual streams [T, n, H], all the token's embedding."""
        self.token_ids.value = token_ids
        x = embedding(token_ids, self.embed_tokens)
        return x.unsqueeze(1).expand(-1, self.cfg.hc_mult, -1).contiguous()

    def head(self, x: torch.Tensor) -> torch.Tensor:
        x = hyper_head(x[-1:], *self.hc_head, self.cfg.hc_eps, self.cfg.eps)
        return linear(self.final_norm(x), self.lm_head)[0].float()


def _expert(x: torch.Tensor, w: dict[str, torch.Tensor], limit: float) -> torch.Tensor:
    return clamped_swiglu(x, w["gate"], w["up"], w["down"], limit)


def build(spec: ModelSpec, w: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device) -> Dsv4Model:
    cfg = read_dsv4_config(spec.cfg).to(device)
    token_ids = TokenIds()
    blocks = [Dsv4Block(Dsv4Layer(cfg, i, lambda name, p=f"model.layers.{i}.": w[p + name]), token_ids, dtype)
              for i in range(spec.num_layers)]
    return Dsv4Model(spec, blocks, token_ids, w)


def param_counts(config: dict) -> ModelShape:
    """The estimate's parameter counts (engine.model.param_counts), from its own dense count (dsv4/params.py)."""
    from engine.model.dsv4.params import int8_dense_params, model_dense_params
    from engine.model.spec import hf_config
    cfg = hf_config(config)
    H, L, E, k, I = (cfg.hidden_size, cfg.num_hidden_layers, cfg.n_routed_experts, cfg.num_experts_per_tok,
                     cfg.moe_intermediate_size)
    dense, expert = model_dense_params(cfg), 3 * H * I
    return ModelShape("deepseek_v4", L, L, E, k, H, I, cfg.vocab_size, dense + L * E * expert, dense + L * k * expert,
                      dense, cfg.vocab_size * H, dense - int8_dense_params(cfg))
