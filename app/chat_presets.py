"""Default chat settings for new chats and named presets, kept in the store's settings table. Qt-free."""
from __future__ import annotations

from dataclasses import asdict

from .store import ChatSettings, Store

DEFAULTS_KEY = "chat_defaults"
PRESETS_KEY = "chat_presets"


def default_settings(store: Store) -> ChatSettings:
    return ChatSettings.from_dict(store.get_setting(DEFAULTS_KEY, {}) or {})


def save_default_settings(store: Store, settings: ChatSettings) -> None:
    store.set_setting(DEFAULTS_KEY, asdict(settings))


def presets(store: Store) -> dict[str, ChatSettings]:
    saved = store.get_setting(PRESETS_KEY, {}) or {}
    return {name: ChatSettings.from_dict(value) for name, value in sorted(saved.items(), key=lambda kv: kv[0].lower())}


def save_preset(store: Store, name: str, settings: ChatSettings) -> None:
    saved = store.get_setting(PRESETS_KEY, {}) or {}
    saved[name.strip()] = asdict(settings)
    store.set_setting(PRESETS_KEY, saved)


def delete_preset(store: Store, name: str) -> None:
    saved = store.get_setting(PRESETS_KEY, {}) or {}
    saved.pop(name, None)
    store.set_setting(PRESETS_KEY, saved)
