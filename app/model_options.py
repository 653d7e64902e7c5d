"""The options a model is loaded with: the app settings' device and budgets, the context chosen for
this model (kept per model path), and the demo model's own budgets where the user set none. Qt-free."""
from __future__ import annotations

from pathlib import Path

from engine import parse_size

from .settings import AppSettings
from .store import Store

CONTEXTS_KEY = "model_contexts"      # model path -> context tokens (absent: the engine's default)


def model_context(store: Store, path: str | Path) -> int | None:
    return (store.get_setting(CONTEXTS_KEY, {}) or {}).get(str(path))


def set_model_context(store: Store, path: str | Path, tokens: int | None) -> None:
    contexts = store.get_setting(CONTEXTS_KEY, {}) or {}
    if tokens:
        contexts[str(path)] = int(tokens)
    else:
        contexts.pop(str(path), None)
    store.set_setting(CONTEXTS_KEY, contexts)


def load_options(settings: AppSettings, store: Store, path: str | Path) -> dict:
    """engine.load keyword arguments; raises SluiceError for a size that cannot be read."""
    from engine.setup import demo_load_options
    options = demo_load_options(path)
    if settings.vram_budget:
        options.pop("max_context", None)     # the demo's context is sized for its own budget: fit the user's
    options["device"] = settings.resolved_device()
    for key in ("vram_budget", "ram_cache"):
        value = getattr(settings, key)
        if value:
            options[key] = parse_size(value)
        else:
            options.setdefault(key, None)
    context = model_context(store, path)
    if context:
        options["max_context"] = context
    if settings.dense_weights == "int8" and int8_dense_available(path):
        options["dense_quant"] = "int8"
    return options


def int8_dense_available(path: str | Path) -> bool:
    """Whether the model at `path` can keep its dense weights as int8 (its family names them); a model
    that cannot loads with them as stored, and one that cannot be read says why when it loads."""
    from engine import SluiceError
    from engine.setup import is_model_dir, open_model_dir
    from engine.setup import dense_quant_available as available
    try:
        return is_model_dir(path) and available(open_model_dir(path).spec.family)
    except (SluiceError, OSError, ValueError):
        return False
