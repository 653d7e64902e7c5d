"""Sidebar: search box, New chat, and the conversations (rename with F2/double-click, delete with Del)."""
from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QAction, QColor, QIcon, QKeySequence, QPainter, QPixmap
from PySide6.QtWidgets import (QAbstractItemView, QLineEdit, QListWidget, QListWidgetItem, QMenu, QMessageBox,
                               QPushButton, QVBoxLayout, QWidget)

from ..chat_controller import ChatController

ID_ROLE = Qt.ItemDataRole.UserRole
STREAMING_ROLE = Qt.ItemDataRole.UserRole + 1      # True on the chat whose answer is streaming


def _dot_icon(color: str = "#10b981", size: int = 12) -> QIcon:
    pixmap = QPixmap(size, size)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setBrush(QColor(color))
    painter.setPen(Qt.PenStyle.NoPen)
    painter.drawEllipse(2, 2, size - 4, size - 4)
    painter.end()
    return QIcon(pixmap)


class ConversationList(QWidget):
    export_requested = Signal(int)       # conversation id

    def __init__(self, controller: ChatController, parent: QWidget | None = None):
        super().__init__(parent)
        self.controller = controller
        self.confirm_delete = True       # tests switch the question dialog off
        self._streaming_icon = _dot_icon()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 4, 8)
        self.new_button = QPushButton("New chat")
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.new_button.clicked.connect(controller.new_conversation)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats")
        self.search.setClearButtonEnabled(True)
        self._search_timer = QTimer(self, singleShot=True, interval=150)
        self._search_timer.timeout.connect(self.refresh)
        self.search.textChanged.connect(lambda _: self._search_timer.start())
        self.list = QListWidget()
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setWordWrap(False)
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed
                                  | QAbstractItemView.EditTrigger.DoubleClicked)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._on_context_menu)
        self.list.currentItemChanged.connect(self._on_current_changed)
        self.list.itemChanged.connect(self._on_item_renamed)
        delete = QAction("Delete", self.list, shortcut=QKeySequence.StandardKey.Delete,
                         shortcutContext=Qt.ShortcutContext.WidgetShortcut)
        delete.triggered.connect(self._delete_current)
        self.list.addAction(delete)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        controller.conversations_changed.connect(self.refresh)
        controller.conversation_opened.connect(lambda conversation, _m: self._select(conversation))
        self.refresh()

    def refresh(self) -> None:
        current = self.controller.conversation.id if self.controller.conversation else None
        streaming = self.controller.streaming_conversation_id
        self.list.blockSignals(True)
        self.list.clear()
        for conversation in self.controller.conversations(self.search.text()):
            item = QListWidgetItem(conversation.title)
            item.setData(ID_ROLE, conversation.id)
            item.setData(STREAMING_ROLE, conversation.id == streaming)
            if conversation.id == streaming:
                item.setIcon(self._streaming_icon)
                item.setToolTip(f"{conversation.title}\nAnswering now")
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.list.addItem(item)
            if conversation.id == current:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)

    def ids(self) -> list[int]:
        return [self.list.item(i).data(ID_ROLE) for i in range(self.list.count())]

    def rename(self, conversation_id: int) -> None:
        """Start editing the title in place."""
        for i in range(self.list.count()):
            if self.list.item(i).data(ID_ROLE) == conversation_id:
                self.list.editItem(self.list.item(i))

    def _select(self, conversation) -> None:
        self.list.blockSignals(True)
        self.list.setCurrentItem(None)
        for i in range(self.list.count()):
            if conversation is not None and self.list.item(i).data(ID_ROLE) == conversation.id:
                self.list.setCurrentItem(self.list.item(i))
        self.list.blockSignals(False)

    def _on_current_changed(self, item: QListWidgetItem | None, _previous) -> None:
        if item is not None:
            self.controller.open_conversation(item.data(ID_ROLE))

    def _on_item_renamed(self, item: QListWidgetItem) -> None:
        self.controller.rename_conversation(item.data(ID_ROLE), item.text())

    def _delete_current(self) -> None:
        item = self.list.currentItem()
        if item is not None:
            self.delete(item.data(ID_ROLE))

    def delete(self, conversation_id: int) -> None:
        if self.confirm_delete:
            answer = QMessageBox.question(self, "Delete chat", "Delete this chat? This cannot be undone.")
            if answer != QMessageBox.StandardButton.Yes:
                return
        self.controller.delete_conversation(conversation_id)

    def _on_context_menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        conversation_id = item.data(ID_ROLE)
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.list.editItem(item))
        menu.addAction("Export…", lambda: self.export_requested.emit(conversation_id))
        menu.addSeparator()
        menu.addAction("Delete", lambda: self.delete(conversation_id))
        menu.exec(self.list.viewport().mapToGlobal(pos))
