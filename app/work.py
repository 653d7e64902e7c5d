"""The app's one background-work primitive: a Work runs one blocking call off the GUI thread.

`fn(report, stop_event)` runs on a worker thread: `report(x)` becomes the `progress` signal, the
return value `result`, an exception `failed` with one sentence, a stop the user asked for
`stopped`; `finished` comes last, always. A Work object lives on the GUI thread, so every slot
connected to it (lambdas included) runs there, and the page that started it never blocks.

Where it runs: `Work.start()` gives it a thread of its own (the setup wizards' searches, downloads
and repacks); `WorkThread.submit(work)` runs it in turn on one long-lived thread (the engine thread:
loads, generations, the demo build, estimates).
"""
from __future__ import annotations

import logging
import threading

from PySide6.QtCore import QObject, QThread, Signal, Slot

log = logging.getLogger("sluice.app")


class WorkStopped(Exception):
    """Raised by a call that noticed its stop_event (e.g. from its progress callback): ends as `stopped`."""


def user_message(exc: BaseException, fallback: str = "The engine failed") -> str:
    """One sentence for a dialog: SluiceError texts (and a full disk, memory running out) as they are,
    anything else as `fallback (first line of the error)` pointing to the log."""
    from engine import user_sentence
    known = user_sentence(exc)
    if known:
        return known
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{fallback} ({detail}); the details are in the log file."


def log_failure(exc: BaseException, message: str, *args) -> None:
    """User errors get one log line; anything else its traceback (the dialog points to the log)."""
    from engine import SluiceError
    if isinstance(exc, SluiceError):
        log.warning(message + ": %s", *args, exc)
    else:
        log.exception(message, *args)


def _is_stop(exc: BaseException) -> bool:
    """The ways a call ends because its stop_event was set."""
    from engine.setup import RepackCancelled
    from engine.setup import DownloadStopped
    return isinstance(exc, (WorkStopped, DownloadStopped, RepackCancelled))


_LIVE: set[_OwnThread] = set()     # threads of started Works, kept until they have really ended


class Work(QObject):
    progress = Signal(object)      # what fn reported
    result = Signal(object)        # what fn returned
    failed = Signal(str)           # one sentence for a dialog
    stopped = Signal()             # fn ended because stop() was asked
    finished = Signal()            # after any of the three above

    def __init__(self, fn, name: str = "work", fallback: str = "Something went wrong"):
        """`name` is for the log; `fallback` opens the sentence shown for an unexpected error."""
        super().__init__()
        self._fn = fn
        self.name = name
        self._fallback = fallback
        self.stop_event = threading.Event()
        self._thread: _OwnThread | None = None

    def on(self, *, progress=None, result=None, failed=None, stopped=None) -> Work:
        """Connects the slots given (each runs on the GUI thread); returns the Work, to start or submit."""
        for signal, slot in ((self.progress, progress), (self.result, result), (self.failed, failed),
                             (self.stopped, stopped)):
            if slot is not None:
                signal.connect(slot)
        return self

    def stop(self) -> None:
        """Ask the call to stop (it checks stop_event, or its report raises WorkStopped); never waits."""
        self.stop_event.set()

    def run(self) -> None:
        """Run the call on this (worker) thread and emit its outcome."""
        try:
            value = self._fn(self.progress.emit, self.stop_event)
        except Exception as exc:
            if _is_stop(exc):
                self.stopped.emit()
            else:
                log_failure(exc, "%s failed", self.name)
                self.failed.emit(user_message(exc, self._fallback))
        else:
            self.result.emit(value)
        finally:
            self.finished.emit()

    # a thread of its own ------------------------------------------------------------------------
    def start(self) -> None:
        """Run on a new thread, owned by this module until it ends: a page destroyed meanwhile (a window
        closed any way at all) never destroys a running QThread, which Qt answers with an abort."""
        self._thread = _OwnThread(self)
        _LIVE.add(self._thread)
        self._thread.start()

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.isRunning()

    def stop_and_wait(self, timeout_ms: int = 10_000) -> None:
        """Stop and wait for its thread (never leave a QThread running at close)."""
        if self.is_running():
            self.stop()
            self._thread.wait(timeout_ms)


def stop_and_wait(work: Work | None, timeout_ms: int = 10_000) -> None:
    if work is not None:
        work.stop_and_wait(timeout_ms)


class _OwnThread(QThread):
    def __init__(self, work: Work):
        super().__init__()
        self._work = work
        self.finished.connect(self._release)        # queued to the GUI thread, after run() returned

    def run(self) -> None:
        self._work.run()

    def _release(self) -> None:
        self.wait()                 # `finished` is emitted just before the thread really ends
        _LIVE.discard(self)


class _Runner(QObject):
    """Lives on a WorkThread's thread; its slot runs each submitted Work there, in order."""
    done = Signal(object)

    @Slot(object)
    def run(self, work: Work) -> None:
        work.run()
        self.done.emit(work)            # delivered after the Work's own signals: then it may be dropped


class WorkThread(QObject):
    """One long-lived named thread that runs submitted Works one after another (the engine thread)."""
    _submitted = Signal(object)

    def __init__(self, name: str, parent: QObject | None = None):
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName(name)
        self._runner = _Runner()
        self._runner.moveToThread(self.thread)
        self._submitted.connect(self._runner.run)       # queued: the runner lives on the thread
        self._runner.done.connect(self._on_done)         # queued back to the GUI thread
        self.thread.finished.connect(self._runner.deleteLater)
        self._pending: set[Work] = set()                 # a submitted Work lives until its signals are delivered
        self.thread.start()

    def submit(self, work: Work) -> Work:
        self._pending.add(work)
        self._submitted.emit(work)
        return work

    def _on_done(self, work: Work) -> None:
        self._pending.discard(work)

    def quit_and_wait(self, timeout_ms: int) -> bool:
        """End after the Works already submitted; True if the thread ended within the timeout."""
        self.thread.quit()
        return self.thread.wait(timeout_ms)
