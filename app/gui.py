"""Start the desktop app (imported only when the GUI opens, so the CLI never loads Qt).

The window opens whatever the data folder holds (app.startup): damage is moved aside or read
around, and said in a dialog; uncaught exceptions go to sluice.log and a dialog (app.crash_hook).
"""
from __future__ import annotations

import logging
import sys


def _setup_logging() -> str:
    """Log to sluice.log in the data folder, or to stderr when that cannot be written; returns where."""
    from .paths import log_path
    path = log_path()
    try:
        handler: logging.Handler = logging.FileHandler(path, encoding="utf-8")
        where = str(path)
    except OSError as exc:
        handler, where = logging.StreamHandler(sys.stderr), "the terminal (standard error)"
        print(f"sluice: cannot write the log file {path} ({exc.strerror}); logging to standard error.",
              file=sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("sluice")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return where


def create_application(argv: list[str] | None = None):
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from . import paths
    app = QApplication.instance() or QApplication(argv if argv is not None else sys.argv[:1])
    app.setApplicationName("sluice")
    app.setApplicationDisplayName(paths.APP_NAME)
    app.setOrganizationDomain("sluice.github.io")
    app.setDesktopFileName(paths.APP_ID)          # matches packaging/sluice.desktop (Wayland app id)
    app.setWindowIcon(QIcon(str(paths.icon_path())))
    return app


def open_main_window(**window_options):
    """The main window on the data folder as it is, its startup notices shown over it."""
    from . import paths
    from .startup import start
    from .views.main_window import MainWindow
    from .views.notice_dialog import show_notices
    startup = start(paths.database_path())
    window = MainWindow(store=startup.store, **window_options)
    if startup.store.is_read_only:
        window.setWindowTitle(f"{paths.APP_NAME} (read-only: chats are not saved)")
    window.show()
    window.startup_notices = show_notices(window, startup.notices)
    return window


def run_gui(exit_after_ms: int | None = None) -> int:
    """The app until its window closes; exit_after_ms: close it after that long (the launcher's smoke test)."""
    log_file = _setup_logging()
    from .paths import data_dir
    logging.getLogger("sluice").info("Sluice starting (data folder %s)", data_dir())
    app = create_application()
    from PySide6.QtCore import QTimer

    from .crash_hook import CrashReporter
    from .views.dialogs import error_box
    window = None
    reporter = CrashReporter(lambda sentence: error_box(window, sentence, "Sluice: unexpected error"), log_file)
    window = open_main_window()
    app.aboutToQuit.connect(window.shutdown)
    app.aboutToQuit.connect(reporter.uninstall)
    if exit_after_ms is not None:
        QTimer.singleShot(exit_after_ms, window.close)
    return app.exec()
