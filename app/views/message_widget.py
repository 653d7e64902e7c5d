"""One chat message: role header with actions, Markdown body, and the answer's speed line."""
from __future__ import annotations

import time

from PySide6.QtCore import QTimer, QUrl, Signal, Qt
from PySide6.QtGui import QDesktopServices, QFontMetricsF, QGuiApplication
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QSizePolicy, QTextBrowser, QToolButton,
                               QVBoxLayout, QWidget)

from ..export import stats_line
from ..markdown import FinishedPrefix, MarkdownRenderer
from ..store import Message
from . import theme
from .incremental_html import IncrementalHtml

MIN_RENDER_INTERVAL_S = 0.05     # streaming re-renders at most 20 times a second
_ALPHABET = "abcdefghijklmnopqrstuvwxyz"


class AutoHeightBrowser(QTextBrowser):
    """A QTextBrowser as tall as its document, so the chat scrolls as one page."""
    text_width_changed = Signal(int)              # the width the document's text can take, in average characters

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.viewport().setAutoFillBackground(False)
        self.setStyleSheet("QTextBrowser { background: transparent; }")
        self.document().setDocumentMargin(2)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)

    def _fit(self, size) -> None:
        self.setFixedHeight(int(size.height()) + 4)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            text_width_px = self.viewport().width() - 2 * self.document().documentMargin()
            char_px = QFontMetricsF(self.font()).horizontalAdvance(_ALPHABET) / len(_ALPHABET)   # of words, not "i"s
            self.text_width_changed.emit(int(text_width_px / char_px))


class MessageWidget(QFrame):
    copy_requested = Signal(str)                 # text put on the clipboard
    edit_requested = Signal(int)                 # message id (user messages)
    regenerate_requested = Signal()

    def __init__(self, message: Message, renderer: MarkdownRenderer, parent: QWidget | None = None):
        super().__init__(parent)
        self.message = message
        self._renderer = renderer
        self._code_blocks: list[str] = []
        self._finished = FinishedPrefix()          # the answer's start whose HTML streaming no longer changes
        self._text_width_chars: int | None = None  # unlimited until the body knows its width
        self._table_widths: list[int] = []         # of the tables shown, in characters
        self._expanded_thinks: set[int] = set()
        self._last_render_s = 0.0
        self._render_timer = QTimer(self, singleShot=True, interval=int(MIN_RENDER_INTERVAL_S * 1000))
        self._render_timer.timeout.connect(self._render)

        is_user = message.role == "user"
        self.setObjectName("userMessage" if is_user else "assistantMessage")
        self._apply_colors()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.setSpacing(2)

        header = QHBoxLayout()
        self.role_label = QLabel()
        self.role_label.setStyleSheet("font-weight: 600;")
        self.role_label.setWordWrap(True)            # a long model name wraps instead of being cut off
        header.addWidget(self.role_label, 1)
        self.copy_button = self._tool_button("Copy", "Copy this message as Markdown")
        self.copy_button.clicked.connect(lambda: self._copy(self.message.content))
        self.edit_button = self._tool_button("Edit", "Edit this message and send it again")
        self.edit_button.clicked.connect(lambda: self.edit_requested.emit(self.message.id))
        self.regenerate_button = self._tool_button("Regenerate", "Answer this again")
        self.regenerate_button.clicked.connect(self.regenerate_requested)
        for button in (self.copy_button, self.edit_button, self.regenerate_button):
            header.addWidget(button)
        self.edit_button.setVisible(is_user)
        self.regenerate_button.setVisible(False)
        layout.addLayout(header)

        self.body = AutoHeightBrowser(self)
        self._body_html = IncrementalHtml(self.body.document())
        self.body.anchorClicked.connect(self._on_anchor)
        self.body.text_width_changed.connect(self._on_text_width)
        layout.addWidget(self.body)
        self.stats_label = QLabel()
        self.stats_label.setWordWrap(True)           # an error is a whole sentence
        layout.addWidget(self.stats_label)
        self._apply_colors()
        self.update_message(message)

    def _apply_colors(self) -> None:
        if self.message.role == "user":
            self.setStyleSheet(f"QFrame#userMessage {{ background: {theme.user_bubble_color()}; border-radius: 10px; }}")
        if hasattr(self, "stats_label"):
            self.stats_label.setStyleSheet(f"color: {theme.muted_color()}; font-size: 11px;")

    def _tool_button(self, text: str, tip: str) -> QToolButton:
        button = QToolButton(self)
        button.setText(text)
        button.setToolTip(tip)
        button.setAutoRaise(True)
        button.setCursor(Qt.CursorShape.PointingHandCursor)
        return button

    # updates -------------------------------------------------------------------------------------
    def update_message(self, message: Message) -> None:
        self.message = message
        self._update_header()
        self._render()

    def set_streamed_content(self, content: str) -> None:
        """Streaming: keep the text, re-render at most every MIN_RENDER_INTERVAL_S."""
        self.message.content = content
        if time.perf_counter() - self._last_render_s >= MIN_RENDER_INTERVAL_S:
            self._render()
        elif not self._render_timer.isActive():
            self._render_timer.start()

    def set_can_regenerate(self, can: bool) -> None:
        self.regenerate_button.setVisible(can and self.message.role == "assistant")

    def set_dark(self, renderer: MarkdownRenderer) -> None:
        self._renderer = renderer
        self._finished = FinishedPrefix()
        self._apply_colors()
        self._render()

    def _update_header(self) -> None:
        m = self.message
        if m.role == "user":
            self.role_label.setText("You")
        else:
            model = m.stats.get("model")
            self.role_label.setText("Assistant" + (f" · {model}" if model else ""))
        line = stats_line(m.stats) if m.role == "assistant" else ""
        if m.state == "streaming":
            line = "generating…"
        elif m.state == "interrupted":
            line = (line + " · " if line else "") + "interrupted"
        elif m.state == "error":
            line = m.stats.get("error", "failed")
        self.stats_label.setText(line)
        self.stats_label.setVisible(bool(line))

    def _render(self) -> None:
        self._render_timer.stop()
        self._last_render_s = time.perf_counter()
        text = self.message.content
        if not text and self.message.state == "streaming":
            text = "…"
        rendered, self._finished = self._renderer.render_growing(text, self._expanded_thinks, self._finished,
                                                                 self._text_width_chars)
        self._code_blocks, self._table_widths = rendered.code_blocks, rendered.table_widths
        self._body_html.show(rendered.html, self._finished.html)

    def _on_text_width(self, text_width_chars: int) -> None:
        """Renders again when a table shown turns from grid to records or back at this width (app.markdown_tables)."""
        old, new = self._text_width_chars or 1 << 30, text_width_chars      # None: unlimited
        self._text_width_chars = new
        if any(min(old, new) < width <= max(old, new) for width in self._table_widths):
            self._render()

    def rendered_text(self) -> str:
        return self.body.toPlainText()

    # actions -------------------------------------------------------------------------------------
    def _on_anchor(self, url: QUrl) -> None:
        target = url.toString()
        kind, _, index = target.partition(":")
        if kind == "copy-code" and index.isdigit() and int(index) < len(self._code_blocks):
            self._copy(self._code_blocks[int(index)])
        elif kind == "toggle-think" and index.isdigit():
            self._expanded_thinks ^= {int(index)}
            self._render()
        elif url.scheme() in ("http", "https"):
            QDesktopServices.openUrl(url)

    def _copy(self, text: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.copy_requested.emit(text)
