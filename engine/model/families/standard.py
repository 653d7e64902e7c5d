"""qwen3_moe, mixtral, olmoe, qwen2_moe: pre-norm GQA attention with RoPE and a softmax top-k MoE.

Their quirks: q/k norm per head (Qwen3) or over the whole projection (OLMoE), qkv clipping (OLMoE),
qkv biases and a sigmoid-gated shared expert (Qwen2), sliding windows per layer (Qwen2), dense MLP
layers between MoE layers (Qwen2/3 `mlp_only_layers`, `decoder_sparse_step`), routing weights
renormalised or not (`norm_topk_prob`; Mixtral always).
"""
from __future__ import annotations

import torch

from engine.model.block import Attention, Block, Mlp, Rope, Router
from engine.model.model import Model
from engine.model.rotary import rope_frequencies
from engine.model.spec import ModelSpec, as_ids
from engine.model.state import StateSpec
from engine.model.param_counts import ModelShape, Parts, moe_shape

FAMILY_NAMES = ("qwen3_moe", "mixtral", "olmoe", "qwen2_moe")
# What `dense_quant` may keep as int8 (engine.model.dense_quant): the weights only `linear` multiplies by
# (attention, dense MLPs and shared experts, the head) and the embedding table; the routers stay exact.
DENSE_INT8 = (r"^model\.embed_tokens\.weight$|^lm_head\.weight$|\.self_attn\.[qkvo]_proj\.weight$"
              r"|\.mlp\.(shared_expert\.)?(gate|up|down)_proj\.weight$")


def read_spec(cfg) -> ModelSpec:
    family = cfg.model_type
    num_layers = cfg.num_hidden_layers
    num_experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
    if family in ("qwen3_moe", "qwen2_moe"):
        mlp_only = set(cfg.mlp_only_layers or [])
        moe_layers = tuple(i for i in range(num_layers)
                           if i not in mlp_only and num_experts > 0 and (i + 1) % cfg.decoder_sparse_step == 0)
        expert_intermediate = cfg.moe_intermediate_size
    else:
        moe_layers = tuple(range(num_layers))
        expert_intermediate = cfg.intermediate_size
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    return ModelSpec(
        family=family, num_layers=num_layers, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
        num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads or cfg.num_attention_heads,
        head_dim=head_dim, rms_eps=cfg.rms_norm_eps, num_experts=num_experts, top_k=cfg.num_experts_per_tok,
        expert_intermediate=expert_intermediate,
        norm_topk_prob=True if family == "mixtral" else bool(cfg.norm_topk_prob),
        moe_layers=moe_layers, dense_intermediate=cfg.intermediate_size,
        shared_expert_intermediate=getattr(cfg, "shared_expert_intermediate_size", 0) if family == "qwen2_moe" else 0,
        qk_norm={"qwen3_moe": "head", "olmoe": "full"}.get(family, "none"),
        clip_qkv=getattr(cfg, "clip_qkv", None) if family == "olmoe" else None,
        sliding_windows=_sliding_windows(cfg, family, num_layers),
        tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        eos_token_ids=as_ids(getattr(cfg, "eos_token_id", None)),
        max_position_embeddings=cfg.max_position_embeddings,
        rope_type=rope.get("rope_type", "default"), rope_theta=float(rope.get("rope_theta", 10000.0)),
        cfg=cfg,
    )


def _sliding_windows(cfg, family: str, num_layers: int) -> tuple[int | None, ...]:
    window = getattr(cfg, "sliding_window", None) or None
    if family == "qwen2_moe":
        types = getattr(cfg, "layer_types", None) or ["full_attention"] * num_layers
        return tuple(window if t == "sliding_attention" else None for t in types)
    if family == "olmoe":
        return (None,) * num_layers
    return (window,) * num_layers


def state_specs(spec: ModelSpec) -> list[dict[str, StateSpec]]:
    """Per-layer state (keys and values), known from the config alone (the estimate uses it)."""
    return [Attention.specs(spec.num_kv_heads, spec.head_dim) for _ in range(spec.num_layers)]


def build(spec: ModelSpec, w: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device) -> Model:
    rope = make_rope(spec, dtype, device)
    blocks = []
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        attn, norms = attention(spec, w, layer, rope)
        if not spec.is_moe_layer(layer):
            blocks.append(Block(attn, *norms, mlp=Mlp(w, p + "mlp.")))
            continue
        router = Router(w[p + "mlp.gate.weight"], spec.top_k, spec.norm_topk_prob)
        shared = Mlp(w, p + "mlp.shared_expert.", gate=w[p + "mlp.shared_expert_gate.weight"]) \
            if spec.shared_expert_intermediate else None
        blocks.append(Block(attn, *norms, router=router, shared=shared))
    return assemble(spec, w, blocks)


def make_rope(spec: ModelSpec, dtype: torch.dtype, device: torch.device) -> Rope:
    inv_freq, scaling = rope_frequencies(spec.cfg)
    return Rope(inv_freq.to(device), scaling, dtype)


def attention(spec: ModelSpec, w: dict[str, torch.Tensor], layer: int, rope: Rope) -> tuple[Attention, tuple]:
    """A standard layer's attention and its two norms (input, post-attention) with their eps."""
    p = f"model.layers.{layer}."
    attn = Attention(layer, w, p + "self_attn.", num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
                     head_dim=spec.head_dim, rope=rope, eps=spec.rms_eps, qk_norm=spec.qk_norm,
                     clip_qkv=spec.clip_qkv, window=spec.sliding_windows[layer])
    return attn, (w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"], spec.rms_eps)


def assemble(spec: ModelSpec, w: dict[str, torch.Tensor], blocks: list, **model_options) -> Model:
    """The model around its blocks: embedding, final norm and head (tied to the embedding when absent)."""
    embed = w["model.embed_tokens.weight"]
    return Model(spec, blocks, embed, w["model.norm.weight"], w.get("lm_head.weight", embed), spec.rms_eps,
                 **model_options)


def param_counts(config: dict) -> ModelShape:
    """The estimate's parameter counts (engine.model.param_counts): the common count and each family's norms."""
    return moe_shape(config, _adjust_counts)


def _adjust_counts(config: dict, p: Parts) -> None:
    family = config["model_type"]
    if family == "qwen2_moe" and not (config.get("qkv_bias") or config.get("attention_bias")):
        p.attn += p.nh * p.hd + 2 * p.nkv * p.hd                     # q/k/v biases, whatever the config says
    if family == "qwen3_moe":
        p.attn += 2 * p.hd                                           # per-head q_norm, k_norm
    elif family == "olmoe":
        p.attn += p.nh * p.hd + p.nkv * p.hd                         # q_norm, k_norm over the whole projection
