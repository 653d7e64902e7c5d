"""Start the desktop app (imported only when the GUI opens, so the CLI never loads Qt)."""
from __future__ import annotations

import logging
import os
import sys


def _setup_logging() -> None:
    from .paths import log_path
    handler = logging.FileHandler(log_path(), encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("sluice")
    root.addHandler(handler)
    root.setLevel(logging.INFO)


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


def run_gui() -> int:
    _setup_logging()
    app = create_application()
    from PySide6.QtCore import QTimer

    from .views.main_window import MainWindow
    window = MainWindow()
    window.show()
    app.aboutToQuit.connect(window.shutdown)
    # SLUICE_EXIT_AFTER_MS: close again after this many ms (smoke tests of the launcher's Exec line).
    exit_after_ms = os.environ.get("SLUICE_EXIT_AFTER_MS")
    if exit_after_ms:
        QTimer.singleShot(int(exit_after_ms), window.close)
    return app.exec()
