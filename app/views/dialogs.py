"""Dialogs: one-sentence errors, per-conversation settings, app settings."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFileDialog, QFormLayout,
                               QHBoxLayout, QLabel, QLineEdit, QMessageBox, QPlainTextEdit, QProgressBar,
                               QPushButton, QSpinBox, QVBoxLayout, QWidget)

from ..settings import AppSettings
from ..store import ChatSettings

RANDOM_SEED = -1


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


class ChatSettingsDialog(QDialog):
    def __init__(self, settings: ChatSettings, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Chat settings")
        form = QFormLayout(self)
        self.system_prompt = QPlainTextEdit(settings.system_prompt)
        self.system_prompt.setPlaceholderText("You are a helpful assistant.")
        self.system_prompt.setMinimumHeight(90)
        self.temperature = QDoubleSpinBox(minimum=0.0, maximum=2.0, singleStep=0.05, decimals=2,
                                          value=settings.temperature)
        self.temperature.setToolTip("0 picks the most likely token every time (greedy).")
        self.top_p = QDoubleSpinBox(minimum=0.05, maximum=1.0, singleStep=0.05, decimals=2, value=settings.top_p)
        self.top_k = QSpinBox(minimum=0, maximum=1000, value=settings.top_k)
        self.top_k.setSpecialValueText("off")
        self.max_new_tokens = QSpinBox(minimum=1, maximum=32768, singleStep=64, value=settings.max_new_tokens)
        self.seed = QSpinBox(minimum=RANDOM_SEED, maximum=2**31 - 1)
        self.seed.setSpecialValueText("random")
        self.seed.setValue(RANDOM_SEED if settings.seed is None else settings.seed)
        form.addRow("System prompt", self.system_prompt)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-p", self.top_p)
        form.addRow("Top-k", self.top_k)
        form.addRow("Max new tokens", self.max_new_tokens)
        form.addRow("Seed", self.seed)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    def value(self) -> ChatSettings:
        seed = self.seed.value()
        return ChatSettings(self.system_prompt.toPlainText(), round(self.temperature.value(), 2),
                            round(self.top_p.value(), 2), self.top_k.value(), self.max_new_tokens.value(),
                            None if seed == RANDOM_SEED else seed)


class AppSettingsDialog(QDialog):
    def __init__(self, settings: AppSettings, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setMinimumWidth(520)
        form = QFormLayout(self)
        row = QHBoxLayout()
        self.models_dir = QLineEdit(str(settings.models_path()))
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        row.addWidget(self.models_dir, 1)
        row.addWidget(browse)
        form.addRow("Models folder", row)
        self.device = QComboBox()
        self.device.addItems(["auto", "cpu", "cuda"])
        self.device.setCurrentText(settings.device)
        form.addRow("Device", self.device)
        self.vram_budget = QLineEdit(settings.vram_budget)
        self.vram_budget.setPlaceholderText("engine default, e.g. 6GB")
        form.addRow("VRAM budget", self.vram_budget)
        self.ram_cache = QLineEdit(settings.ram_cache)
        self.ram_cache.setPlaceholderText("engine default, e.g. 16GB")
        form.addRow("RAM cache", self.ram_cache)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)
        self._settings = settings

    def _browse(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Models folder", self.models_dir.text())
        if path:
            self.models_dir.setText(path)

    def value(self) -> AppSettings:
        """A copy of the settings with this dialog's fields; sizes are checked by the caller."""
        from dataclasses import replace
        return replace(self._settings, models_dir=self.models_dir.text().strip(), device=self.device.currentText(),
                       vram_budget=self.vram_budget.text().strip(), ram_cache=self.ram_cache.text().strip())
