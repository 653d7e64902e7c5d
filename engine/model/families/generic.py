"""Families without a native Sluice module: transformers' own modules with streamed experts (engine.model.generic).

The spec comes from the config through the model transformers builds from it on the meta device: the layers
with routed experts and their sizes are where its experts modules are, whatever the family's config calls
them (num_experts, n_routed_experts, moe_num_experts; first_k_dense_replace, mlp_layer_types, ...).
"""
from __future__ import annotations

import torch

from engine.model.generic.model import build as _build
from engine.model.generic.model import state_specs as _state_specs
from engine.model.generic.scan import find_experts, meta_model, read_interface
from engine.model.spec import ModelSpec, as_ids
from engine.model.state import StateSpec

EMBEDS_ITSELF = True         # transformers' embedding module looks its rows up: the table is loaded, not mapped


def read_spec(full_cfg) -> ModelSpec:
    """full_cfg: the checkpoint's config (a vision-language one included: its text config gives the sizes)."""
    interface, cfg = read_interface(full_cfg), full_cfg.get_text_config()
    num_heads = getattr(cfg, "num_attention_heads", None) or 1
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // num_heads
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    return ModelSpec(
        family=full_cfg.model_type, num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size,
        vocab_size=cfg.vocab_size, num_heads=num_heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or num_heads, head_dim=head_dim,
        rms_eps=float(getattr(cfg, "rms_norm_eps", None) or 1e-6), num_experts=interface.num_experts,
        top_k=cfg.num_experts_per_tok, expert_intermediate=interface.intermediate,
        norm_topk_prob=bool(getattr(cfg, "norm_topk_prob", False)), moe_layers=interface.moe_layers,
        dense_intermediate=getattr(cfg, "intermediate_size", None) or interface.intermediate,
        shared_expert_intermediate=0, qk_norm="none", clip_qkv=None,
        sliding_windows=(None,) * cfg.num_hidden_layers,
        tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        eos_token_ids=as_ids(getattr(cfg, "eos_token_id", None)),
        max_position_embeddings=getattr(cfg, "max_position_embeddings", None) or 4096,
        rope_type=rope.get("rope_type", "default"), rope_theta=float(rope.get("rope_theta", 10000.0)),
        cfg=full_cfg, generic=interface,
    )


def state_specs(spec: ModelSpec) -> list[dict[str, StateSpec]]:
    return _state_specs(spec)


def build(spec: ModelSpec, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device):
    return _build(spec, weights, dtype, device)


def required_dense_tensors(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """In-memory name -> shape of every dense tensor transformers' model loads (its experts' aside)."""
    model = meta_model(spec.cfg)
    experts = tuple(path + "." for path in find_experts(model))
    need = {name: tuple(t.shape) for name, t in model.state_dict().items()
            if spec.generic.is_text_tensor(name) and not name.startswith(experts)}
    if spec.tie_word_embeddings:
        need.pop(spec.generic.head + ".weight", None)
    return need


def param_counts(config: dict):
    """The estimate's parameter counts: transformers' model on the meta device counts them."""
    from engine.model.generic.graphs import graph_blocker
    from engine.model.generic.scan import parameter_counts
    from engine.model.param_counts import ModelShape
    from engine.model.spec import read_spec as read_model_spec
    spec = read_model_spec(config)
    total, experts, embedding = parameter_counts(spec.cfg)
    dense = total - experts
    expert = (3 if spec.has_expert_gate else 2) * spec.hidden_size * spec.expert_intermediate
    return ModelShape(spec.family, spec.num_layers, len(spec.moe_layers), spec.num_experts, spec.top_k,
                      spec.hidden_size, spec.expert_intermediate, spec.vocab_size, total,
                      dense + len(spec.moe_layers) * spec.top_k * expert, dense, embedding,
                      has_expert_gate=spec.has_expert_gate,
                      generic_graphs=graph_blocker(spec.generic, spec.cfg.get_text_config(decoder=True)) is None)
