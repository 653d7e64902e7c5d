"""DeepSeek-style MoE families: config quirks, checkpoint names and per-layer pieces.

  deepseek_v2    MLA (q LoRA optional: V2-Lite has none), softmax router, group max (group_limited_greedy)
  deepseek_v3    MLA, sigmoid router + correction bias, groups by top-2 sum (also Kimi-K2)
  glm4_moe       GQA with partial rotary, optional per-head QK norm and qkv bias; V3's router (GLM-4.5..4.7)
  glm4_moe_lite  MLA with V3's router; dense/sparse layers from mlp_layer_types (GLM-4.7-Flash)
  minimax_m2     GQA with QK norm over the whole projection and partial rotary; sigmoid + bias, no groups
  dots1          GQA with per-head QK norm (always), full rotary, sliding windows from layer_types; V3's router
  deepseek_v32   V3 with DeepSeek Sparse Attention: MLA over the keys a lightning indexer picks (engine.model.dsa)
  glm_moe_dsa    V3.2's layers (GLM-5); "shared" layers reuse the previous indexer's selection
All but MiniMax-M2 have shared experts (plain SwiGLU, no gate) and leading dense layers.
Checkpoints may hold multi-token-prediction layers after the last decoder layer
(`model.layers.{num_hidden_layers}...`); Sluice decodes without them, as transformers does, and
repack skips them.
"""
from __future__ import annotations

import re

import torch

from engine.errors import SluiceError
from engine.model.families import UNHANDLED_VARIANTS
from engine.model.block import Attention, Block, Mlp, Rope
from engine.model.dsa import DsaMixer, Indexer, IndexerShape, indexer_sources
from engine.model.mla import MlaAttention, MlaMixer, MlaShape
from engine.model.model import Model
from engine.model.routers import GroupedRouter
from engine.model.rotary import rope_frequencies
from engine.model.spec import ModelSpec, as_ids, hf_config
from engine.model.state import StateSpec
from engine.model.param_counts import ModelShape, Parts, moe_shape

FAMILIES = ("deepseek_v2", "deepseek_v3", "glm4_moe", "glm4_moe_lite", "minimax_m2", "dots1", "deepseek_v32",
            "glm_moe_dsa")
# What `dense_quant` may keep as int8 (engine.model.dense_quant): the projections only `linear` multiplies
# by; MLA's kv_b_proj stays (one decode token folds it into the query and the output as a view).
DENSE_INT8 = (r"^model\.embed_tokens\.weight$|^lm_head\.weight$"
              r"|\.self_attn\.([qkvo]|q_a|q_b|kv_a)_proj(_with_mqa)?\.weight$"
              r"|\.mlp\.(shared_experts\.)?(gate|up|down)_proj\.weight$")
DSA_FAMILIES = ("deepseek_v32", "glm_moe_dsa")       # MLA with a lightning indexer (engine.model.dsa)
MLA_FAMILIES = ("deepseek_v2", "deepseek_v3", "glm4_moe_lite", *DSA_FAMILIES)
# dense or sparse MLP layers from mlp_layer_types (the others: first_k_dense_replace)
_LAYER_TYPED = ("glm4_moe_lite", *DSA_FAMILIES)
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def refuse_unhandled(config: dict) -> None:
    """One sentence for a config these families cannot run exactly (raw config.json, before transformers reads it)."""
    family = config.get("model_type")
    if family in UNHANDLED_VARIANTS:
        raise SluiceError(UNHANDLED_VARIANTS[family])
    if family not in FAMILIES:
        return
    what = {"deepseek_v2": "DeepSeek-V2", "deepseek_v3": "DeepSeek-V3"}.get(family, family)
    scoring = config.get("scoring_func")
    expected = "softmax" if family == "deepseek_v2" else "sigmoid"
    if scoring not in (None, expected):
        raise SluiceError(f"This {what} model scores experts with '{scoring}', but its architecture uses '{expected}'; "
                          "Sluice cannot run it exactly.")
    if family == "deepseek_v3" and config.get("topk_method") not in (None, "noaux_tc"):
        raise SluiceError(f"This DeepSeek-V3 model routes with topk_method '{config['topk_method']}'; "
                          "Sluice runs only 'noaux_tc' (sigmoid scores with a correction bias).")
    if (config.get("moe_layer_freq") or 1) != 1:
        raise SluiceError(f"This {what} model has MoE only every {config['moe_layer_freq']} layers "
                          "(moe_layer_freq), which Sluice does not support.")
    if config.get("mlp_bias"):
        raise SluiceError(f"This {what} model has MLP biases (mlp_bias), which Sluice does not support.")


