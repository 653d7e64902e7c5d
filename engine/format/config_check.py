"""A model's config checked before anything is written or run: types and ranges of the spec, and
(at repack) every tensor the forward pass needs present with the shape the config implies.

Without this an inconsistent config (top_k above the expert count, zero heads, a tensor missing)
repacks fine and fails later at generate with a KeyError or a ZeroDivisionError.
"""
from __future__ import annotations

import math
from dataclasses import fields

from engine.errors import SluiceError
from engine.model.families import FAMILIES
from engine.model.spec import ModelSpec, canonical_dense_name, read_spec

# families whose dense tensor names this file knows; others get the spec checks only
KNOWN_FAMILIES = ("qwen3_moe", "mixtral", "olmoe", "qwen2_moe")


def checked_spec(config: dict, where: str) -> ModelSpec:
    """read_spec plus the range checks; `where` names the config for the sentence."""
    try:
        spec = read_spec(config)
    except SluiceError:
        raise
    except Exception as exc:      # transformers' config classes raise many types for a bad value (their own too)
        raise SluiceError(f"The model config in '{where}' has a missing or wrong value ({type(exc).__name__}: "
                          f"{exc}); download the model again or fix config.json.") from None
    problem = spec_problem(spec)
    if problem:
        raise SluiceError(f"The model config in '{where}' is inconsistent: {problem}; download the model again "
                          "or fix config.json.")
    return spec


def spec_problem(spec: ModelSpec) -> str | None:
    """The first thing wrong with the spec's values, as a phrase, or None."""
    return _type_problem(spec) or _shape_problem(spec) or _number_problem(spec)


def _type_problem(spec: ModelSpec) -> str | None:
    for f in fields(spec):
        value = getattr(spec, f.name)
        if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            return f"{f.name} is {value!r}, not a whole number"
    positive = ("num_layers", "hidden_size", "vocab_size", "num_heads", "num_kv_heads", "head_dim", "num_experts",
                "top_k", "expert_intermediate", "max_position_embeddings")
    for name in positive:
        if getattr(spec, name) < 1:
            return f"{name} is {getattr(spec, name)}, it must be at least 1"
    return None


def _shape_problem(spec: ModelSpec) -> str | None:
    """Sizes that contradict each other: experts, heads, layers."""
    if spec.top_k > spec.num_experts:
        return f"each token uses {spec.top_k} experts (num_experts_per_tok) but there are only {spec.num_experts}"
    if spec.num_heads % spec.num_kv_heads:
        return f"{spec.num_heads} attention heads do not divide into {spec.num_kv_heads} key-value heads"
    if spec.head_dim % 2:
        return f"the head size {spec.head_dim} is odd, rotary embeddings need it even"
    if not spec.moe_layers:
        return "no layer has experts"
    if any(layer < 0 or layer >= spec.num_layers for layer in spec.moe_layers):
        return "an expert layer lies outside the model's layers"
    if len(spec.moe_layers) < spec.num_layers and spec.dense_intermediate < 1:
        return "the dense layers' intermediate_size is 0"
    return None


def _number_problem(spec: ModelSpec) -> str | None:
    if not (math.isfinite(spec.rms_eps) and spec.rms_eps > 0):
        return f"rms_norm_eps is {spec.rms_eps}, it must be a small positive number"
    if not (math.isfinite(spec.rope_theta) and spec.rope_theta > 0):
        return f"rope_theta is {spec.rope_theta}, it must be positive"
    if any(w is not None and w < 1 for w in spec.sliding_windows):
        return "sliding_window must be at least 1"
    return None


