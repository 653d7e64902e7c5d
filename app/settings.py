"""App-wide settings (typed), persisted in the store's settings table."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from pathlib import Path

from engine import SluiceError, parse_size

from . import keys, paths
from .store import Store

DEVICES = ("auto", "cpu", "cuda")
DENSE_WEIGHTS = ("stored", "int8")    # engine.load's dense_quant: None (as the model stores them) or "int8"
log = logging.getLogger("sluice.settings")


@dataclass
class AppSettings:
    models_dir: str = ""              # "" -> paths.default_models_dir()
    device: str = "auto"              # auto | cpu | cuda
    vram_budget: str = ""             # "" -> engine default; else a size like "6GB"
    ram_cache: str = ""               # "" -> engine default; else a size like "16GB"
    dense_weights: str = "stored"     # stored | int8 (half their VRAM to expert slots, where the family allows)
    last_model: str = ""              # path of the model loaded last time (reloaded at start)
    show_panels: bool = True
    window_geometry: str = ""         # QMainWindow.saveGeometry() as hex
    window_state: str = ""            # QMainWindow.saveState() as hex
    remote_endpoints: list = field(default_factory=list)   # [{"url", "api_key", "models": [ids]}]
    server: dict = field(default_factory=dict)             # the Local server panel: {"port", "api_key", "lan"}

    def models_path(self) -> Path:
        """The models folder, created when missing; a folder that cannot be created is returned as it is
        (app.startup.models_folder_problem says what is wrong with it)."""
        path = Path(self.models_dir) if self.models_dir else paths.default_models_dir()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("the models folder %s cannot be created: %s", path, exc)
        return path

    def remote_api_key(self, url: str) -> str | None:
        return next((e.get("api_key") or None for e in self.remote_endpoints if e.get("url") == url), None)

    def remove_remote_endpoint(self, url: str) -> None:
        """Leave the endpoint out, and its API key out of the OS keyring (a saved one would outlive it)."""
        if any(e.get("url") == url and (e.get("api_key") or e.get("key_in_keyring")) for e in self.remote_endpoints):
            keys.forget(url)
        self.remote_endpoints = [e for e in self.remote_endpoints if e.get("url") != url]

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
        settings, problems = cls.load_checked(store)
        for problem in problems:
            log.warning("settings: %s; using the default", problem)
        return settings

    @classmethod
    def load_checked(cls, store: Store) -> tuple["AppSettings", list[str]]:
        """The saved settings with every unreadable or out-of-range value replaced by its default,
        and one phrase per replaced value (empty when all were fine)."""
        try:
            saved = store.get_setting("app", {})
        except ValueError:
            return cls(), ["the saved settings are not valid JSON"]
        if not isinstance(saved, dict):
            return cls(), ["the saved settings are not a set of named values"]
        settings, problems = cls(), []
        for f in fields(cls):
            if f.name not in saved:
                continue
            value, default = saved[f.name], getattr(settings, f.name)
            problem = _problem(f.name, value, default)
            if problem is None and f.name in _REPAIRS:
                value, problem = _REPAIRS[f.name](value)       # the readable part is kept
                setattr(settings, f.name, value)
            elif problem is None:
                setattr(settings, f.name, value)
            if problem:
                problems.append(problem)
        settings.remote_endpoints = [_key_from_keyring(e) for e in settings.remote_endpoints]
        return settings, problems

    def save(self, store: Store) -> None:
        saved = {f.name: getattr(self, f.name) for f in fields(self)}
        saved["remote_endpoints"] = [_key_to_keyring(e) for e in self.remote_endpoints]
        store.set_setting("app", saved)


def _key_to_keyring(endpoint: dict) -> dict:
    """The endpoint as sluice.db keeps it: its API key in the OS keyring where there is one."""
    key = endpoint.get("api_key")
    if key and keys.store(endpoint.get("url", ""), key):
        return {**endpoint, "api_key": "", "key_in_keyring": True}
    return endpoint


def _key_from_keyring(endpoint: dict) -> dict:
    if isinstance(endpoint, dict) and endpoint.get("key_in_keyring"):
        return {**endpoint, "api_key": keys.load(endpoint.get("url", "")) or ""}
    return endpoint


def _problem(name: str, value, default) -> str | None:
    if type(value) is not type(default):
        return f"'{name}' holds {value!r}, not a {type(default).__name__}"
    if name == "device" and value not in DEVICES:
        return f"'device' holds {value!r}, not one of {', '.join(DEVICES)}"
    if name == "dense_weights" and value not in DENSE_WEIGHTS:
        return f"'dense_weights' holds {value!r}, not one of {', '.join(DENSE_WEIGHTS)}"
    if name in ("vram_budget", "ram_cache") and value:
        try:
            parse_size(value)
        except SluiceError:
            return f"'{name}' holds {value!r}, which is not a size like 8GB"
    return None


def _repair_endpoints(endpoints: list) -> tuple[list, str | None]:
    """The well-formed remote endpoints ({"url": str, "api_key": str, "models": [str]}), and what was left out."""
    kept = [e for e in endpoints if isinstance(e, dict) and isinstance(e.get("url"), str) and e["url"]
            and isinstance(e.get("api_key", ""), (str, type(None)))
            and isinstance(e.get("models", []), list) and all(isinstance(m, str) for m in e.get("models", []))]
    left_out = len(endpoints) - len(kept)
    return kept, (f"{left_out} of the saved remote endpoints could not be read" if left_out else None)


def _repair_server(server: dict) -> tuple[dict, str | None]:
    """The Local server's settings with an unreadable port, key or LAN switch back at its default."""
    checks = {"port": lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 65535,
              "api_key": lambda v: isinstance(v, str), "lan": lambda v: isinstance(v, bool)}
    bad = [key for key, is_valid in checks.items() if key in server and not is_valid(server[key])]
    kept = {key: value for key, value in server.items() if key not in bad}
    return kept, ("the Local server's " + ", ".join(f"'{key}' ({server[key]!r})" for key in bad)
                  + " could not be read" if bad else None)


_REPAIRS = {"remote_endpoints": _repair_endpoints, "server": _repair_server}
