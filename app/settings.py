"""App-wide settings (typed), persisted in the store's settings table."""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from . import paths
from .store import Store


@dataclass
class AppSettings:
    models_dir: str = ""              # "" -> paths.default_models_dir()
    device: str = "auto"              # auto | cpu | cuda
    vram_budget: str = ""             # "" -> engine default; else a size like "6GB"
    ram_cache: str = ""               # "" -> engine default; else a size like "16GB"
    last_model: str = ""              # path of the model loaded last time (reloaded at start)
    show_panels: bool = True
    window_geometry: str = ""         # QMainWindow.saveGeometry() as hex
    window_state: str = ""            # QMainWindow.saveState() as hex

    def models_path(self) -> Path:
        path = Path(self.models_dir) if self.models_dir else paths.default_models_dir()
        path.mkdir(parents=True, exist_ok=True)
        return path

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        try:
            import torch
            return "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            return "cpu"

    @classmethod
    def load(cls, store: Store) -> "AppSettings":
        saved = store.get_setting("app", {}) or {}
        return cls(**{f.name: saved[f.name] for f in fields(cls) if f.name in saved})

    def save(self, store: Store) -> None:
        store.set_setting("app", {f.name: getattr(self, f.name) for f in fields(self)})
