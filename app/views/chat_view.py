"""The open conversation: a scrolling column of MessageWidgets that follows the stream."""
from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QLabel, QScrollArea, QVBoxLayout, QWidget

from ..chat_controller import ChatController
from ..markdown import MarkdownRenderer, warm_up
from ..store import Message
from . import theme
from .message_widget import MessageWidget

MAX_COLUMN_WIDTH = 860   # px: long lines are hard to read


class ChatView(QScrollArea):
    edit_requested = Signal(int, str)      # message id, its text

    def __init__(self, controller: ChatController, parent: QWidget | None = None):
        super().__init__(parent)
        self.controller = controller
        self.renderer = MarkdownRenderer(theme.is_dark())
        warm_up()
        self.widgets: dict[int, MessageWidget] = {}
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setFrameShape(QScrollArea.Shape.NoFrame)

        container = QWidget()
        outer = QVBoxLayout(container)
        outer.setContentsMargins(16, 16, 16, 16)
        self._column = QWidget()
        self._column.setMaximumWidth(MAX_COLUMN_WIDTH)
        self._layout = QVBoxLayout(self._column)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(10)
        self.placeholder = QLabel("Ask anything. Enter sends, Shift+Enter adds a line, Esc stops.")
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setWordWrap(True)                # a narrow column wraps it instead of cutting both ends
        self.placeholder.setStyleSheet(f"color: {theme.muted_color()}; font-size: 14px; padding: 40px;")
        self._layout.addWidget(self.placeholder)
        self.context_marker = QLabel()             # where older turns were left out of the model's context
        self.context_marker.setObjectName("contextMarker")
        self.context_marker.setWordWrap(True)
        self.context_marker.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.context_marker.setStyleSheet(f"color: {theme.muted_color()}; border-top: 1px dashed "
                                          f"{theme.muted_color()}; padding: 4px; font-size: 12px;")
        self.context_marker.setVisible(False)
        self._layout.addWidget(self.context_marker)
        self._layout.addStretch(1)
        outer.addWidget(self._column, 0, Qt.AlignmentFlag.AlignHCenter)
        self.setWidget(container)
        self._follow = True
        self.verticalScrollBar().valueChanged.connect(self._on_scrolled)
        self.verticalScrollBar().rangeChanged.connect(self._on_range_changed)

        controller.conversation_opened.connect(self._on_conversation_opened)
        controller.message_added.connect(self._on_message_added)
        controller.message_streamed.connect(self._on_message_streamed)
        controller.message_finished.connect(self._on_message_finished)
        controller.context_fitted.connect(lambda _message: self._place_context_marker())
        controller.generating_changed.connect(lambda _: self._update_regenerate())

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._column.setFixedWidth(min(MAX_COLUMN_WIDTH, max(200, self.viewport().width() - 32)))

    # model -> view ---------------------------------------------------------------------------------
    def _on_conversation_opened(self, _conversation, messages: list[Message]) -> None:
        for widget in self.widgets.values():
            self._layout.removeWidget(widget)
            widget.hide()
            widget.deleteLater()
        self.widgets.clear()
        for message in messages:
            self._add(message)
        self._follow = True
        self._update_regenerate()
        self._place_context_marker()

    def _on_message_added(self, message: Message) -> None:
        conversation = self.controller.conversation
        if conversation is None or message.conversation_id != conversation.id:
            return                                  # an answer streaming in another chat
        self._add(message)
        self._follow = True
        self._update_regenerate()

    def _on_message_streamed(self, message_id: int, content: str) -> None:
        widget = self.widgets.get(message_id)
        if widget is not None:
            widget.set_streamed_content(content)

    def _on_message_finished(self, message: Message) -> None:
        widget = self.widgets.get(message.id)
        if widget is not None:
            widget.update_message(message)
        self._update_regenerate()
        self._place_context_marker()

    def _place_context_marker(self) -> None:
        """A line after the last message the latest answer could not see (context overflow policy)."""
        self._layout.removeWidget(self.context_marker)
        self.context_marker.setVisible(False)
        answers = [w.message for w in self.widgets.values() if w.message.role == "assistant"]
        context = next((m.stats.get("context") for m in reversed(answers) if m.stats.get("context")), None)
        if not context or not context.get("num_dropped") or context["dropped_ids"][-1] not in self.widgets:
            self._layout.insertWidget(self._layout.count() - 1, self.context_marker)
            return
        self.context_marker.setText(self._marker_text(context))
        index = self._layout.indexOf(self.widgets[context["dropped_ids"][-1]])
        self._layout.insertWidget(index + 1, self.context_marker)
        self.context_marker.setVisible(True)

    def _marker_text(self, context: dict) -> str:
        """Which messages (numbered from the top of the chat) the latest answer could not see."""
        order = list(self.widgets)
        first, last = (order.index(i) + 1 if i in self.widgets else None for i in context["dropped_ids"])
        count = context["num_dropped"]
        which = (f"Message {last} is" if count == 1 else
                 f"Messages {first}–{last} are" if first else f"The {count} messages up to message {last} are")
        return (f"{which} out of the model's context ({context['max_context']:,} tokens): the latest answer did not "
                f"see {'it' if count == 1 else 'them'}; messages {last + 1} onwards it saw. Chat settings choose "
                f"what is kept.")

    def _add(self, message: Message) -> None:
        widget = MessageWidget(message, self.renderer, self._column)
        widget.edit_requested.connect(lambda message_id: self.edit_requested.emit(
            message_id, self.widgets[message_id].message.content))
        widget.regenerate_requested.connect(self.controller.regenerate)
        self.widgets[message.id] = widget
        self._layout.insertWidget(self._layout.count() - 1, widget)
        self.placeholder.setVisible(False)

    def _update_regenerate(self) -> None:
        last_id = max(self.widgets) if self.widgets else None
        for message_id, widget in self.widgets.items():
            widget.set_can_regenerate(message_id == last_id and not self.controller.is_generating)
        self.placeholder.setVisible(not self.widgets)

    def set_dark(self, is_dark: bool) -> None:
        self.renderer = MarkdownRenderer(is_dark)
        for widget in self.widgets.values():
            widget.set_dark(self.renderer)

    # following the stream -------------------------------------------------------------------------
    def _on_scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._follow = value >= bar.maximum() - 8      # the user scrolled up: stop following

    def _on_range_changed(self, _minimum: int, maximum: int) -> None:
        if self._follow:
            QTimer.singleShot(0, lambda: self.verticalScrollBar().setValue(self.verticalScrollBar().maximum()))
