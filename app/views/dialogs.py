"""Small dialogs: one-sentence errors and the progress of long jobs (settings: settings_dialog.py,
chat_settings_dialog.py)."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QMessageBox, QProgressBar, QVBoxLayout, QWidget


class JobDialog(QDialog):
    """Window-modal progress of a long job (repack, demo build) with Cancel.

    Not a QProgressDialog: its setValue() runs a nested event loop when modal, in which the job's
    "finished" can arrive and delete the dialog under the caller.
    """
    canceled = Signal()

    def __init__(self, label: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Sluice")
        self.setWindowModality(Qt.WindowModality.WindowModal)
        self.setMinimumWidth(440)
        layout = QVBoxLayout(self)
        self.label = QLabel(label)
        self.label.setWordWrap(True)
        self.detail = QLabel("")
        self.bar = QProgressBar()
        self.bar.setRange(0, 0)                   # busy until the first progress report
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        buttons.rejected.connect(self.reject)
        for widget in (self.label, self.bar, self.detail, buttons):
            layout.addWidget(widget)

    def set_progress(self, done: int, total: int, message: str = "") -> None:
        if total > 0:
            self.bar.setRange(0, total)
            self.bar.setValue(min(done, total))
        if message:
            self.detail.setText(message)

    def reject(self) -> None:                      # Cancel button and Esc: the job stops, then closes us
        self.detail.setText("Cancelling…")
        self.canceled.emit()


def error_box(parent: QWidget, sentence: str, title: str = "Sluice") -> QMessageBox:
    """A window-modal warning with one sentence; opened without blocking (the app stays usable)."""
    box = QMessageBox(QMessageBox.Icon.Warning, title, sentence, QMessageBox.StandardButton.Ok, parent)
    box.setObjectName("errorDialog")
    box.open()
    return box