def read_spec(cfg) -> ModelSpec:
    family, num_layers = cfg.model_type, cfg.num_hidden_layers
    if family == "minimax_m2":
        num_experts, expert_intermediate, shared = cfg.num_local_experts, cfg.intermediate_size, 0
        moe_layers = tuple(range(num_layers))
    else:
        num_experts, expert_intermediate = cfg.n_routed_experts, cfg.moe_intermediate_size
        shared = cfg.moe_intermediate_size * (cfg.n_shared_experts or 0)
        if family in _LAYER_TYPED:
            moe_layers = tuple(i for i, t in enumerate(cfg.mlp_layer_types) if t == "sparse")
        else:
            moe_layers = tuple(range(cfg.first_k_dense_replace or 0, num_layers))
    router = GroupedRouter.from_config(cfg)
    router.check(num_experts)
    is_mla = family in MLA_FAMILIES
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    if is_mla and rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise SluiceError("This model combines latent attention with partial rotary, which Sluice does not support.")
    return ModelSpec(
        family=family, num_layers=num_layers, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
        num_heads=cfg.num_attention_heads,
        num_kv_heads=cfg.num_attention_heads if is_mla else cfg.num_key_value_heads,
        head_dim=cfg.qk_rope_head_dim if is_mla else getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        rms_eps=cfg.rms_norm_eps, num_experts=num_experts, top_k=cfg.num_experts_per_tok,
        expert_intermediate=expert_intermediate, norm_topk_prob=router.renormalize, moe_layers=moe_layers,
        dense_intermediate=cfg.intermediate_size, shared_expert_intermediate=shared, qk_norm=_qk_norm(cfg),
        clip_qkv=None, sliding_windows=_sliding_windows(cfg),
        tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        eos_token_ids=as_ids(getattr(cfg, "eos_token_id", None)), max_position_embeddings=cfg.max_position_embeddings,
        rope_type=rope.get("rope_type", "default"), rope_theta=float(rope.get("rope_theta", 10000.0)), cfg=cfg)


def state_specs(spec: ModelSpec) -> list[dict[str, StateSpec]]:
    """Per-layer state known from the config alone (the estimate uses it): MLA's latent and rope key (and DSA's
    indexer keys), or K/V."""
    if spec.family in DSA_FAMILIES:
        mla, index = MlaShape.from_config(spec.cfg), IndexerShape.from_config(spec.cfg)
        return [DsaMixer.dsa_specs(mla, index if source == layer else None)
                for layer, source in enumerate(indexer_sources(spec.cfg))]
    if spec.family in MLA_FAMILIES:
        return [MlaMixer.specs(MlaShape.from_config(spec.cfg)) for _ in range(spec.num_layers)]
    return [Attention.specs(spec.num_kv_heads, spec.head_dim) for _ in range(spec.num_layers)]


