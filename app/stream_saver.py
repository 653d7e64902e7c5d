"""Saves a streaming answer's text from a thread of its own, in batches: the GUI thread only hands over text.

The first chunk is written at once, later ones at most every `interval_s` (the latest text wins, earlier ones
are never written), so a crash loses at most the last `interval_s` plus one write. The saver has its own
SQLite connection to the file (WAL lets it write beside the GUI thread's). Qt-free.
"""
from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

INTERVAL_S = 0.5
log = logging.getLogger("sluice.store")


class StreamSaver:
    def __init__(self, path: Path, busy_timeout_s: float, interval_s: float = INTERVAL_S):
        self.interval_s = interval_s
        self.num_writes = 0
        self._cond = threading.Condition()
        self._pending: tuple[int, str] | None = None
        self._is_writing = self._is_urgent = self._is_closed = False
        self._thread = threading.Thread(target=self._run, args=(str(path), busy_timeout_s), name="sluice-stream-saver",
                                        daemon=True)
        self._thread.start()

    def update(self, message_id: int, content: str) -> None:
        """The message's whole text so far; returns at once (no I/O on the caller's thread)."""
        with self._cond:
            self._pending = (message_id, content)
            self._cond.notify_all()

    def flush(self) -> None:
        """Returns once the text handed over so far is in the file (before the answer's final write)."""
        with self._cond:
            self._is_urgent = True
            self._cond.notify_all()
            while self._pending is not None or self._is_writing:
                self._cond.wait()

    def close(self) -> None:
        self.flush()
        with self._cond:
            self._is_closed = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self, path: str, busy_timeout_s: float) -> None:
        db = sqlite3.connect(path, isolation_level=None, timeout=busy_timeout_s)
        try:
            while (item := self._next()) is not None:
                self._write(db, *item)
                self._rest()
        finally:
            db.close()

    def _next(self) -> tuple[int, str] | None:
        """The latest text to write, or None once closed."""
        with self._cond:
            while self._pending is None and not self._is_closed:
                self._cond.wait()
            item, self._pending = self._pending, None
            self._is_writing = item is not None
            return item

    def _write(self, db: sqlite3.Connection, message_id: int, content: str) -> None:
        try:     # only while streaming: the answer's final write is never overwritten
            db.execute("UPDATE messages SET content=? WHERE id=? AND state='streaming'", (content, message_id))
            self.num_writes += 1
        except sqlite3.Error as exc:      # the next write carries the whole text again
            log.warning("saving the streaming answer failed: %s", exc)
        with self._cond:
            self._is_writing = False
            self._cond.notify_all()

    def _rest(self) -> None:
        """Waits out the interval, unless a flush or close asks for the text now."""
        deadline = time.monotonic() + self.interval_s
        with self._cond:
            while not (self._is_urgent or self._is_closed) and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            self._is_urgent = False
