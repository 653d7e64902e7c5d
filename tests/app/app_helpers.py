"""Helpers shared by the app tests."""

# No budgets set: the demo model (4 layers x 16 experts of 12 KiB, top-4) then loads with its own, which make
# it really stream: 6 device slots per bank and a 32-block RAM cache, against 64 experts
# (engine.tools.demo.DEMO_LOAD_OPTIONS).
SMALL_BUDGETS = {"vram_budget": "", "ram_cache": ""}
WAIT_MS = 30_000


def make_window(qtbot, data_dir, **settings):
    """A MainWindow on the data dir, with app settings applied before it starts."""
    from app import paths
    from app.settings import AppSettings
    from app.store import Store
    from app.views.main_window import MainWindow
    store = Store(paths.database_path())
    app_settings = AppSettings.load(store)
    for key, value in settings.items():
        setattr(app_settings, key, value)
    app_settings.save(store)
    window = MainWindow(store=store, autoload=False)
    qtbot.addWidget(window)
    window.show()
    return window


def open_stored_answer(qtbot, data_dir, title: str, question: str, answer: str):
    """A window with the chat alone (no panels) showing a stored conversation: (window, the answer's widget)."""
    from app import paths
    from app.store import Store
    store = Store(paths.database_path())
    conversation = store.create_conversation(title)
    store.add_message(conversation.id, "user", question)
    message = store.add_message(conversation.id, "assistant", answer)
    store.close()
    window = make_window(qtbot, data_dir)                  # a chat in the history: the chat page shows
    window.panels_action.setChecked(False)
    window.controller.open_conversation(conversation.id)
    return window, window.chat_view.widgets[message.id]


def copy_link_rect(body):
    """The Copy link of the first code block, in the coordinates of the message body's viewport."""
    from PySide6.QtGui import QTextCursor
    document = body.document()
    found = document.find("Copy")
    assert found.charFormat().anchorHref() == "copy-code:0"
    start, end = QTextCursor(document), QTextCursor(document)
    start.setPosition(found.selectionStart())
    end.setPosition(found.selectionEnd())
    return body.cursorRect(start).united(body.cursorRect(end))
