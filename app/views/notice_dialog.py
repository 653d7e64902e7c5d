"""Startup notices (a damaged or read-only chat history, reset settings, a models folder problem) and
the dialog for an unexpected error: what happened, what it means, where the file is."""
from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import QUrl, Qt
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QGridLayout, QMessageBox, QSizePolicy, QSpacerItem, QWidget

from ..startup import Notice

MIN_WIDTH_PX = 560


def notice_box(parent: QWidget | None, notice: Notice) -> QMessageBox:
    """A window-modal warning for one notice, opened without blocking; "Show in folder" when it names a path."""
    box = QMessageBox(QMessageBox.Icon.Warning, notice.title, "", QMessageBox.StandardButton.Ok, parent)
    box.setObjectName(f"notice_{notice.kind}")
    box.setTextFormat(Qt.TextFormat.RichText)
    box.setText(f"<b>{html.escape(notice.title)}</b>")
    body = f"<p>{html.escape(notice.text)}</p>"
    if notice.path is not None:
        body += f"<p><code style='white-space: pre'>{html.escape(str(notice.path))}</code></p>"
    box.setInformativeText(body)
    box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)   # the path can be copied
    if notice.path is not None:
        show = box.addButton("Show in folder", QMessageBox.ButtonRole.ActionRole)
        folder = Path(notice.path) if Path(notice.path).is_dir() else Path(notice.path).parent
        show.clicked.connect(lambda: QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder))))
    _set_min_width(box, MIN_WIDTH_PX)
    box.open()
    return box


def _set_min_width(box: QMessageBox, width: int) -> None:
    """QMessageBox ignores setMinimumWidth; a spacer across its grid is the known way to widen it."""
    layout = box.layout()
    if isinstance(layout, QGridLayout):
        spacer = QSpacerItem(width, 0, QSizePolicy.Policy.Minimum, QSizePolicy.Policy.Expanding)
        layout.addItem(spacer, layout.rowCount(), 0, 1, layout.columnCount())


def show_notices(parent: QWidget, notices: list[Notice]) -> list[QMessageBox]:
    """One box per notice, the first on top; returns them (tests read them)."""
    return [notice_box(parent, notice) for notice in reversed(notices)][::-1]
