"""Model families: each module reads its config quirks into a ModelSpec (`read_spec(cfg)`) and builds
a Model from the dense weights (`build(spec, weights, dtype, device)`). A new family is one module
here, registered in FAMILIES (imported on first use: this file imports nothing of the model)."""
from __future__ import annotations

import importlib
from types import ModuleType

# model_type (config.json) -> module in this package
FAMILIES: dict[str, str] = {
    "qwen3_moe": "standard", "mixtral": "standard", "olmoe": "standard", "qwen2_moe": "standard",
    "qwen3_next": "hybrid", "qwen3_5_moe": "hybrid",          # Gated-DeltaNet hybrids
}


def family_module(model_type: str) -> ModuleType:
    return importlib.import_module(f"engine.model.families.{FAMILIES[model_type]}")
