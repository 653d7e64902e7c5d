"""The quant chooser shared by both wizards: one row per quant with size, bytes per token, speed, verdict."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem

from .common import VERDICT_COLORS, format_speed

COLUMNS = ("Quant", "Model size", "Experts per token", "Moved per token", "Predicted speed", "Verdict")
QUANT_NOTES = {"bf16": "bf16 (exact)", "fp8": "fp8 (near exact)", "int8": "int8 (near exact)",
               "nvfp4": "nvfp4 (smallest)",
               "mxfp4": "mxfp4 (smallest; gpt-oss as shipped)"}


class QuantTable(QTableWidget):
    quant_changed = Signal(str)

    def __init__(self, parent=None):
        super().__init__(0, len(COLUMNS), parent)
        self.setHorizontalHeaderLabels(COLUMNS)
        self.verticalHeader().setVisible(False)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        header = self.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(len(COLUMNS) - 1, QHeaderView.ResizeMode.Stretch)
        self.estimates: dict = {}
        self.itemSelectionChanged.connect(lambda: self.quant_changed.emit(self.quant() or ""))

    def set_estimates(self, estimates: dict, preferred: str = "fp8") -> None:
        from engine import format_size
        self.estimates = estimates
        self.setRowCount(len(estimates))
        for row, (quant, est) in enumerate(estimates.items()):
            cells = (QUANT_NOTES.get(quant, quant), format_size(est.repacked_bytes),
                     format_size(est.expert_bytes_per_token), format_size(est.bytes_per_token),
                     format_speed(est.tok_s), est.verdict)
            if est.verdict == "unavailable":          # no sizes or speed: the reason says why
                cells = (QUANT_NOTES.get(quant, quant), "—", "—", "—", "—", f"unavailable: {est.reason}")
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setData(Qt.ItemDataRole.UserRole, quant)
                if col in (1, 2, 3, 4):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if col == 5:
                    item.setForeground(QColor(VERDICT_COLORS[est.verdict]))
                    item.setToolTip(est.reason)
                self.setItem(row, col, item)
        usable = [q for q, e in estimates.items() if e.is_usable]
        choice = preferred if preferred in usable else (usable[0] if usable else preferred)
        self.select(choice)
        height = self.horizontalHeader().height() + sum(self.rowHeight(r) for r in range(self.rowCount())) + 4
        self.setFixedHeight(height)

    def select(self, quant: str) -> None:
        for row in range(self.rowCount()):
            if self.item(row, 0).data(Qt.ItemDataRole.UserRole) == quant:
                self.selectRow(row)

    def quant(self) -> str | None:
        rows = self.selectionModel().selectedRows() if self.selectionModel() else []
        return self.item(rows[0].row(), 0).data(Qt.ItemDataRole.UserRole) if rows else None

    def current(self):
        quant = self.quant()
        return self.estimates.get(quant) if quant else None
