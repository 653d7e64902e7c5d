"""Conversations, messages and settings in one SQLite file (WAL). Qt-free; used from the GUI thread only.

An answer is written while it streams (state "streaming", content growing) by app.stream_saver's thread,
in batches, so a crash loses at most the last half second; at the next start such rows are marked "interrupted".
Opening checks the file (quick_check, the expected columns) and raises sqlite3.DatabaseError when it
is damaged; app.startup decides what to do then. A row whose JSON is damaged reads as defaults.
"""
from __future__ import annotations

import json
import logging
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from .stream_saver import StreamSaver

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 2.0        # how long a write waits for another process's lock before "database is locked"
log = logging.getLogger("sluice.store")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    settings TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,    -- never reused: ids order a conversation and key the views
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,                      -- user | assistant
    content TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'done',      -- done | streaming | interrupted | error
    stats TEXT NOT NULL DEFAULT '{}',        -- tok_s, ttft_s, num_tokens, finish_reason, model
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_COLUMNS = {"conversations": {"id", "title", "created_at", "updated_at", "settings"},
            "messages": {"id", "conversation_id", "role", "content", "state", "stats", "created_at"},
            "settings": {"key", "value"}}


def _json_or(text, default):
    """A stored JSON value, or `default` when the row was damaged (logged, never raised)."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        log.warning("a damaged JSON value in the chat database was read as %r: %.80r", default, text)
        return default
    return value if isinstance(value, type(default)) else default


@dataclass
class ChatSettings:
    """Per-conversation prompt and sampling settings (GenerationParams plus the system prompt)."""
    system_prompt: str = ""
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    max_new_tokens: int = 512
    seed: int | None = None
    context_overflow: str = "middle"        # app.context_policy.POLICIES: what goes when the chat outgrows the context
    structured_output: str = ""             # "": off; "json": any JSON object; else a JSON Schema the answer follows

    @classmethod
    def from_dict(cls, data: dict) -> "ChatSettings":
        """Known keys whose values have the right type; anything else keeps its default."""
        defaults = cls()
        known = {}
        for name, value in data.items():
            if name not in cls.__dataclass_fields__:
                continue
            default = getattr(defaults, name)
            if _fits(value, default) or (name == "seed" and (value is None or _fits(value, 0))):
                known[name] = float(value) if isinstance(default, float) else value
        return cls(**known)


def _fits(value, default) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


@dataclass
class Message:
    id: int
    conversation_id: int
    role: str
    content: str
    state: str = "done"
    stats: dict = field(default_factory=dict)
    created_at: float = 0.0


@dataclass
class Conversation:
    id: int
    title: str
    created_at: float
    updated_at: float
    settings: ChatSettings


class Store:
    def __init__(self, path: Path | str, connection: sqlite3.Connection | None = None):
        """Open (or create) the database at `path`; `connection` instead: use that one (an in-memory copy)."""
        self.path = Path(path)
        self.is_closed = False
        self.is_read_only = connection is not None    # a copy: nothing reaches the file at `path`
        if connection is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # autocommit; one statement = one txn
            connection = sqlite3.connect(str(self.path), isolation_level=None, timeout=BUSY_TIMEOUT_S)
        self._db = connection
        self._saver: StreamSaver | None = None
        try:
            self._prepare()
        except BaseException:
            connection.close()
            raise

    @classmethod
    def in_memory(cls, path: Path | str) -> "Store":
        """An empty store that saves nothing (`path` is only the name it reports)."""
        return cls(path, connection=sqlite3.connect(":memory:", isolation_level=None))

    @classmethod
    def read_only_copy(cls, path: Path | str) -> "Store":
        """An in-memory copy of the database at `path` (empty when it cannot be read): the app works,
        nothing is saved. For a file that is read-only or locked by another program."""
        path = Path(path)
        for query in ("mode=ro", "immutable=1"):     # immutable: a read-only folder cannot hold the WAL index
            memory = sqlite3.connect(":memory:", isolation_level=None)
            try:
                source = sqlite3.connect(f"{path.resolve().as_uri()}?{query}", uri=True, timeout=BUSY_TIMEOUT_S)
                try:
                    source.backup(memory)
                finally:
                    source.close()
                return cls(path, connection=memory)
            except (sqlite3.Error, OSError, ValueError) as exc:
                memory.close()
                log.warning("reading %s with %s failed: %s", path, query, exc)
        return cls.in_memory(path)

    def _prepare(self) -> None:
        # checks first, so a file that is not ours is left byte for byte as it was
        verdict = self._db.execute("PRAGMA quick_check").fetchone()[0]
        if verdict != "ok":
            raise sqlite3.DatabaseError(f"database disk image is malformed ({verdict})")
        for table, columns in _COLUMNS.items():     # an existing table must be ours (not another program's)
            found = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            if found and not columns <= found:
                raise sqlite3.DatabaseError(f"the {table} table lacks columns {sorted(columns - found)}")
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")    # WAL + NORMAL: durable across app crashes
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(_SCHEMA)
        self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self._db.execute("UPDATE messages SET state='interrupted' WHERE state='streaming'")

    def close(self) -> None:
        if self._saver is not None:
            self._saver.close()
        self._db.close()
        self.is_closed = True

    # conversations -------------------------------------------------------------------------
    def create_conversation(self, title: str = "New chat", settings: ChatSettings | None = None) -> Conversation:
        now = time.time()
        settings = settings or ChatSettings()
        cur = self._db.execute(
            "INSERT INTO conversations(title, created_at, updated_at, settings) VALUES (?,?,?,?)",
            (title, now, now, json.dumps(settings.__dict__)))
        return Conversation(cur.lastrowid, title, now, now, settings)

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self._db.execute("SELECT id, title, created_at, updated_at, settings FROM conversations WHERE id=?",
                               (conversation_id,)).fetchone()
        return self._conversation(row) if row else None

    def conversations(self, search: str = "") -> list[Conversation]:
        """Newest first; `search` matches the title or any message text (case-insensitive)."""
        query = "SELECT id, title, created_at, updated_at, settings FROM conversations"
        args: tuple = ()
        if search.strip():
            pattern = f"%{search.strip()}%"
            query += (" WHERE title LIKE ? OR id IN (SELECT conversation_id FROM messages WHERE content LIKE ?)")
            args = (pattern, pattern)
        rows = self._db.execute(query + " ORDER BY updated_at DESC, id DESC", args).fetchall()
        return [self._conversation(r) for r in rows]

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self._db.execute("UPDATE conversations SET title=? WHERE id=?", (title.strip() or "Untitled", conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        self._db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    def set_chat_settings(self, conversation_id: int, settings: ChatSettings) -> None:
        self._db.execute("UPDATE conversations SET settings=? WHERE id=?",
                         (json.dumps(settings.__dict__), conversation_id))

    def touch(self, conversation_id: int) -> None:
        self._db.execute("UPDATE conversations SET updated_at=? WHERE id=?", (time.time(), conversation_id))

    # messages ------------------------------------------------------------------------------
    def add_message(self, conversation_id: int, role: str, content: str, state: str = "done",
                    stats: dict | None = None) -> Message:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO messages(conversation_id, role, content, state, stats, created_at) VALUES (?,?,?,?,?,?)",
            (conversation_id, role, content, state, json.dumps(stats or {}), now))
        self.touch(conversation_id)
        return Message(cur.lastrowid, conversation_id, role, content, state, dict(stats or {}), now)

    def save_streaming(self, message_id: int, content: str) -> None:
        """The streaming answer's text so far, saved in batches off the caller's thread (a copy of the file
        saves nothing until the answer's final update_message)."""
        if self.is_read_only:
            return
        if self._saver is None:
            self._saver = StreamSaver(self.path, BUSY_TIMEOUT_S)
        self._saver.update(message_id, content)

    def wait_saved(self) -> None:
        """Returns once the streaming text handed over so far is in the file."""
        if self._saver is not None:
            self._saver.flush()

    def update_message(self, message_id: int, content: str | None = None, state: str | None = None,
                       stats: dict | None = None) -> None:
        self.wait_saved()               # the batched text first, so this write is the last
        sets, args = [], []
        for column, value in (("content", content), ("state", state),
                              ("stats", None if stats is None else json.dumps(stats))):
            if value is not None:
                sets.append(f"{column}=?")
                args.append(value)
        if sets:
            self._db.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id=?", (*args, message_id))

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self._db.execute(
            "SELECT id, conversation_id, role, content, state, stats, created_at FROM messages "
            "WHERE conversation_id=? ORDER BY id", (conversation_id,)).fetchall()
        return [Message(r[0], r[1], r[2], r[3], r[4], _json_or(r[5], {}), r[6]) for r in rows]

    def delete_messages_from(self, conversation_id: int, message_id: int) -> None:
        """Delete a message and everything after it (edit-and-resend, regenerate)."""
        self._db.execute("DELETE FROM messages WHERE conversation_id=? AND id>=?", (conversation_id, message_id))

    # settings ------------------------------------------------------------------------------
    def get_setting(self, key: str, default=None):
        """The stored value; ValueError when the stored text is not JSON (the caller says what it uses instead)."""
        row = self._db.execute("SELECT value FROM settings WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def set_setting(self, key: str, value) -> None:
        self._db.execute("INSERT INTO settings(key, value) VALUES (?, ?) "
                         "ON CONFLICT(key) DO UPDATE SET value=excluded.value", (key, json.dumps(value)))

    @staticmethod
    def _conversation(row) -> Conversation:
        return Conversation(row[0], row[1], row[2], row[3], ChatSettings.from_dict(_json_or(row[4], {})))
