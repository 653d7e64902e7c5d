"""Installed models: the Sluice model dirs (folders holding sluice.json) inside the models folder.

A folder whose sluice.json cannot be read or does not follow the schema is listed too, marked damaged
with the reason, so the user sees why a model they installed does not load.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from engine import SluiceError
from engine.setup import check_manifest

log = logging.getLogger("sluice.models")


@dataclass
class InstalledModel:
    path: Path
    name: str
    family: str
    quant: str
    size_bytes: int
    problem: str = ""                 # why the model cannot load ("" when it looks sound)

    @property
    def label(self) -> str:
        """How the model picker names it."""
        if self.problem:
            return f"{self.name}  (damaged: {self.problem})"
        return f"{self.name}  ({self.family}, {self.quant})"


def is_sluice_model(path: Path) -> bool:
    return (Path(path) / "sluice.json").is_file()


def is_hf_snapshot(path: Path) -> bool:
    path = Path(path)
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def describe(path: Path) -> InstalledModel:
    path = Path(path)
    problem = ""
    try:
        meta = json.loads((path / "sluice.json").read_text())
        check_manifest(meta, path / "sluice.json")
    except OSError as exc:
        meta, problem = {}, f"sluice.json cannot be read ({exc.strerror or exc})"
    except (ValueError, UnicodeDecodeError):
        meta, problem = {}, "sluice.json is not valid JSON"
    except SluiceError as exc:
        problem = str(exc).split(";")[0].rstrip(".")
    meta = meta if isinstance(meta, dict) else {}
    config = meta.get("config", {}) if isinstance(meta.get("config"), dict) else {}
    family = meta.get("family") or meta.get("architecture") or config.get("model_type", "?")
    try:
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    except OSError:
        size = 0
    if problem:
        log.warning("model folder %s is damaged: %s", path, problem)
    name = meta.get("name") if isinstance(meta.get("name"), str) else path.name
    return InstalledModel(path, name or path.name, str(family), str(meta.get("quant", "?")), size, problem)


def installed_models(models_dir: Path) -> list[InstalledModel]:
    """Model dirs directly inside `models_dir`, sorted by name; unfinished repacks (`*.partial`) and
    hidden folders (downloads in progress) are not models yet."""
    models_dir = Path(models_dir)
    try:
        candidates = [p for p in models_dir.iterdir()
                      if not p.name.startswith(".") and not p.name.endswith(".partial")
                      and p.is_dir() and is_sluice_model(p)]
    except OSError as exc:           # missing, a file, unreadable: the startup notice says so
        log.warning("cannot list the models folder %s: %s", models_dir, exc)
        return []
    return sorted((describe(p) for p in candidates), key=lambda m: m.name.lower())
