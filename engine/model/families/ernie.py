"""ERNIE-4.5-MoE (ernie4_5_moe): GQA with interleaved rope, a softmax top-k router whose correction bias only
chooses (weights: the unbiased scores over their sum clamped to moe_norm_min), shared experts without a gate, MoE
layers every moe_layer_interval from moe_layer_start_index to moe_layer_end_index and dense MLPs elsewhere.

Interleaved rope rotates pairs (x[2i], x[2i+1]); Sluice's rope rotates (x[i], x[i + D/2]). The query and key
projections' rows are de-interleaved per head once at load, so the standard rope (and its kernel) computes the
same rotation, laid out de-interleaved; query and key share the permutation, so their dot products are unchanged.
"""
from __future__ import annotations

import torch

from engine.errors import SluiceError
from engine.model.block import Block, Mlp
from engine.model.dense_quant import take_rows
from engine.model.families import standard
from engine.model.families.deepseek_style import RouterPiece
from engine.model.model import Model
from engine.model.param_counts import ModelShape, Parts, moe_shape
from engine.model.routers import GroupedRouter
from engine.model.spec import ModelSpec, as_ids
from engine.model.state import StateSpec

# What `dense_quant` may keep as int8 (engine.model.dense_quant): the projections `linear` multiplies by.
DENSE_INT8 = (r"^model\.embed_tokens\.weight$|^lm_head\.weight$|\.self_attn\.[qkvo]_proj\.weight$"
              r"|\.mlp\.(shared_experts\.)?(gate|up|down)_proj\.weight$")


def refuse_unhandled(config: dict) -> None:
    """One sentence for a config Sluice cannot run exactly (raw config.json, before transformers reads it)."""
    if config.get("use_bias"):
        raise SluiceError("This ERNIE-4.5 model has biases in its projections (use_bias), which Sluice does not "
                          "support.")


def read_spec(cfg) -> ModelSpec:
    num_layers = cfg.num_hidden_layers
    router = GroupedRouter.from_config(cfg)
    router.check(cfg.num_experts)
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    return ModelSpec(
        family=cfg.model_type, num_layers=num_layers, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
        num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads or cfg.num_attention_heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        rms_eps=cfg.rms_norm_eps, num_experts=cfg.num_experts, top_k=cfg.num_experts_per_tok,
        expert_intermediate=cfg.moe_intermediate_size, norm_topk_prob=True,
        moe_layers=moe_layers(cfg.moe_layer_start_index, cfg.moe_layer_end_index, cfg.moe_layer_interval, num_layers),
        dense_intermediate=cfg.intermediate_size,
        shared_expert_intermediate=cfg.moe_intermediate_size * (cfg.moe_num_shared_experts or 0),
        qk_norm="none", clip_qkv=None, sliding_windows=(None,) * num_layers,
        tie_word_embeddings=bool(cfg.tie_word_embeddings), eos_token_ids=as_ids(getattr(cfg, "eos_token_id", None)),
        max_position_embeddings=cfg.max_position_embeddings, rope_type=rope.get("rope_type", "default"),
        rope_theta=float(rope.get("rope_theta", 10000.0)), cfg=cfg)


def moe_layers(start: int, end: int, interval: int, num_layers: int) -> tuple[int, ...]:
    """The layers with routed experts: every `interval`-th (counting from 1) from start to end, both included
    (transformers' config has turned an end of -1 into the last layer)."""
    return tuple(i for i in range(num_layers) if (i + 1) % interval == 0 and start <= i <= end)


def state_specs(spec: ModelSpec) -> list[dict[str, StateSpec]]:
    """Keys and values per layer, as the standard families keep them."""
    return standard.state_specs(spec)


def build(spec: ModelSpec, w: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device) -> Model:
    rope = standard.make_rope(spec, dtype, device)
    router = GroupedRouter.from_config(spec.cfg)
    deinterleave_rope_rows(w, spec)
    blocks = []
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        attn, norms = standard.attention(spec, w, layer, rope)
        if not spec.is_moe_layer(layer):
            blocks.append(Block(attn, *norms, mlp=Mlp(w, p + "mlp.")))
            continue
        # the Hub's spelling, or transformers' in-memory one; stored [1, E]
        bias = w.get(p + "mlp.moe_statics.e_score_correction_bias",
                     w.get(p + "mlp.gate.moe_statics.e_score_correction_bias")).reshape(-1)
        shared = Mlp(w, p + "mlp.shared_experts.") if spec.shared_expert_intermediate else None
        blocks.append(Block(attn, *norms, router=RouterPiece(router, w[p + "mlp.gate.weight"], bias), shared=shared))
    return standard.assemble(spec, w, blocks)


def deinterleave_rope_rows(w: dict[str, torch.Tensor], spec: ModelSpec) -> None:
    """The query and key projections' rows (and biases), each head's even dimensions first, then its odd ones, in
    place (int8 weights too: their codes and row scales move together; the kernels attach to what is in `w`)."""
    within = torch.cat((torch.arange(0, spec.head_dim, 2), torch.arange(1, spec.head_dim, 2)))     # [D]
    for layer in range(spec.num_layers):
        for proj, heads in (("q_proj", spec.num_heads), ("k_proj", spec.num_kv_heads)):
            rows = (torch.arange(heads)[:, None] * spec.head_dim + within).reshape(-1)          # [heads * D]
            prefix = f"model.layers.{layer}.self_attn.{proj}."
            for name in (prefix + "weight", prefix + "bias"):
                if name in w:
                    w[name] = take_rows(w[name], rows)


def param_counts(config: dict) -> ModelShape:
    """The estimate's parameter counts (engine.model.param_counts), with transformers' defaults for what config.json
    leaves out (ERNIE's own names: moe_k, moe_num_experts; tied embeddings unless it says otherwise)."""
    from engine.model.spec import hf_config
    full = {**hf_config(config).to_dict(), "model_type": config["model_type"]}
    return moe_shape({**full, "num_experts_per_tok": full["moe_k"]}, _adjust_counts)


def _adjust_counts(config: dict, p: Parts) -> None:
    p.moe_layer_ids = list(moe_layers(config["moe_layer_start_index"], config["moe_layer_end_index"],
                                      config["moe_layer_interval"], p.L))
    shared = 3 * p.H * config["moe_intermediate_size"] * (config.get("moe_num_shared_experts") or 0)
    p.shared = shared + p.E                                 # shared experts and the router's correction bias
