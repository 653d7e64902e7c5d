"""Model families. Each module here provides
    read_spec(cfg) -> ModelSpec                      its config quirks (cfg: the transformers config)
    state_specs(spec) -> [ {name: StateSpec} ]       per-layer state, from the config alone (estimate)
    build(spec, weights, dtype, device) -> Model     its blocks over the dense weights
A new family is one module, registered in FAMILIES (imported on first use: this file imports
nothing of the model, so engine.model.spec can list the families)."""
from __future__ import annotations

import importlib
from types import ModuleType

# model_type (config.json) -> module in this package
FAMILIES: dict[str, str] = {
    "qwen3_moe": "standard", "mixtral": "standard", "olmoe": "standard", "qwen2_moe": "standard",
    "qwen3_next": "hybrid", "qwen3_5_moe": "hybrid",          # Gated-DeltaNet hybrids
    # DeepSeek-style: MLA or GQA, grouped sigmoid/softmax routers, shared experts, leading dense layers
    "deepseek_v2": "deepseek_style", "deepseek_v3": "deepseek_style", "glm4_moe": "deepseek_style",
    "glm4_moe_lite": "deepseek_style", "minimax_m2": "deepseek_style",
    "gpt_oss": "gpt_oss",
    "deepseek_v4": "deepseek_v4",
    "qwen4_exp": "qwen4_exp", "qwen4_exp_text": "qwen4_exp",      # hybrids with hyper-connections, PLE, QSA
}


def family_module(model_type: str) -> ModuleType:
    return importlib.import_module(f"engine.model.families.{FAMILIES[model_type]}")
