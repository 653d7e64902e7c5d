"""One threading primitive for the setup wizards: run a blocking engine call on a QThread.

`fn(report, stop_event)` runs off the GUI thread; `report(obj)` becomes the `progress` signal,
the return value `finished`, a SluiceError (or any failure) `failed` with one sentence, and
DownloadStopped / RepackCancelled after `stop()` become `stopped`. Signals arrive on the GUI thread.
"""
from __future__ import annotations

import logging
import threading

from PySide6.QtCore import QThread, Signal

log = logging.getLogger("sluice.setup")


_LIVE: set[Task] = set()


class Task(QThread):
    """`parent` is accepted for symmetry but not used as the Qt parent: a started task is owned by
    this module until its thread has ended, so a page destroyed while it runs (a window closed any
    way at all) never destroys a running QThread, which Qt answers with an abort."""
    progress = Signal(object)
    finished_ok = Signal(object)
    failed = Signal(str)
    stopped = Signal()

    def __init__(self, fn, parent=None):
        super().__init__()
        self._fn = fn
        self.stop_event = threading.Event()
        self.finished.connect(self._release)        # queued to the GUI thread, after run() returned

    def start(self) -> None:
        _LIVE.add(self)
        super().start()

    def _release(self) -> None:
        self.wait()                 # `finished` is emitted just before the thread really ends
        _LIVE.discard(self)

    def stop(self) -> None:
        self.stop_event.set()

    def run(self) -> None:
        from engine import SluiceError
        from engine.hub.download import DownloadStopped
        try:
            result = self._fn(self.progress.emit, self.stop_event)
        except DownloadStopped:
            self.stopped.emit()
        except SluiceError as exc:
            if self.stop_event.is_set():      # e.g. RepackCancelled: the user asked for it
                self.stopped.emit()
            else:
                self.failed.emit(str(exc))
        except Exception as exc:              # a bug, not the user's doing: log it, show one sentence
            log.exception("setup task failed")
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.failed.emit(f"Something went wrong ({detail}); the details are in the log file.")
        else:
            self.finished_ok.emit(result)


def stop_and_wait(task: Task | None, timeout_ms: int = 10_000) -> None:
    """Ask a running task to stop and wait for its thread (never leave a QThread running at close)."""
    if task is not None and task.isRunning():
        task.stop()
        task.wait(timeout_ms)
