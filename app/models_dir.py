"""Installed models: the Sluice model dirs (folders holding sluice.json) inside the models folder."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class InstalledModel:
    path: Path
    name: str
    family: str
    quant: str
    size_bytes: int


def is_sluice_model(path: Path) -> bool:
    return (Path(path) / "sluice.json").is_file()


def is_hf_snapshot(path: Path) -> bool:
    path = Path(path)
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def describe(path: Path) -> InstalledModel:
    path = Path(path)
    try:
        meta = json.loads((path / "sluice.json").read_text())
    except (OSError, ValueError):
        meta = {}
    config = meta.get("config", {}) if isinstance(meta.get("config"), dict) else {}
    family = meta.get("family") or meta.get("architecture") or config.get("model_type", "?")
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    return InstalledModel(path, meta.get("name") or path.name, str(family), str(meta.get("quant", "?")), size)


def installed_models(models_dir: Path) -> list[InstalledModel]:
    """Model dirs directly inside `models_dir`, sorted by name."""
    models_dir = Path(models_dir)
    if not models_dir.is_dir():
        return []
    found = [describe(p) for p in models_dir.iterdir() if p.is_dir() and is_sluice_model(p)]
    return sorted(found, key=lambda m: m.name.lower())
