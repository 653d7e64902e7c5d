"""Chat settings: system prompt, sampling, answer length, context overflow policy; named presets and
the defaults for new chats (kept through the controller: views never touch the store)."""
from __future__ import annotations

from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout, QHBoxLayout,
                               QInputDialog, QLabel, QLineEdit, QPlainTextEdit, QPushButton, QSpinBox, QVBoxLayout,
                               QWidget)

from engine import SluiceError
from engine.setup import check_setting

from ..context_policy import POLICIES
from ..store import ChatSettings
from . import theme

RANDOM_SEED = -1
MAX_NEW_TOKENS = 131_072      # beyond any context; the answer also ends when the context is full, and says so


class ChatSettingsDialog(QDialog):
    def __init__(self, settings: ChatSettings, parent: QWidget | None = None, controller=None):
        """controller: the ChatController that keeps presets and defaults (None: no preset row)."""
        super().__init__(parent)
        self.setWindowTitle("Chat settings")
        self.controller = controller
        form = QFormLayout(self)
        if controller is not None:
            form.addRow("Preset", self._presets_row())
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("None. Optional instructions the model follows in this chat "
                                              "(for example: answer in one paragraph).")
        self.system_prompt.setMinimumHeight(90)
        self.temperature = QDoubleSpinBox(minimum=0.0, maximum=2.0, singleStep=0.05, decimals=2)
        self.temperature.setToolTip("0 picks the most likely token every time (greedy).")
        self.top_p = QDoubleSpinBox(minimum=0.05, maximum=1.0, singleStep=0.05, decimals=2)
        self.top_k = QSpinBox(minimum=0, maximum=1000)
        self.top_k.setSpecialValueText("off")
        self.max_new_tokens = QSpinBox(minimum=1, maximum=MAX_NEW_TOKENS, singleStep=64)
        self.max_new_tokens.setGroupSeparatorShown(True)
        self.max_new_tokens.setToolTip("The answer also ends when the model's context is full; it then says so.")
        self.seed = QSpinBox(minimum=RANDOM_SEED, maximum=2**31 - 1)
        self.seed.setSpecialValueText("random")
        self.context_overflow = QComboBox()
        for key, label in POLICIES.items():
            self.context_overflow.addItem(label, key)
        self.context_overflow.setToolTip("What is left out when the chat grows longer than the model's context")
        form.addRow("System prompt", self.system_prompt)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-p", self.top_p)
        form.addRow("Top-k", self.top_k)
        form.addRow("Max new tokens", self.max_new_tokens)
        form.addRow("Seed", self.seed)
        form.addRow("When the chat is full", self.context_overflow)
        form.addRow("Structured output", self._structured_row())
        self.set_value(settings)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        if controller is not None:
            self.save_default = buttons.addButton("Use for new chats", QDialogButtonBox.ButtonRole.ActionRole)
            self.save_default.setToolTip("New chats start with these settings")
            self.save_default.clicked.connect(self._save_default)
            self.saved_note = QLabel()
            self.saved_note.setStyleSheet(f"color: {theme.muted_color()};")
            form.addRow(self.saved_note)
        form.addRow(buttons)

    def _structured_row(self) -> QVBoxLayout:
        """The Structured output field with its error under it (shown when OK finds it unusable)."""
        self.structured_output = QLineEdit(placeholderText="Off. 'json' for any JSON object, or a JSON Schema")
        self.structured_output.setToolTip("The answer is forced to follow it, token by token (a remote endpoint "
                                          "is sent it as response_format)")
        self.structured_error = QLabel(wordWrap=True, visible=False)
        self.structured_error.setStyleSheet(f"color: {theme.ERROR_COLOR};")
        self.structured_output.textEdited.connect(lambda _: self.structured_error.setVisible(False))
        row = QVBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.structured_output)
        row.addWidget(self.structured_error)
        return row

    def _presets_row(self) -> QHBoxLayout:
        presets = QHBoxLayout()
        self.preset = QComboBox()
        self.preset.setMinimumWidth(180)
        self.preset.activated.connect(self._on_preset)
        save_preset = QPushButton("Save as preset…")
        save_preset.clicked.connect(self._save_preset)
        self.delete_preset = QPushButton("Delete preset")
        self.delete_preset.clicked.connect(self._delete_preset)
        presets.addWidget(self.preset, 1)
        presets.addWidget(save_preset)
        presets.addWidget(self.delete_preset)
        self._fill_presets()
        return presets

    def set_value(self, settings: ChatSettings) -> None:
        self.system_prompt.setPlainText(settings.system_prompt)
        self.temperature.setValue(settings.temperature)
        self.top_p.setValue(settings.top_p)
        self.top_k.setValue(settings.top_k)
        self.max_new_tokens.setValue(settings.max_new_tokens)
        self.seed.setValue(RANDOM_SEED if settings.seed is None else settings.seed)
        self.context_overflow.setCurrentIndex(max(0, self.context_overflow.findData(settings.context_overflow)))
        self.structured_output.setText(settings.structured_output)

    def accept(self) -> None:
        if self._structured_output_is_usable():
            super().accept()

    def _structured_output_is_usable(self) -> bool:
        """Checked where it is typed (the error under the field, the dialog kept open), not at the next message."""
        try:
            check_setting(self.structured_output.text())
        except SluiceError as exc:
            self.structured_error.setText(str(exc))
            self.structured_error.setVisible(True)
            self.adjustSize()
            return False
        return True

    def value(self) -> ChatSettings:
        seed = self.seed.value()
        return ChatSettings(self.system_prompt.toPlainText(), round(self.temperature.value(), 2),
                            round(self.top_p.value(), 2), self.top_k.value(), self.max_new_tokens.value(),
                            None if seed == RANDOM_SEED else seed, self.context_overflow.currentData(),
                            self.structured_output.text().strip())

    # presets and defaults -------------------------------------------------------------------------
    def _fill_presets(self, current: str | None = None) -> None:
        self.preset.clear()
        self.preset.addItem("(choose a preset)", None)
        for name in self.controller.chat_presets():
            self.preset.addItem(name, name)
        self.preset.setCurrentIndex(max(0, self.preset.findData(current)) if current else 0)
        self.delete_preset.setEnabled(self.preset.currentData() is not None)

    def _on_preset(self, index: int) -> None:
        name = self.preset.itemData(index)
        self.delete_preset.setEnabled(name is not None)
        if name is not None:
            self.set_value(self.controller.chat_presets()[name])

    def save_preset(self, name: str) -> None:
        if not self._structured_output_is_usable():
            return
        self.controller.save_chat_preset(name, self.value())
        self._fill_presets(name.strip())

    def _save_preset(self) -> None:
        name, ok = QInputDialog.getText(self, "Save as preset", "Name of the preset:")
        if ok and name.strip():
            self.save_preset(name)

    def _delete_preset(self) -> None:
        name = self.preset.currentData()
        if name is not None:
            self.controller.delete_chat_preset(name)
            self._fill_presets()

    def _save_default(self) -> None:
        if not self._structured_output_is_usable():
            return
        self.controller.save_default_chat_settings(self.value())
        self.saved_note.setText("New chats will start with these settings.")