def required_dense_tensors(spec: ModelSpec) -> dict[str, tuple[int, ...]] | None:
    """Canonical dense tensor name -> shape the forward pass needs (None for a family not known here)."""
    if spec.generic is not None:            # what transformers' own model of it loads
        from engine.model.families.generic import required_dense_tensors as generic_tensors
        return generic_tensors(spec)
    if spec.family not in KNOWN_FAMILIES:
        return None
    H, V, D = spec.hidden_size, spec.vocab_size, spec.head_dim
    q_width, kv_width = spec.num_heads * D, spec.num_kv_heads * D
    need = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    if not spec.tie_word_embeddings:
        need["lm_head.weight"] = (V, H)
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        need.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                     p + "self_attn.q_proj.weight": (q_width, H), p + "self_attn.k_proj.weight": (kv_width, H),
                     p + "self_attn.v_proj.weight": (kv_width, H), p + "self_attn.o_proj.weight": (H, q_width)})
        if spec.qk_norm == "head":
            need.update({p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,)})
        elif spec.qk_norm == "full":
            need.update({p + "self_attn.q_norm.weight": (q_width,), p + "self_attn.k_norm.weight": (kv_width,)})
        if spec.is_moe_layer(layer):
            need[p + "mlp.gate.weight"] = (spec.num_experts, H)
            if spec.shared_expert_intermediate:
                S = spec.shared_expert_intermediate
                need.update({p + "mlp.shared_expert.gate_proj.weight": (S, H),
                             p + "mlp.shared_expert.up_proj.weight": (S, H),
                             p + "mlp.shared_expert.down_proj.weight": (H, S),
                             p + "mlp.shared_expert_gate.weight": (1, H)})
        else:
            I = spec.dense_intermediate
            need.update({p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                         p + "mlp.down_proj.weight": (H, I)})
    return need


def check_tensors(spec: ModelSpec, ckpt, where: str) -> None:
    """Every tensor the model needs is in the checkpoint `ckpt` with the shape its config implies."""
    needed = required_dense_tensors(spec)
    if spec.generic is not None:
        _check_generic_dense(spec, ckpt, needed, where)
    elif needed is not None:
        present = {canonical_dense_name(spec.family, n): n for n in ckpt.names()}
        for name, shape in needed.items():
            _check_present(ckpt, present.get(name, name), shape, where)
    if spec.family in ("gpt_oss", "nemotron_h") or spec.generic is not None or FAMILIES[spec.family].module == "llama4":
        return          # their expert sources check them (engine.format: gptoss_, generic_, llama4_, nemotron_experts)
    I, H, E = spec.expert_intermediate, spec.hidden_size, spec.num_experts
    for layer in spec.moe_layers:
        gate_up, down = spec.fused_expert_names(layer)
        if gate_up in ckpt:
            _check_present(ckpt, gate_up, (E, 2 * I, H), where)
            _check_present(ckpt, down, (E, H, I), where)
            continue
        for expert in range(E):
            for proj, shape in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
                _check_present(ckpt, ckpt.spelling(spec.expert_tensor_name(layer, expert, proj)), shape, where)


def _check_generic_dense(spec: ModelSpec, ckpt, needed: dict[str, tuple[int, ...]], where: str) -> None:
    """Every dense tensor transformers' model loads is in the checkpoint under its name or its sources (a merged
    one's shape is known once merged)."""
    from engine.format.generic_dense import GenericDense
    dense = GenericDense(spec, [n for n in ckpt.names() if ".experts." not in n])
    shapes = dense.shapes(ckpt)
    for name, shape in needed.items():
        if name in dense.plain:
            _check_present(ckpt, dense.plain[name], shape, where)
        elif name not in shapes:
            raise SluiceError(f"The checkpoint in '{where}' has no tensor for '{name}', which transformers' "
                              f"{spec.family} model needs; it is incomplete or not the model its config says.")


def _check_present(ckpt, name: str, shape: tuple[int, ...], where: str) -> None:
    if name not in ckpt:
        raise SluiceError(f"The checkpoint in '{where}' has no tensor '{name}', which its config needs; "
                          "it is incomplete or not the model its config says.")
    actual = tuple(ckpt.logical_shape(name))
    if actual != tuple(shape):
        raise SluiceError(f"The tensor '{name}' in '{where}' has shape {list(actual)} but the config implies "
                          f"{list(shape)}; the config does not belong to these weights.")
