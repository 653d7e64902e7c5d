"""Screenshots of the real app for the README, taken under a virtual X screen (Xvfb).

    .venv/bin/python scripts/screenshots.py [OUT_DIR]  # re-runs itself under xvfb-run when there is no display
Needs: apt-get install -y --no-install-recommends xvfb xauth libxcb-icccm4 libxcb-keysyms1
Writes OUT_DIR (default docs/screenshots)/{first-run,chat,panels,long-chat,background-answer,markdown,settings-error,
catalog-offline,error-dialog}.png. Uses a fresh data dir and the built-in demo model (random weights:
its answers are noise by design), with its own budgets, which make it stream.
"""
from __future__ import annotations

import sys
from pathlib import Path

from shots import Camera, run_with_display

SIZE = (1440, 900)

MARKDOWN_SAMPLE = """<think>The user wants a small example. A list comprehension is the shortest way.</think>
Here is a function that squares a list of numbers:

```python
def squares(numbers: list[int]) -> list[int]:
    \"\"\"Return the square of each number.\"\"\"
    return [n * n for n in numbers]

print(squares([1, 2, 3]))   # [1, 4, 9]
```

It uses a **list comprehension**; `map` would work too:

| approach | reads as |
|---|---|
| comprehension | `[n * n for n in numbers]` |
| map | `list(map(lambda n: n * n, numbers))` |
"""


def main() -> int:
    return run_with_display(__file__, SIZE, take_screenshots)


def take_screenshots(out: Path, _work: Path) -> int:
    from PySide6.QtCore import QTimer

    from app import paths
    from app.gui import create_application, open_main_window
    from app.views.main_window import MainWindow

    app = create_application()
    camera = Camera(app, out)
    window = MainWindow()
    window.setGeometry(0, 0, *SIZE)
    window.show()
    camera.pump(0.5)
    camera.shoot("first-run")
    _chat_and_panels(window, camera)
    long_chat_id = _long_chat(window, camera)
    _background_answer(window, camera, long_chat_id)
    _markdown(window, camera)
    _errors(window, camera)
    window.close()

    # The next start finds the chat history damaged: moved aside, a fresh one, a dialog that says where.
    paths.database_path().write_bytes(b"not an SQLite file " * 400)
    window = open_main_window()
    window.setGeometry(0, 0, *SIZE)
    camera.shoot("damaged-database")
    window.close()
    QTimer.singleShot(0, app.quit)
    app.exec()
    return 0


def _chat_and_panels(window, camera: Camera) -> None:
    """The demo model answering, with the live panels mid-answer and the finished chat beside its speed."""
    from app.store import ChatSettings
    pump, wait_until, shot = camera.pump, camera.wait_until, camera.shoot
    window.start_demo()              # the demo's own budgets: RAM cache hits and misses, disk reads
    wait_until(lambda: window.model_info is not None, 120)
    window.controller.new_conversation()
    window.controller.set_chat_settings(ChatSettings(max_new_tokens=440, temperature=0.8, seed=7))
    window.composer.edit.setPlainText("Explain how a mixture-of-experts model picks its experts.")
    window.composer.submit()
    pump(1.5)                            # mid-answer (~250 tokens at ~200 tok/s): the plots have history
    shot("panels")
    wait_until(lambda: not window.controller.is_generating, 120)
    wait_until(lambda: "possible" in window.speed_label.text(), 60)    # the fastest possible, beside the measured
    window.panels_dock.setVisible(False)
    shot("chat")


def _long_chat(window, camera: Camera) -> int:
    """A long chat, past the demo's old 512-token limit and past its 4,096-token context: the middle is dropped."""
    from app.store import ChatSettings
    wait_until, shot = camera.wait_until, camera.shoot
    long_chat = window.store.create_conversation("A long chat", ChatSettings(max_new_tokens=120, seed=3))
    for i in range(7):
        window.store.add_message(long_chat.id, "user", f"Question {i + 1}: " + "how do experts stream from disk? " * 20)
        window.store.add_message(long_chat.id, "assistant", f"Answer {i + 1}: " + "the cache keeps hot experts close. " * 20)
    window.conversations.refresh()
    window.controller.open_conversation(long_chat.id)
    window.composer.edit.setPlainText("And what happens when the chat is longer than the context?")
    window.composer.submit()
    wait_until(lambda: not window.controller.is_generating, 120)
    window.chat_view.ensureWidgetVisible(window.chat_view.context_marker)
    shot("long-chat")
    return long_chat.id


def _background_answer(window, camera: Camera, other_chat_id: int) -> None:
    """An answer streaming in one chat while the user reads another."""
    from app.store import ChatSettings
    pump, wait_until, shot = camera.pump, camera.wait_until, camera.shoot
    window.controller.new_conversation()
    window.controller.set_chat_settings(ChatSettings(max_new_tokens=2000, seed=11))
    window.composer.edit.setPlainText("Write a long story about a river.")
    window.composer.submit()
    pump(0.5)
    window.controller.open_conversation(conversation_id=other_chat_id)
    window.composer.edit.setPlainText("A follow-up, typed while the other chat is answered")
    shot("background-answer")
    window.controller.stop()
    wait_until(lambda: not window.controller.is_generating, 60)
    window.composer.edit.clear()
    window.panels_dock.setVisible(True)


def _markdown(window, camera: Camera) -> None:
    """Markdown rendering: an answer with a thought, code and a table, stored as a finished message."""
    conversation = window.store.create_conversation("Markdown rendering")
    window.store.add_message(conversation.id, "user", "Show me how to square a list in Python.")
    window.store.add_message(conversation.id, "assistant", MARKDOWN_SAMPLE,
                             stats={"model": "example answer (not generated)", "tok_s": 0, "num_tokens": 0})
    window.conversations.refresh()
    window.controller.open_conversation(conversation.id)
    camera.shoot("markdown")


def _errors(window, camera: Camera) -> None:
    """Bad settings said in place, the catalog offline with Retry, a budget too small as a dialog."""
    wait_until, shot = camera.wait_until, camera.shoot
    window.edit_app_settings()                   # a size the model cannot use: said in place, dialog stays
    dialog = window.last_dialog
    dialog.vram_budget.setText("1MB")
    dialog.ram_cache.setText("lots")
    dialog.accept()
    shot("settings-error", dialog)
    dialog.reject()

    from app.setup import open_download_wizard     # offline: the catalog, and the search error with Retry
    wizard = open_download_wizard(window, window.settings.models_path(), lambda path: None)
    wizard.search_page.query.setText("qwen moe")
    wizard.search_page.search()
    wait_until(wizard.search_page.retry_button.isVisible, 30)
    shot("catalog-offline", wizard)
    wizard.reject()

    window.apply_app_settings(type(window.settings)(**{**window.settings.__dict__, "vram_budget": "1MB"}))
    wait_until(lambda: window.last_dialog is not None and window.last_dialog.objectName() == "errorDialog", 60)
    shot("error-dialog")
    window.last_dialog.accept()


if __name__ == "__main__":
    sys.exit(main())
