"""One writer per destination: a repack destination or a cached repack is built by one process at a time.

A second process waits, says why (the `say` callback, and the "sluice" log that the CLI prints),
and then finds the finished result. The lock is a file beside the destination (`.NAME.lock`),
held through the `filelock` library, so it is released when its holder dies, even by kill -9.
"""
from __future__ import annotations

import logging
import os
import threading
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from engine.errors import SluiceError, fs_error_sentence

POLL_S = 0.5
log = logging.getLogger("sluice.locks")


def lock_path(destination: Path) -> Path:
    return destination.with_name(f".{destination.name}.lock")


@contextmanager
def exclusive(destination: Path, what: str, say=None, cancel_event: threading.Event | None = None,
              on_cancel=None):
    """Hold the lock of `destination`; yields True when another process held it first (we waited).

    `what` completes "Another Sluice process is ... ": e.g. "repacking into '/x'". While waiting,
    `cancel_event` is checked every POLL_S and `on_cancel()` raises (the caller's cancel exception)."""
    _check_writable(lock_path(destination))
    lock = FileLock(str(lock_path(destination)), is_singleton=True)   # re-entrant within one thread
    waited = False
    try:
        lock.acquire(timeout=0)
    except Timeout:
        waited = True
        message = f"Another Sluice process is {what}; waiting for it to finish"
        log.warning(message)
        if say is not None:
            say(message)
        while True:
            if cancel_event is not None and cancel_event.is_set() and on_cancel is not None:
                on_cancel()
            try:
                lock.acquire(timeout=POLL_S)
                break
            except Timeout:
                continue
    try:
        yield waited
    finally:
        lock.release()


def _check_writable(path: Path) -> None:
    """filelock takes a lock file it cannot create for one another process holds, and would wait forever."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o644))
    except OSError as exc:
        sentence = fs_error_sentence(exc, path.parent)
        raise SluiceError(sentence or f"'{path.parent}' cannot be written ({exc.strerror or exc}); "
                                      "choose another destination.") from None
