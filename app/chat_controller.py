"""Chat state machine between the store, the engine thread and the views.

Owns "which conversation is open" and "which answer is streaming". The streaming answer is saved to
SQLite on every chunk (<= 40 per second), so a crash loses at most the last chunk of tokens.
Views listen to the signals below and call the public methods; they never touch the store directly.
"""
from __future__ import annotations

import re
from dataclasses import asdict

from PySide6.QtCore import QObject, Signal

from .store import ChatSettings, Message, Store
from .worker import EngineHost

_THINK_BLOCK = re.compile(r"<think>.*?(</think>|\Z)", re.DOTALL)
TITLE_CHARS = 48


def history_for_engine(settings: ChatSettings, messages: list[Message]) -> list[dict]:
    """Chat messages for the engine: system prompt, then finished turns; earlier thoughts are dropped."""
    history = [{"role": "system", "content": settings.system_prompt}] if settings.system_prompt.strip() else []
    for message in messages:
        content = _THINK_BLOCK.sub("", message.content).strip() if message.role == "assistant" else message.content
        if content and message.state != "error":
            history.append({"role": message.role, "content": content})
    return history


def title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[:TITLE_CHARS - 1].rstrip() + "…"


class ChatController(QObject):
    conversation_opened = Signal(object, list)      # Conversation | None, list[Message]
    conversations_changed = Signal()
    message_added = Signal(object)                  # Message
    message_streamed = Signal(int, str)             # message id, full content so far
    message_finished = Signal(object)               # Message (final content, state and stats)
    generating_changed = Signal(bool)
    error = Signal(str)                             # one sentence for a dialog

    def __init__(self, store: Store, host: EngineHost, parent: QObject | None = None):
        super().__init__(parent)
        self.store = store
        self.host = host
        self.conversation = None
        self.model_name: str | None = None         # set by the window when a model is loaded
        self._request_id: int | None = None
        self._stream: Message | None = None
        self._stream_tokens = 0
        host.chunk.connect(self._on_chunk)
        host.finished.connect(self._on_finished)
        host.failed.connect(self._on_failed)

    @property
    def is_generating(self) -> bool:
        return self._request_id is not None

    # conversations -----------------------------------------------------------------------------
    def open_conversation(self, conversation_id: int | None) -> None:
        if self.conversation is not None and conversation_id == self.conversation.id:
            return
        self.stop()
        self.conversation = self.store.conversation(conversation_id) if conversation_id is not None else None
        messages = self.store.messages(self.conversation.id) if self.conversation else []
        self.conversation_opened.emit(self.conversation, messages)

    def new_conversation(self) -> int:
        self.stop()
        conversation = self.store.create_conversation()
        self.conversation = None
        self.conversations_changed.emit()
        self.open_conversation(conversation.id)
        return conversation.id

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self.store.rename_conversation(conversation_id, title)
        if self.conversation and self.conversation.id == conversation_id:
            self.conversation = self.store.conversation(conversation_id)
        self.conversations_changed.emit()

    def delete_conversation(self, conversation_id: int) -> None:
        if self.conversation and self.conversation.id == conversation_id:
            self.stop()
            self.conversation = None
            self.conversation_opened.emit(None, [])
        self.store.delete_conversation(conversation_id)
        self.conversations_changed.emit()

    def set_chat_settings(self, settings: ChatSettings) -> None:
        if self.conversation is None:
            self.new_conversation()
        self.store.set_chat_settings(self.conversation.id, settings)
        self.conversation.settings = settings

    def messages(self) -> list[Message]:
        return self.store.messages(self.conversation.id) if self.conversation else []

    # generation ----------------------------------------------------------------------------------
    def send(self, text: str) -> bool:
        text = text.strip()
        if not text or self.is_generating:
            return False
        if self.conversation is None:
            self.new_conversation()
        if not self.messages() and self.conversation.title == "New chat":
            self.rename_conversation(self.conversation.id, title_from(text))
        self.message_added.emit(self.store.add_message(self.conversation.id, "user", text))
        self._start_answer()
        return True

    def regenerate(self) -> bool:
        """Replace the last answer with a new one."""
        messages = self.messages()
        if self.is_generating or not messages or messages[-1].role != "assistant":
            return False
        self.store.delete_messages_from(self.conversation.id, messages[-1].id)
        self.conversation_opened.emit(self.conversation, messages[:-1])
        self._start_answer()
        return True

    def edit_and_resend(self, message_id: int, text: str) -> bool:
        """Replace a user message (and drop everything after it), then answer again."""
        if self.is_generating or not text.strip() or self.conversation is None:
            return False
        kept = [m for m in self.messages() if m.id < message_id]
        self.store.delete_messages_from(self.conversation.id, message_id)
        self.conversation_opened.emit(self.conversation, kept)
        return self.send(text)

    def stop(self) -> None:
        if self._request_id is not None:
            self.host.cancel_generation(self._request_id)

    def _start_answer(self) -> None:
        settings = self.conversation.settings
        history = history_for_engine(settings, self.messages())
        self._stream = self.store.add_message(self.conversation.id, "assistant", "", state="streaming",
                                              stats={"model": self.model_name})
        self._stream_tokens = 0
        self.message_added.emit(self._stream)
        params = {k: v for k, v in asdict(settings).items() if k != "system_prompt"}
        self._request_id = self.host.generate(history, params)
        self.generating_changed.emit(True)
        self.conversations_changed.emit()

    def _on_chunk(self, request_id: int, text: str, num_tokens: int) -> None:
        if request_id != self._request_id or self._stream is None:
            return
        self._stream.content += text
        self._stream_tokens = num_tokens
        self.store.update_message(self._stream.id, content=self._stream.content)
        self.message_streamed.emit(self._stream.id, self._stream.content)

    def _on_finished(self, request_id: int, stats: dict) -> None:
        if request_id != self._request_id or self._stream is None:
            return
        self._finish("done", {**self._stream.stats, **stats})

    def _on_failed(self, request_id: int, message: str) -> None:
        if request_id != self._request_id or self._stream is None:
            return
        self._finish("error", {**self._stream.stats, "error": message})
        self.error.emit(message)

    def _finish(self, state: str, stats: dict) -> None:
        message, self._stream, self._request_id = self._stream, None, None
        message.state, message.stats = state, stats
        self.store.update_message(message.id, content=message.content, state=state, stats=stats)
        self.message_finished.emit(message)
        self.generating_changed.emit(False)
