"""A one-line label that ends in "…" when it is narrower than its text, with the whole text in its tooltip."""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel

MIN_CHARS = 12          # what it keeps at its narrowest: enough to recognise the text


class ElidedLabel(QLabel):
    """text() stays the whole text (tests and callers read it); only the painting is cut."""

    def __init__(self, text: str = "", parent=None):
        super().__init__(text, parent)
        self.setToolTip(text)

    def setText(self, text: str) -> None:
        super().setText(text)
        self.setToolTip(text)

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        return QSize(min(hint.width(), self.fontMetrics().averageCharWidth() * MIN_CHARS), hint.height())

    def shown_text(self) -> str:
        """What the label shows at its width: the text, or its start and "…"."""
        return self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, self.contentsRect().width())

    def paintEvent(self, _event) -> None:
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(self.contentsRect(), int(self.alignment()), self.shown_text())
