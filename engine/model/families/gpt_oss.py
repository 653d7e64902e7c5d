"""gpt_oss: pre-norm GQA attention with sinks, q/k/v/o biases and YaRN rope, sliding-window and full
layers alternating (`layer_types`), and a MoE in every layer whose router takes the top-k of its
biased logits before a softmax over those k, and whose experts are a clamped SwiGLU with biases
(engine/model/gptoss.py). On a GPU the Triton MoE kernels (decode and prefill) compute them with the
same clamped SwiGLU and biases (expert_kernel=kernels.activation.clamped_swiglu(alpha, limit)).
"""
from __future__ import annotations

from functools import partial

import torch

from engine.model.block import Block
from engine.model.gptoss import TopKSoftmaxRouter, clamped_swiglu_expert
from engine.model.model import Model
from engine.model.spec import ModelSpec, as_ids
from engine.model.families import standard
from kernels.activation import clamped_swiglu
from engine.model.param_counts import ModelShape, Parts, moe_shape

FAMILY_NAMES = ("gpt_oss",)
SWIGLU_ALPHA = 1.702     # the clamped SwiGLU's sigmoid scale where the config does not say
# What `dense_quant` may keep as int8 (engine.model.dense_quant): the attention projections (their biases
# stay in the compute dtype; `linear` adds them), the head and the embedding table. The router and the
# sinks stay exact.
DENSE_INT8 = r"^model\.embed_tokens\.weight$|^lm_head\.weight$|\.self_attn\.[qkvo]_proj\.weight$"

state_specs = standard.state_specs          # per-layer keys and values, as the standard families


def read_spec(cfg) -> ModelSpec:
    num_layers = cfg.num_hidden_layers
    window = cfg.sliding_window or None
    rope = dict(cfg.rope_parameters or {})
    return ModelSpec(
        family=cfg.model_type, num_layers=num_layers, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
        num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads or cfg.num_attention_heads,
        head_dim=cfg.head_dim or cfg.hidden_size // cfg.num_attention_heads, rms_eps=cfg.rms_norm_eps,
        num_experts=cfg.num_local_experts, top_k=cfg.num_experts_per_tok, expert_intermediate=cfg.intermediate_size,
        norm_topk_prob=False, moe_layers=tuple(range(num_layers)), dense_intermediate=cfg.intermediate_size,
        shared_expert_intermediate=0, qk_norm="none", clip_qkv=None,
        sliding_windows=tuple(window if t == "sliding_attention" else None for t in cfg.layer_types),
        tie_word_embeddings=bool(cfg.tie_word_embeddings), eos_token_ids=as_ids(cfg.eos_token_id),
        max_position_embeddings=cfg.max_position_embeddings,
        rope_type=rope.get("rope_type", "default"), rope_theta=float(rope.get("rope_theta", 150000.0)),
        cfg=cfg,
    )


def build(spec: ModelSpec, w: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device) -> Model:
    rope = standard.make_rope(spec, dtype, device)
    blocks = []
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        attn, norms = standard.attention(spec, w, layer, rope)
        router = TopKSoftmaxRouter(w[p + "mlp.router.weight"], w[p + "mlp.router.bias"], spec.top_k)
        blocks.append(Block(attn, *norms, router=router))
    # transformers before 5.2x wrote no swiglu_alpha in the config: its modeling code held 1.702, as real checkpoints do
    alpha, limit = getattr(spec.cfg, "swiglu_alpha", SWIGLU_ALPHA), spec.cfg.swiglu_limit
    expert = partial(clamped_swiglu_expert, alpha=alpha, limit=limit)
    return standard.assemble(spec, w, blocks, expert_mlp=expert, expert_kernel=clamped_swiglu(alpha, limit))


def param_counts(config: dict) -> ModelShape:
    """The estimate's parameter counts (engine.model.param_counts) with gpt-oss's biases and sinks."""
    return moe_shape(config, _adjust_counts)


def _adjust_counts(config: dict, p: Parts) -> None:
    p.attn += p.H + p.nh                                             # o_proj bias, sinks
    p.router += p.E                                                  # router bias
    p.expert += 2 * p.I_expert + p.H                                 # expert biases
    p.exact_extra += p.L * (p.nh * p.hd + 2 * p.nkv * p.hd + p.H + p.nh)     # q/k/v/o biases, sinks stay exact
