"""Shared by the setup tests (not a conftest, so test modules can import it by name)."""
from __future__ import annotations

import json
from pathlib import Path

SUPPORTED_REPO = "tiny-moe/Qwen3-MoE-tiny"
MIXTRAL_REPO = "tiny-moe/Mixtral-tiny"
UNSUPPORTED_REPO = "tiny-dense/Llama-tiny"


def build_llama(dst: Path) -> Path:
    """A dense llama (not a MoE): Sluice must refuse it from config.json alone."""
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.for_model("llama", vocab_size=256, hidden_size=64, intermediate_size=512, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(dst))
    return dst


def same_files(src: Path, dst: Path, names) -> bool:
    return all((src / n).read_bytes() == (dst / n).read_bytes() for n in names)


def config_of(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())
