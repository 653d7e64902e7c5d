"""Chat state machine between the store, the engine thread and the views.

Owns "which conversation is open" and "which answer is streaming" (one at a time, in any chat: it
keeps streaming while the user reads another one). The streaming answer is saved to SQLite in batches
by the store's saver thread, so a crash loses at most the last half second. Views listen to the
signals below and call the public methods; they never touch the store directly.
"""
from __future__ import annotations

import re
from dataclasses import asdict

from PySide6.QtCore import QObject, Signal

from . import chat_presets
from .store import ChatSettings, Conversation, Message, Store
from .worker import EngineHost

_THINK_BLOCK = re.compile(r"<think>.*?(</think>|\Z)", re.DOTALL)
_MARKDOWN_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_MARKDOWN_MARKS = re.compile(r"(^|\s)(#{1,6}|>|[-*+]|\d+\.)\s+|[*_`~]+")
TITLE_CHARS = 48


def history_for_engine(settings: ChatSettings, messages: list[Message]) -> tuple[list[dict], list[int | None]]:
    """Chat messages for the engine (system prompt, then finished turns; earlier thoughts are dropped),
    and beside each the id of the message it came from (None for the system prompt)."""
    history, ids = [], []
    if settings.system_prompt.strip():
        history.append({"role": "system", "content": settings.system_prompt})
        ids.append(None)
    for message in messages:
        content = _THINK_BLOCK.sub("", message.content).strip() if message.role == "assistant" else message.content
        if content and message.state not in ("error", "streaming"):
            history.append({"role": message.role, "content": content})
            ids.append(message.id)
    return history, ids


def title_from(text: str) -> str:
    """A chat title from its first message: one line, Markdown marks removed, at most TITLE_CHARS."""
    line = _MARKDOWN_MARKS.sub(lambda m: m.group(1) or "", _MARKDOWN_LINK.sub(r"\1", text))
    line = " ".join(line.split()) or "New chat"
    return line if len(line) <= TITLE_CHARS else line[:TITLE_CHARS - 1].rstrip() + "…"


class ChatController(QObject):
    conversation_opened = Signal(object, list)      # Conversation | None, list[Message]
    conversations_changed = Signal()
    message_added = Signal(object)                  # Message (of any chat: views check conversation_id)
    message_streamed = Signal(int, str)             # message id, full content so far
    message_finished = Signal(object)               # Message (final content, state and stats)
    context_fitted = Signal(object)                 # the streaming Message, its stats["context"] just set
    generating_changed = Signal(bool)               # an answer is streaming (in any chat)
    error = Signal(str)                             # one sentence for a dialog

    def __init__(self, store: Store, host: EngineHost, parent: QObject | None = None):
        super().__init__(parent)
        self.store = store
        self.host = host
        self.conversation: Conversation | None = None
        self.model_name: str | None = None         # set by the window when a model is loaded
        self._request_id: int | None = None
        self._stream: Message | None = None
        self._history_ids: list[int | None] = []
        host.chunk.connect(self._on_chunk)
        host.finished.connect(self._on_finished)
        host.failed.connect(self._on_failed)
        host.context_fitted.connect(self._on_context_fitted)

    @property
    def is_generating(self) -> bool:
        """An answer is streaming, in the open chat or another."""
        return self._request_id is not None

    @property
    def streaming_conversation_id(self) -> int | None:
        return self._stream.conversation_id if self._stream is not None else None

    @property
    def is_generating_here(self) -> bool:
        return self.conversation is not None and self.streaming_conversation_id == self.conversation.id

    def streaming_title(self) -> str | None:
        """Title of the chat whose answer is streaming, when it is not the open one."""
        if not self.is_generating or self.is_generating_here:
            return None
        conversation = self.store.conversation(self.streaming_conversation_id)
        return conversation.title if conversation else None

    # conversations -----------------------------------------------------------------------------
    def open_conversation(self, conversation_id: int | None) -> None:
        """Show a chat; an answer streaming elsewhere keeps streaming."""
        if self.conversation is not None and conversation_id == self.conversation.id:
            return
        self.conversation = self.store.conversation(conversation_id) if conversation_id is not None else None
        messages = self.store.messages(self.conversation.id) if self.conversation else []
        if self._stream is not None:                # the live object: its content is ahead of nothing, but its
            messages = [self._stream if m.id == self._stream.id else m for m in messages]   # stats are newer
        self.conversation_opened.emit(self.conversation, messages)

    def new_conversation(self) -> int:
        conversation = self.store.create_conversation(settings=chat_presets.default_settings(self.store))
        self.conversation = None
        self.conversations_changed.emit()
        self.open_conversation(conversation.id)
        return conversation.id

    def conversations(self, search: str = "") -> list[Conversation]:
        return self.store.conversations(search)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        if self.store.is_closed:        # an open title editor commits when the closing window drops it
            return
        self.store.rename_conversation(conversation_id, title)
        if self.conversation and self.conversation.id == conversation_id:
            self.conversation = self.store.conversation(conversation_id)
        self.conversations_changed.emit()

    def delete_conversation(self, conversation_id: int) -> None:
        if self.streaming_conversation_id == conversation_id:
            self.stop()
        if self.conversation and self.conversation.id == conversation_id:
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

    # presets and the defaults of new chats ------------------------------------------------------
    def chat_presets(self) -> dict[str, ChatSettings]:
        return chat_presets.presets(self.store)

    def save_chat_preset(self, name: str, settings: ChatSettings) -> None:
        chat_presets.save_preset(self.store, name, settings)

    def delete_chat_preset(self, name: str) -> None:
        chat_presets.delete_preset(self.store, name)

    def save_default_chat_settings(self, settings: ChatSettings) -> None:
        chat_presets.save_default_settings(self.store, settings)

    # generation ----------------------------------------------------------------------------------
    def send(self, text: str) -> bool:
        """Add the user's message and start the answer. False (nothing sent) while any answer streams:
        the engine answers one chat at a time."""
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
        history, self._history_ids = history_for_engine(settings, self.messages())
        self._stream = self.store.add_message(self.conversation.id, "assistant", "", state="streaming",
                                              stats={"model": self.model_name})
        self.message_added.emit(self._stream)
        params = {k: v for k, v in asdict(settings).items() if k != "system_prompt"}
        self._request_id = self.host.generate(history, params)
        self.generating_changed.emit(True)
        self.conversations_changed.emit()

    def _on_context_fitted(self, request_id: int, info: dict) -> None:
        if request_id != self._request_id or self._stream is None:
            return
        dropped_ids = [self._history_ids[i] for i in info.get("dropped", []) if self._history_ids[i] is not None]
        self._stream.stats["context"] = {"prompt_tokens": info["prompt_tokens"], "max_context": info["max_context"],
                                         "num_dropped": len(dropped_ids),
                                         "dropped_ids": [dropped_ids[0], dropped_ids[-1]] if dropped_ids else []}
        self.store.update_message(self._stream.id, stats=self._stream.stats)
        self.context_fitted.emit(self._stream)

    def _on_chunk(self, request_id: int, text: str, num_tokens: int) -> None:
        if request_id != self._request_id or self._stream is None:
            return
        self._stream.content += text
        self.store.save_streaming(self._stream.id, self._stream.content)
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
        self.conversations_changed.emit()