class RouterPiece:
    """GroupedRouter bound to one layer's weights; route(h) is a pure function of h (speculation uses it)."""

    def __init__(self, router: GroupedRouter, weight: torch.Tensor, bias: torch.Tensor | None):
        self.router, self.weight, self.bias = router, weight.float(), None if bias is None else bias.float()
        self.kernel = None          # kernels.router.grouped_router_kernel, attached at load (with the weight as loaded)
        self.best_first = False     # the torch path's topk leaves the ids unsorted; the kernel's come best first

    def __call__(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kernel is None:
            weights, ids = self.router.route(h, self.weight, self.bias)      # [T, K] float32, [T, K]
        else:
            weights, ids = self.kernel(h, self.weight, self.bias, self.router)
        return weights.to(h.dtype), ids


def build(spec: ModelSpec, w: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device) -> Model:
    cfg = spec.cfg
    inv_freq, scaling = rope_frequencies(cfg)
    rope = Rope(inv_freq.to(device), scaling, dtype)
    router = GroupedRouter.from_config(cfg)
    blocks = []
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        mixer = _mixer(spec, layer, w, rope)
        norms = (w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"], spec.rms_eps)
        if not spec.is_moe_layer(layer):
            blocks.append(Block(mixer, *norms, mlp=Mlp(w, p + "mlp.")))
            continue
        # the correction bias: mlp.gate.* (DeepSeek-V3, GLM) or mlp.* (MiniMax-M2's block_sparse_moe)
        bias = w.get(p + "mlp.gate.e_score_correction_bias", w.get(p + "mlp.e_score_correction_bias"))
        shared = Mlp(w, p + "mlp.shared_experts.") if spec.shared_expert_intermediate else None
        blocks.append(Block(mixer, *norms, router=RouterPiece(router, w[p + "mlp.gate.weight"], bias), shared=shared))
    embed = w["model.embed_tokens.weight"]
    return Model(spec, blocks, embed, w["model.norm.weight"], w.get("lm_head.weight", embed), spec.rms_eps)


def _mixer(spec: ModelSpec, layer: int, w: dict[str, torch.Tensor], rope: Rope):
    """One layer's attention: GQA, MLA, or MLA with DSA's indexer (over the checkpoint's `self_attn.` tensors)."""
    a = f"model.layers.{layer}.self_attn."
    if spec.family not in MLA_FAMILIES:
        return Attention(layer, w, a, num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                         rope=rope, eps=spec.rms_eps, qk_norm=spec.qk_norm, window=spec.sliding_windows[layer])
    attention = MlaAttention(MlaShape.from_config(spec.cfg), {k[len(a):]: v for k, v in w.items() if k.startswith(a)})
    if spec.family not in DSA_FAMILIES:
        return MlaMixer(layer, attention, rope)
    source, i = indexer_sources(spec.cfg)[layer], a + "indexer."
    indexer = None if source != layer else Indexer(IndexerShape.from_config(spec.cfg),
                                                   {k[len(i):]: v for k, v in w.items() if k.startswith(i)})
    return DsaMixer(layer, attention, rope, indexer, source)


def _qk_norm(cfg) -> str:
    if cfg.model_type == "glm4_moe":
        return "head" if cfg.use_qk_norm else "none"
    # dots1 always norms q and k per head (Qwen3's attention); MiniMax-M2 over the whole projection
    return {"dots1": "head", "minimax_m2": "full"}.get(cfg.model_type, "none")


def _sliding_windows(cfg) -> tuple[int | None, ...]:
    """dots1's layer_types: "sliding_attention" layers see the last `sliding_window` positions; the others all
    (the other families have full attention everywhere)."""
    types = cfg.layer_types if cfg.model_type == "dots1" else ["full_attention"] * cfg.num_hidden_layers
    return tuple(cfg.sliding_window if t == "sliding_attention" else None for t in types)


def is_beyond_last_layer(name: str, num_layers: int) -> bool:
    """A tensor of a layer after the decoder's last (multi-token prediction): not needed to decode."""
    m = _LAYER.match(name)
    return m is not None and int(m.group(1)) >= num_layers


def param_counts(config: dict) -> ModelShape:
    """The estimate's parameter counts (engine.model.param_counts): MLA or GQA attention, shared experts without a
    gate, a correction bias per router, leading dense layers."""
    return moe_shape(config, _adjust_counts)


def _adjust_counts(config: dict, p: Parts) -> None:
    family = config["model_type"]
    p.attn = _mla_params(config) if family in MLA_FAMILIES else _gqa_params(config, p)
    if family in MLA_FAMILIES:                   # kv_b_proj stays exact with int8 dense weights
        p.exact_extra += p.L * config["kv_lora_rank"] * p.nh * (config["qk_nope_head_dim"] + config["v_head_dim"])
    if family in DSA_FAMILIES:                   # the indexers (exact with int8 dense weights too)
        cfg = hf_config(config)
        with_indexer = sum(source == layer for layer, source in enumerate(indexer_sources(cfg)))
        indexers = with_indexer * IndexerShape.from_config(cfg).weight_count(p.H, config["q_lora_rank"])
        p.mixers, p.exact_extra = p.L * p.attn + indexers, p.exact_extra + indexers
    if family == "minimax_m2":
        p.shared, p.I_expert = p.E, config["intermediate_size"]     # router bias; no shared expert
        return
    shared = 3 * p.H * config["moe_intermediate_size"] * (config.get("n_shared_experts") or 0)
    p.shared = shared + (0 if family == "deepseek_v2" else p.E)     # V2 routes without a correction bias
    p.I_expert = config["moe_intermediate_size"]


def _mla_params(config: dict) -> int:
    H, nh = config["hidden_size"], config["num_attention_heads"]
    r, dr = config["kv_lora_rank"], config["qk_rope_head_dim"]
    qk, v = config["qk_nope_head_dim"] + dr, config["v_head_dim"]
    q_lora = config.get("q_lora_rank")
    attn = (H * q_lora + q_lora + q_lora * nh * qk) if q_lora else H * nh * qk
    return attn + H * (r + dr) + r + r * nh * (config["qk_nope_head_dim"] + v) + nh * v * H


def _gqa_params(config: dict, p: Parts) -> int:
    """GLM-4.5, dots1 and MiniMax-M2: the common attention, with q/k norms (per head; MiniMax: over the
    projection; dots1 always) and, in dots1, an o_proj bias beside the qkv biases."""
    if config["model_type"] == "dots1":
        return p.attn + 2 * p.hd + (p.H if config.get("attention_bias") else 0)
    attn = p.attn + (2 * p.hd if config.get("use_qk_norm") else 0)
    return attn + (p.nh * p.hd + p.nkv * p.hd if config["model_type"] == "minimax_m2" else 0)
