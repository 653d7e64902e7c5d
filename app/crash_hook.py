"""Uncaught exceptions in the GUI (and in any thread) go to sluice.log with their traceback and to a
dialog with one sentence; the app keeps running, and its chats are already saved as they stream."""
from __future__ import annotations

import logging
import sys
import threading

from PySide6.QtCore import QObject, Signal

from engine import user_sentence

log = logging.getLogger("sluice.crash")


def sentence_for(exc: BaseException, log_file) -> str:
    known = user_sentence(exc)
    if known:
        return known
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    what = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    return (f"Something went wrong inside Sluice ({what}); your chats are saved. "
            f"The details are in {log_file}.")


class CrashReporter(QObject):
    """Installed once; `report` is emitted from any thread and shown on the GUI thread."""
    report = Signal(str)

    def __init__(self, show, log_file):
        super().__init__()
        self.log_file = log_file
        self.report.connect(show)            # queued when emitted from another thread
        self._previous = (sys.excepthook, threading.excepthook)
        sys.excepthook = self._on_exception
        threading.excepthook = lambda args: self._on_exception(args.exc_type, args.exc_value, args.exc_traceback)

    def _on_exception(self, exc_type, exc, tb) -> None:
        if issubclass(exc_type, KeyboardInterrupt):
            self._previous[0](exc_type, exc, tb)
            return
        log.error("uncaught exception", exc_info=(exc_type, exc, tb))
        self.report.emit(sentence_for(exc, self.log_file))

    def uninstall(self) -> None:
        sys.excepthook, threading.excepthook = self._previous
