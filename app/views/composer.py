"""The prompt box: Enter sends, Shift+Enter adds a line, Esc stops (or cancels an edit)."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QToolButton, QVBoxLayout,
                               QWidget)

from . import theme
from .chat_view import MAX_COLUMN_WIDTH

MIN_LINES = 2
MAX_LINES = 8


class PromptEdit(QPlainTextEdit):
    submit = Signal()
    escape = Signal()

    def keyPressEvent(self, event) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            if event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
                self.insertPlainText("\n")
            else:
                self.submit.emit()
            return
        if event.key() == Qt.Key.Key_Escape:
            self.escape.emit()
            return
        super().keyPressEvent(event)


class Composer(QWidget):
    send_requested = Signal(str)            # new prompt
    resend_requested = Signal(int, str)     # edited message id, new text
    stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.editing_message_id: int | None = None
        self._is_generating = False
        self._busy_elsewhere: str | None = None
        layout = QVBoxLayout(self)
        layout.setContentsMargins(16, 4, 16, 12)
        self.setMaximumWidth(MAX_COLUMN_WIDTH + 32)     # lines up with the chat column
        self.edit_banner = QWidget()
        banner = QHBoxLayout(self.edit_banner)
        banner.setContentsMargins(0, 0, 0, 0)
        label = QLabel("Editing a message: sending replaces it and everything after it.")
        label.setStyleSheet(f"color: {theme.muted_color()};")
        cancel = QToolButton()
        cancel.setText("Cancel edit")
        cancel.clicked.connect(self.cancel_edit)
        banner.addWidget(label, 1)
        banner.addWidget(cancel)
        self.edit_banner.setVisible(False)
        layout.addWidget(self.edit_banner)
        self.busy_banner = QWidget()               # another chat's answer is streaming: one at a time
        busy = QHBoxLayout(self.busy_banner)
        busy.setContentsMargins(0, 0, 0, 0)
        self.busy_label = QLabel()
        self.busy_label.setWordWrap(True)
        self.busy_label.setStyleSheet(f"color: {theme.muted_color()};")
        self.stop_other_button = QToolButton()
        self.stop_other_button.setText("Stop that answer")
        self.stop_other_button.clicked.connect(self.stop_requested)
        busy.addWidget(self.busy_label, 1)
        busy.addWidget(self.stop_other_button)
        self.busy_banner.setVisible(False)
        layout.addWidget(self.busy_banner)

        row = QHBoxLayout()
        self.edit = PromptEdit()
        self.edit.setPlaceholderText("Message the model…  (Enter sends, Shift+Enter new line, Esc stops)")
        self.edit.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        self._fit_height()
        self.edit.submit.connect(self.submit)
        self.edit.escape.connect(self._on_escape)
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.send_button.clicked.connect(self._on_button)
        self.send_button.setMinimumWidth(80)
        row.addWidget(self.edit, 1)
        row.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        layout.addLayout(row)

    def _fit_height(self, *_args) -> None:
        """Grow with the text from MIN_LINES to MAX_LINES lines, then scroll."""
        num_lines = self.edit.document().documentLayout().documentSize().height()   # plain text: lines
        num_lines = max(MIN_LINES, min(MAX_LINES, int(num_lines)))
        margins = self.edit.contentsMargins()
        self.edit.setFixedHeight(num_lines * self.edit.fontMetrics().lineSpacing() + 2 * int(
            self.edit.document().documentMargin()) + margins.top() + margins.bottom() + 4)

    def set_generating(self, is_generating: bool, busy_elsewhere: str | None = None) -> None:
        """is_generating: this chat's answer streams (the button stops it). busy_elsewhere: the title of
        another chat whose answer streams; sending waits for it (the engine answers one chat at a time)."""
        self._is_generating = is_generating
        self._busy_elsewhere = busy_elsewhere
        self.send_button.setText("Stop" if is_generating else "Send")
        self.send_button.setEnabled(is_generating or busy_elsewhere is None)
        self.send_button.setToolTip("Stop the answer (Esc)" if is_generating else
                                    "Send (Enter)" if busy_elsewhere is None else
                                    "Another chat is being answered; send when it is done")
        self.busy_banner.setVisible(busy_elsewhere is not None)
        if busy_elsewhere is not None:
            self.busy_label.setText(f"Answering in “{busy_elsewhere}”. Sluice answers one chat at a time: "
                                    "you can type now and send when that answer is done.")

    def begin_edit(self, message_id: int, text: str) -> None:
        self.editing_message_id = message_id
        self.edit.setPlainText(text)
        self.edit_banner.setVisible(True)
        self.edit.setFocus()

    def cancel_edit(self) -> None:
        self.editing_message_id = None
        self.edit_banner.setVisible(False)
        self.edit.clear()

    def submit(self) -> None:
        text = self.edit.toPlainText().strip()
        if not text or self._is_generating or self._busy_elsewhere is not None:
            return
        if self.editing_message_id is not None:
            message_id = self.editing_message_id
            self.editing_message_id = None
            self.edit_banner.setVisible(False)
            self.edit.clear()
            self.resend_requested.emit(message_id, text)
        else:
            self.edit.clear()
            self.send_requested.emit(text)

    def _on_button(self) -> None:
        if self._is_generating:
            self.stop_requested.emit()
        else:
            self.submit()

    def _on_escape(self) -> None:
        if self._is_generating:
            self.stop_requested.emit()
        elif self.editing_message_id is not None:
            self.cancel_edit()
