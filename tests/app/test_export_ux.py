"""Export follows the chosen filter's extension, remembers the last folder, and keeps failed answers' errors."""
import json

from PySide6.QtWidgets import QFileDialog

from app_helpers import make_window
from app.export import path_for_filter, stats_line, to_markdown
from app.store import Store


def test_the_chosen_filter_gives_the_extension():
    assert path_for_filter("/tmp/trip", "JSON (*.json)").name == "trip.json"
    assert path_for_filter("/tmp/trip", "Markdown (*.md)").name == "trip.md"
    assert path_for_filter("/tmp/trip.json", "Markdown (*.md)").name == "trip.json"   # a typed extension wins
    assert path_for_filter("/tmp/v1.2", "JSON (*.json)").name == "v1.2.json"


def test_failed_answers_export_with_their_error_and_counts_read_well(tmp_path):
    store = Store(tmp_path / "chat.db")
    conversation = store.create_conversation("Trip")
    store.add_message(conversation.id, "user", "where?")
    store.add_message(conversation.id, "assistant", "", state="error", stats={"error": "The disk is full."})
    text = to_markdown(conversation, store.messages(conversation.id))
    assert "_This answer failed: The disk is full._" in text
    assert stats_line({"num_tokens": 1}) == "1 token" and stats_line({"num_tokens": 1200}) == "1,200 tokens"
    assert "context is full" in stats_line({"finish_reason": "context_full"})


def test_export_dialog_follows_the_filter_and_remembers_the_folder(qtbot, data_dir, tmp_path, monkeypatch):
    window = make_window(qtbot, data_dir)
    window.controller.new_conversation()
    window.store.add_message(window.controller.conversation.id, "user", "hello")
    folder = tmp_path / "exports"
    folder.mkdir()
    asked = []

    def save_dialog(parent, caption, start, filters):
        asked.append(start)
        return str(folder / "my chat"), "JSON (*.json)"          # typed without an extension
    monkeypatch.setattr(QFileDialog, "getSaveFileName", save_dialog)
    written = window.export_conversation()
    assert written == folder / "my chat.json" and json.loads(written.read_text())["messages"][0]["content"] == "hello"
    window.export_conversation()
    assert asked[1].startswith(str(folder))                       # the next export opens where the last went
    assert window.shutdown()
