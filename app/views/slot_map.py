"""VRAM slot map: one row of cells per slot bank, coloured by state; tooltip names the layer and expert."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

STATE_COLORS = {
    "empty": QColor("#9ca3af"),
    "loading": QColor("#f59e0b"),
    "ready": QColor("#10b981"),
    "computing": QColor("#3b82f6"),
}
MAX_COLUMNS = 16      # a bank with more slots wraps onto further lines
CELL_PX = 18
GAP_PX = 3
BANK_GAP_PX = 8
LABEL_PX = 46
NO_MODEL_TEXT = "No slots yet: load a model."
REMOTE_TEXT = "No slots here: a remote model runs on its own server."


class SlotMap(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.slots: list[dict] = []
        self.empty_text = NO_MODEL_TEXT          # shown while there are no slots
        self._cells: list[tuple[QRectF, dict]] = []
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMouseTracking(True)
        self._relayout()

    def set_slots(self, slots: list[dict]) -> None:
        if slots == self.slots:
            return
        same_shape = [(s.get("bank"), s.get("slot")) for s in slots] == [(s.get("bank"), s.get("slot"))
                                                                           for s in self.slots]
        self.slots = list(slots)
        if not same_shape:
            self._relayout()
        else:
            self._cells = [(rect, slot) for (rect, _), slot in zip(self._cells, self._sorted())]
        self.update()

    def _sorted(self) -> list[dict]:
        return sorted(self.slots, key=lambda s: (s.get("bank", 0), s.get("slot", 0)))

    def _relayout(self) -> None:
        self._cells = []
        y = 0.0
        banks: dict[int, list[dict]] = {}
        for slot in self._sorted():
            banks.setdefault(slot.get("bank", 0), []).append(slot)
        self._bank_rows: list[tuple[int, float]] = []
        for bank, bank_slots in sorted(banks.items()):
            self._bank_rows.append((bank, y))
            for i, slot in enumerate(bank_slots):
                row, col = divmod(i, MAX_COLUMNS)
                rect = QRectF(LABEL_PX + col * (CELL_PX + GAP_PX), y + row * (CELL_PX + GAP_PX), CELL_PX, CELL_PX)
                self._cells.append((rect, slot))
            num_rows = (len(bank_slots) + MAX_COLUMNS - 1) // MAX_COLUMNS
            y += num_rows * (CELL_PX + GAP_PX) + BANK_GAP_PX
        self.setFixedHeight(max(int(y), CELL_PX + 4))
        self.updateGeometry()

    def sizeHint(self) -> QSize:
        return QSize(LABEL_PX + MAX_COLUMNS * (CELL_PX + GAP_PX), self.height())

    def paintEvent(self, _event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        text_color = self.palette().color(self.foregroundRole())
        if not self._cells:
            painter.setPen(text_color)
            painter.drawText(self.rect(), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, self.empty_text)
            return
        painter.setPen(text_color)
        for bank, y in self._bank_rows:
            painter.drawText(QRectF(0, y, LABEL_PX - 4, CELL_PX), Qt.AlignmentFlag.AlignVCenter, f"bank {bank}")
        painter.setPen(Qt.PenStyle.NoPen)
        for rect, slot in self._cells:
            painter.setBrush(STATE_COLORS.get(slot.get("state", "empty"), STATE_COLORS["empty"]))
            painter.drawRoundedRect(rect, 3, 3)

    def cell_at(self, x: float, y: float) -> dict | None:
        for rect, slot in self._cells:
            if rect.contains(x, y):
                return slot
        return None

    @staticmethod
    def describe(slot: dict) -> str:
        where = f"bank {slot.get('bank')}, slot {slot.get('slot')}"
        if slot.get("layer") is None or slot.get("state", "empty") == "empty":
            return f"{where}: empty"
        return f"{where}: layer {slot['layer']}, expert {slot.get('expert')} ({slot.get('state')})"

    def event(self, event) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            slot = self.cell_at(event.position().x(), event.position().y()) if hasattr(event, "position") \
                else self.cell_at(event.pos().x(), event.pos().y())
            if slot is not None:
                QToolTip.showText(event.globalPos(), self.describe(slot), self)
            else:
                QToolTip.hideText()
            return True
        return super().event(event)
