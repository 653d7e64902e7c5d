"""Checkpoint tensor names -> transformers' in-memory names (the spelling Sluice stores and the pieces read).

DeepSeek ships its own names (`embed`, `layers.L.attn.wq_a`, `ffn.experts.E.w1`, `hc_attn_fn`, ...), with or
without a `model.` prefix (save_pretrained writes a mix); the rules mirror transformers' conversion mapping.
"""
from __future__ import annotations

import re

EXPERT_PREFIX = "ffn"
EXPERT_PROJ = {"gate": "w1", "up": "w3", "down": "w2"}

_TOP = {"embed.weight": "model.embed_tokens.weight", "embed_tokens.weight": "model.embed_tokens.weight",
        "head.weight": "lm_head.weight", "lm_head.weight": "lm_head.weight", "norm.weight": "model.norm.weight",
        "hc_head_fn": "model.hc_head.hc_fn", "hc_head_base": "model.hc_head.hc_base",
        "hc_head_scale": "model.hc_head.hc_scale"}
_LAYER_RULES = [(re.compile(p), r) for p, r in (
    (r"\.attn\.", ".self_attn."), (r"\.ffn\.", ".mlp."),
    (r"\.self_attn\.indexer\.compressor\.", ".self_attn.compressor.indexer."),
    (r"\.self_attn\.indexer\.weights_proj\.", ".self_attn.compressor.indexer.scorer.weights_proj."),
    (r"\.self_attn\.indexer\.wq_b\.", ".self_attn.compressor.indexer.q_b_proj."),
    (r"\.attn_norm\.", ".input_layernorm."), (r"\.ffn_norm\.", ".post_attention_layernorm."),
    (r"\.hc_(attn|ffn)_(fn|base|scale)$", r".\1_hc.\2"), (r"\.attn_sink$", ".sinks"),
    (r"\.norm\.", ".kv_norm."), (r"\.ape$", ".position_bias"), (r"\.q_norm\.", ".q_a_norm."),
    (r"\.wq_a\.", ".q_a_proj."), (r"\.wq_b\.", ".q_b_proj."), (r"\.wkv\.", ".kv_proj."), (r"\.wgate\.", ".gate_proj."),
    (r"\.wo_a\.", ".o_a_proj."), (r"\.wo_b\.", ".o_b_proj."), (r"\.gate\.bias$", ".gate.e_score_correction_bias"),
    (r"\.shared_experts\.w1\.", ".shared_experts.gate_proj."), (r"\.shared_experts\.w2\.", ".shared_experts.down_proj."),
    (r"\.shared_experts\.w3\.", ".shared_experts.up_proj."),
)]


def canonical_name(name: str) -> str:
    bare = name.removeprefix("model.")
    if bare in _TOP:
        return _TOP[bare]
    if bare.startswith("hc_head."):
        return "model." + bare
    if not bare.startswith("layers."):
        return name
    bare = "." + bare
    for pattern, replacement in _LAYER_RULES:
        bare = pattern.sub(replacement, bare)
    return "model" + bare

