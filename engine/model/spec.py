"""Model config.json -> a typed ModelSpec. One place knows each family's config quirks.

Config parsing goes through `transformers.AutoConfig`, so old and new spellings
(`num_experts`/`num_local_experts`, `rope_theta`/`rope_parameters`, `rope_scaling`) and each
family's defaults mean exactly what they mean in the reference implementation.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

from engine.errors import SluiceError

from engine.model.families import FAMILIES, UNHANDLED_VARIANTS, family_module

SUPPORTED_FAMILIES = tuple(FAMILIES)


@dataclass(frozen=True)
class ModelSpec:
    family: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    num_experts: int
    top_k: int
    expert_intermediate: int
    norm_topk_prob: bool                 # renormalise the top-k routing weights
    moe_layers: tuple[int, ...]          # layers with a sparse MoE block; the others have a dense MLP
    dense_intermediate: int
    shared_expert_intermediate: int      # 0 when the family has no shared expert
    qk_norm: str                         # "none" | "head" (per head, Qwen3) | "full" (whole projection, OLMoE)
    clip_qkv: float | None
    sliding_windows: tuple[int | None, ...]  # per layer
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    max_position_embeddings: int
    rope_type: str
    rope_theta: float
    cfg: Any = field(default=None, compare=False, repr=False)   # the transformers config: family quirks
    generic: Any = field(default=None, compare=False, repr=False)  # generic families: their ExpertsInterface

    def is_moe_layer(self, layer: int) -> bool:
        return layer in self.moe_layers

    @property
    def has_expert_bias(self) -> bool:
        """gpt-oss experts add a bias to gate, up and down (block layouts then carry bias fields)."""
        return FAMILIES[self.family].has_expert_bias

    @property
    def has_expert_gate(self) -> bool:
        """Whether the experts are gated, down(act(gate x) * up x); Nemotron-H's are not, down(act(up x)), and
        their blocks hold up and down alone."""
        return FAMILIES[self.family].has_expert_gate if self.generic is None else self.generic.has_gate

    def expert_tensor_name(self, layer: int, expert: int, proj: str) -> str:
        """Hub checkpoint name of one expert projection (proj in gate | up | down)."""
        family = FAMILIES[self.family]
        if self.generic is not None:
            return f"{self._checkpoint_experts(layer)}.{expert}.{self.generic.hub_names[proj]}"
        return (f"{family.text_prefix}layers.{layer}.{family.expert_prefix}.experts.{expert}."
                f"{family.expert_proj[proj]}.weight")

    def fused_expert_names(self, layer: int) -> tuple[str, str]:
        """transformers v5 in-memory names of fused experts ([E, 2I, H] and [E, H, I]; ungated: up_proj [E, I, H])."""
        if self.generic is not None:
            p = self._checkpoint_experts(layer) + "."
        else:
            p = f"{FAMILIES[self.family].text_prefix}layers.{layer}.mlp.experts."
        return p + ("gate_up_proj" if self.has_expert_gate else "up_proj"), p + "down_proj"

    def _checkpoint_experts(self, layer: int) -> str:
        """A generic family's experts module, named as its checkpoint's tensors are after the family's renamings
        (canonical_dense_name; engine.format.generic_experts finds the stored names)."""
        return self.generic.paths[layer]


def canonical_dense_name(family: str, name: str) -> str:
    """Dense tensor names in the Sluice dir: one spelling per family (Mixtral's MoE block -> `mlp`,
    Qwen3.5's `model.language_model.` -> `model.`, Nemotron-H's `backbone.` -> `model.`)."""
    if family == "deepseek_v4":
        from engine.model.dsv4.names import canonical_name
        return canonical_name(name)
    descriptor = FAMILIES[family]
    if descriptor.is_generic:                   # the names transformers' own model loads
        from engine.model.generic.scan import in_memory_name
        return in_memory_name(family, name)
    if family == "nemotron_h":
        from engine.model.nemotron_names import canonical_name
        return canonical_name(name)
    if name.startswith(descriptor.text_prefix):
        name = name.removeprefix(descriptor.text_prefix)
        # the text model's own `model.` and `lm_head.` under a wrapper (Llama 4's `language_model.`)
        name = name if name.startswith(("model.", "lm_head.")) else "model." + name
    return name.replace(f".{descriptor.expert_prefix}.", ".mlp.")


def is_text_model_tensor(family: str, name: str) -> bool:
    """False for the parts Sluice does not run: a vision tower, multi-token-prediction heads. A generic family's
    text model is its descriptor's text_prefix (a vision-language checkpoint's language model)."""
    descriptor = FAMILIES[family]
    if descriptor.is_generic and descriptor.text_prefix != "model.":        # judged by the name transformers loads
        return canonical_dense_name(family, name).startswith((descriptor.text_prefix, "lm_head."))
    if not descriptor.text_prefix.startswith("model."):   # a wrapper's language model (Llama 4's), Nemotron-H's backbone
        return name.startswith((descriptor.text_prefix, "lm_head."))
    return not name.startswith(("model.visual.", "mtp.", "model.mtp.", "model.mtp_"))     # model.mtp_: ERNIE-4.5


def load_config_dict(path: str | Path) -> dict:
    p = Path(path)
    cfg_file = p / "config.json" if p.is_dir() else p
    if not cfg_file.is_file():
        raise SluiceError(f"No config.json in '{p}': choose a Hugging Face model folder or a Sluice model folder.")
    try:
        return json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SluiceError(f"'{cfg_file}' is not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc}); download the model again.") from exc


def hf_config(config: dict):
    """The transformers config object for a config dict (refuses unsupported families)."""
    model_type = config.get("model_type")
    if model_type in UNHANDLED_VARIANTS:
        raise SluiceError(UNHANDLED_VARIANTS[model_type])
    if model_type not in FAMILIES:
        _adopt_generic(config)
    refuse_unhandled = getattr(family_module(model_type), "refuse_unhandled", None)   # the family's own refusals
    if refuse_unhandled:
        refuse_unhandled(config)
    return _transformers_config(config)


def _transformers_config(config: dict):
    from huggingface_hub.errors import StrictDataclassClassValidationError
    from transformers import AutoConfig, PreTrainedConfig
    model_type = config.get("model_type")
    fields = {k: v for k, v in config.items() if k not in ("model_type", "transformers_version", "architectures")}
    fields = PreTrainedConfig._decode_special_floats(fields)      # {"__float__": "Infinity"}, as transformers writes it
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        return AutoConfig.for_model(model_type, **fields)
    except (TypeError, ValueError, KeyError, StrictDataclassClassValidationError) as exc:
        raise SluiceError(f"The config.json of this {model_type} model cannot be read ({exc}); download the model again.") from exc


def _adopt_generic(config: dict) -> None:
    """A model type Sluice does not list: run generically where transformers knows it and its routed experts use
    transformers' shared experts interface (engine.model.generic: day-0 families); else one sentence, naming what
    the generic path misses for a MoE model, or the families Sluice runs."""
    from transformers import CONFIG_MAPPING

    from engine.model.families import Family
    from engine.model.generic.scan import has_routed_experts, read_interface
    model_type = config.get("model_type")
    plain = SluiceError(f"Model type '{model_type}' is not supported: Sluice runs {', '.join(SUPPORTED_FAMILIES)} models.")
    if model_type not in CONFIG_MAPPING:
        raise plain
    try:
        cfg = _transformers_config(config)
        if not has_routed_experts(cfg):
            raise plain
    except (TypeError, ValueError, KeyError, AttributeError, SluiceError):
        raise plain from None          # a partial config transformers cannot lay out, or a dense model
    interface = read_interface(cfg)            # one sentence naming what is missing
    text_model = interface.text_model if interface.head == "lm_head" else interface.head.rpartition(".")[0]
    FAMILIES[model_type] = Family(model_type, "generic", text_prefix=text_model + ".")


def runs_generically(config: dict) -> bool:
    """Whether Sluice runs a config of a model type it does not list (adopting the type: _adopt_generic)."""
    try:
        hf_config(config)
    except SluiceError:
        return False
    return FAMILIES[config.get("model_type")].is_generic


def read_spec(config: dict | str | Path) -> ModelSpec:
    if not isinstance(config, dict):
        config = load_config_dict(config)
    cfg = hf_config(config)
    return family_module(cfg.model_type).read_spec(cfg)


def as_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (int(value),)
