"""Light/dark following the system colour scheme (Qt >= 6.5 reports it; Fusion elsewhere)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QPalette

ERROR_COLOR = "#cf222e"         # a field's error under it (readable on light and dark)


def is_dark() -> bool:
    app = QGuiApplication.instance()
    if app is None:
        return False
    scheme = app.styleHints().colorScheme()
    if scheme == Qt.ColorScheme.Dark:
        return True
    if scheme == Qt.ColorScheme.Light:
        return False
    return app.palette().color(QPalette.ColorRole.Window).lightness() < 128


def muted_color() -> str:
    return "#8b949e" if is_dark() else "#6e7781"


def user_bubble_color() -> str:
    return "#1f2937" if is_dark() else "#eef2ff"
