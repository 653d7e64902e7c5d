"""The app starts whatever its data folder holds. Qt-free: returns the store to use and the notices to show.

- a damaged database (not SQLite, truncated, malformed, a folder in its place) is moved aside as
  `sluice.db.damaged-YYYYMMDD-HHMMSS` and a fresh one is created;
- a database that is read-only or locked by another program is opened as an in-memory copy: the
  chats are there, nothing new is saved, and the notice says so;
- settings that cannot be read fall back to their defaults;
- a models folder that is a file, cannot be created or is read-only is named in a notice.
Every event goes to sluice.log as well.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from .settings import AppSettings
from .store import Store

log = logging.getLogger("sluice.startup")
_DAMAGED = ("SQLITE_CORRUPT", "SQLITE_NOTADB")
_DAMAGED_WORDS = ("malformed", "not a database", "lacks columns")


@dataclass
class Notice:
    title: str
    text: str                         # one or two sentences: what happened, what it means, what to do
    path: Path | None = None          # the file or folder concerned (the dialog offers to show it)
    kind: str = "notice"              # "damaged_database" | "read_only_database" | "settings" | "models_folder"


@dataclass
class Startup:
    store: Store
    notices: list[Notice] = field(default_factory=list)


def open_store(db_path: Path) -> Startup:
    """The store to run with, and what the user must be told about it."""
    if db_path.is_dir():
        return _move_aside_and_start_fresh(db_path, "a folder is where the file should be")
    try:
        return Startup(Store(db_path))
    except sqlite3.DatabaseError as exc:
        if _is_damaged(exc):
            return _move_aside_and_start_fresh(db_path, str(exc))
        return _read_only(db_path, exc)
    except OSError as exc:             # the data folder cannot be created
        return _read_only(db_path, exc)


def _is_damaged(exc: sqlite3.DatabaseError) -> bool:
    name = getattr(exc, "sqlite_errorname", "")
    return name in _DAMAGED or any(word in str(exc) for word in _DAMAGED_WORDS)


def damaged_name(db_path: Path, now: float | None = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return db_path.with_name(f"{db_path.name}.damaged-{stamp}")


def _move_aside_and_start_fresh(db_path: Path, reason: str) -> Startup:
    aside = damaged_name(db_path)
    try:
        os.replace(db_path, aside)
        for suffix in ("-wal", "-shm"):          # SQLite's side files belong to the damaged copy
            side = db_path.with_name(db_path.name + suffix)
            if side.exists():
                os.replace(side, aside.with_name(aside.name + suffix))
        store = Store(db_path)
    except (OSError, sqlite3.Error) as exc:
        log.error("the chat database %s is damaged (%s) and cannot be replaced: %s", db_path, reason, exc)
        return Startup(Store.in_memory(db_path), [Notice(
            "Chat history unavailable",
            f"Your chat history file is damaged and Sluice cannot replace it ({exc}); chats in this session "
            "will not be saved. Check the data folder's permissions and restart Sluice.",
            db_path, "damaged_database")])
    log.error("the chat database %s was damaged (%s); moved it to %s and started a fresh one", db_path, reason, aside)
    return Startup(store, [Notice(
        "Chat history was damaged",
        "Sluice could not read your chat history, so it moved the damaged file aside and started a fresh, "
        "empty one. Nothing was deleted: the old file is kept as shown below, for recovery tools or support.",
        aside, "damaged_database")])


def _read_only(db_path: Path, exc: Exception) -> Startup:
    reason = getattr(exc, "strerror", None) or str(exc)
    is_locked = "locked" in reason or getattr(exc, "sqlite_errorname", "") in ("SQLITE_BUSY", "SQLITE_LOCKED")
    log.warning("the chat database %s cannot be written (%s): opening a read-only copy", db_path, reason)
    store = Store.read_only_copy(db_path)
    if is_locked:
        text = ("Another program is using your chat history (the file is locked), so Sluice opened it read-only: "
                "you can read and chat, but nothing new is saved. Close the other program (or the other Sluice "
                "window) and restart Sluice to save again.")
    else:
        text = (f"Sluice cannot write to your chat history ({reason}), so it opened it read-only: you can read "
                "and chat, but nothing new is saved. Make the file and its folder writable and restart Sluice.")
    return Startup(store, [Notice("Chat history is read-only", text, db_path, "read_only_database")])


UNREADABLE_SETTINGS_KEY = "app.unreadable"     # the saved settings as they were before a repair


def load_settings(store: Store) -> list[Notice]:
    """Check the saved settings; unreadable values are replaced by defaults (saved back) and named."""
    settings, problems = AppSettings.load_checked(store)
    if not problems:
        return []
    for problem in problems:
        log.warning("settings: %s; using the default", problem)
    try:
        store.set_setting(UNREADABLE_SETTINGS_KEY, store.get_setting("app", None))   # kept, not lost
    except (ValueError, sqlite3.Error) as exc:
        log.warning("cannot keep a copy of the unreadable settings: %s", exc)
    try:
        settings.save(store)
    except sqlite3.Error as exc:
        log.warning("cannot save the repaired settings: %s", exc)
    return [Notice("Settings reset", "Some saved settings could not be read (" + "; ".join(problems) +
                   "), so Sluice uses the defaults for them; check them in Settings….", None, "settings")]


def models_folder_problem(path: Path) -> str | None:
    """Why models cannot be kept in `path` (one sentence), or None."""
    if path.exists() and not path.is_dir():
        return f"The models folder '{path}' is a file, not a folder; choose another models folder in Settings…."
    if not path.is_dir():
        return f"The models folder '{path}' cannot be created; choose another models folder in Settings…."
    if not os.access(path, os.W_OK | os.X_OK):
        return (f"The models folder '{path}' is read-only: installed models still load, but new ones cannot be "
                "added there; choose another models folder in Settings… to add models.")
    return None


def check_models_folder(store: Store) -> list[Notice]:
    path = AppSettings.load(store).models_path()
    problem = models_folder_problem(path)
    if problem is None:
        return []
    log.warning(problem)
    return [Notice("Models folder", problem, path, "models_folder")]


def start(db_path: Path) -> Startup:
    """Everything the window needs before it opens."""
    startup = open_store(db_path)
    startup.notices += load_settings(startup.store)
    startup.notices += check_models_folder(startup.store)
    return startup
