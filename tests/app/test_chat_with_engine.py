"""The chat driven through the real widgets, the real engine thread and the demo model."""
import json
import re
import sqlite3

from PySide6.QtCore import Qt

from app import paths
from app.store import ChatSettings

from app_helpers import SMALL_BUDGETS, WAIT_MS, make_window


def _type_and_send(qtbot, window, text: str) -> None:
    window.composer.edit.setFocus()
    qtbot.keyClicks(window.composer.edit, text)
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)


def test_prompt_streams_into_the_view_lands_in_sqlite_and_is_back_after_restart(qtbot, loaded_window, data_dir):
    window = loaded_window
    window.controller.new_conversation()
    window.controller.set_chat_settings(ChatSettings(max_new_tokens=40, temperature=0.8, seed=3))
    streamed, saved_while_streaming = [], []

    def on_streamed(message_id, content):
        streamed.append(content)
        with sqlite3.connect(paths.database_path()) as other:     # another reader, like a crash would leave
            saved_while_streaming.append(other.execute("SELECT content, state FROM messages WHERE id=?",
                                                       (message_id,)).fetchone())

    window.controller.message_streamed.connect(on_streamed)
    with qtbot.waitSignal(window.controller.message_finished, timeout=WAIT_MS) as finished:
        _type_and_send(qtbot, window, "Tell me about experts")
    answer = finished.args[0]

    assert len(streamed) >= 5                              # it arrived in pieces, not at the end
    assert all(len(a) <= len(b) for a, b in zip(streamed, streamed[1:]))
    # saved as it streamed, in batches (app.stream_saver): each saved text a prefix of what had streamed then
    assert all(state == "streaming" and shown.startswith(saved)
               for (saved, state), shown in zip(saved_while_streaming, streamed))
    assert any(saved for saved, _ in saved_while_streaming)
    assert answer.content == streamed[-1] and answer.state == "done"
    assert answer.stats["num_tokens"] >= 2 and answer.stats["tok_s"] > 0 and answer.stats["ttft_s"] > 0
    widget = window.chat_view.widgets[answer.id]
    assert "tok/s" in widget.stats_label.text() and "TTFT" in widget.stats_label.text()
    conversation_id = window.controller.conversation.id
    assert window.conversations.list.currentItem().text() == "Tell me about experts"   # titled from the prompt
    assert window.shutdown()

    again = make_window(qtbot, data_dir)
    assert again.controller.conversation.id == conversation_id
    restored = [w.message for w in again.chat_view.widgets.values()]
    assert [(m.role, m.content) for m in restored] == [("user", "Tell me about experts"), ("assistant", answer.content)]
    assert restored[1].stats["tok_s"] == answer.stats["tok_s"]
    assert again.shutdown()


def test_stop_mid_answer_stops_within_one_token(qtbot, loaded_window):
    window = loaded_window
    window.controller.set_chat_settings(ChatSettings(max_new_tokens=400, temperature=0.8, seed=1))
    chunks = []
    window.host.chunk.connect(lambda _id, _text, num_tokens: chunks.append(num_tokens))
    window.send("Talk for a long time")
    qtbot.waitUntil(lambda: len(chunks) >= 5, timeout=WAIT_MS)
    assert window.composer.send_button.text() == "Stop"
    with qtbot.waitSignal(window.controller.message_finished, timeout=WAIT_MS) as finished:
        generated_at_stop = window.host.telemetry()["tokens"]["generated"]
        qtbot.keyClick(window.composer.edit, Qt.Key.Key_Escape)          # Esc stops
    stats = finished.args[0].stats
    assert stats["finish_reason"] == "cancelled"
    assert generated_at_stop <= stats["num_tokens"] <= generated_at_stop + 1
    assert stats["num_tokens"] < 400
    assert "stopped" in window.chat_view.widgets[finished.args[0].id].stats_label.text()
    assert window.composer.send_button.text() == "Send"


def test_regenerate_replaces_the_answer_and_edit_resends(qtbot, loaded_window):
    window = loaded_window
    window.controller.set_chat_settings(ChatSettings(max_new_tokens=12, temperature=1.0))
    with qtbot.waitSignal(window.controller.message_finished, timeout=WAIT_MS) as first:
        window.send("First question")
    first_answer = first.args[0]
    regenerate = window.chat_view.widgets[first_answer.id].regenerate_button
    assert regenerate.isVisible()
    with qtbot.waitSignal(window.controller.message_finished, timeout=WAIT_MS) as second:
        qtbot.mouseClick(regenerate, Qt.MouseButton.LeftButton)
    messages = window.controller.messages()
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].id == second.args[0].id != first_answer.id and messages[1].content

    user_widget = window.chat_view.widgets[messages[0].id]
    qtbot.mouseClick(user_widget.edit_button, Qt.MouseButton.LeftButton)
    assert window.composer.edit.toPlainText() == "First question" and window.composer.edit_banner.isVisible()
    window.composer.edit.selectAll()
    with qtbot.waitSignal(window.controller.message_finished, timeout=WAIT_MS) as third:
        _type_and_send(qtbot, window, "Edited question")
    messages = window.controller.messages()
    assert [(m.role, m.content) for m in messages][0] == ("user", "Edited question")
    assert len(messages) == 2 and messages[1].id == third.args[0].id
    assert sorted(window.chat_view.widgets) == [m.id for m in messages]      # the view shows exactly the store


def test_export_markdown_and_json_contain_the_conversation(qtbot, loaded_window, tmp_path):
    window = loaded_window
    window.controller.new_conversation()
    window.controller.set_chat_settings(ChatSettings(system_prompt="Be brief.", max_new_tokens=10))
    with qtbot.waitSignal(window.controller.message_finished, timeout=WAIT_MS) as finished:
        window.send("Export me")
    answer = finished.args[0]
    markdown = window.export_conversation(tmp_path / "chat.md").read_text()
    data = json.loads(window.export_conversation(tmp_path / "chat.json").read_text())
    assert "Export me" in markdown and answer.content in markdown and "Be brief." in markdown
    assert [(m["role"], m["content"]) for m in data["messages"]] == [("user", "Export me"),
                                                                    ("assistant", answer.content)]
    assert data["settings"]["system_prompt"] == "Be brief." and data["messages"][1]["stats"]["num_tokens"] >= 1


def _numbers(text: str) -> dict:
    return {k: int(v) for k, v in re.findall(r"(hits|misses|evictions) (\d+)", text)}


def test_panels_show_cache_hits_misses_and_disk_bytes_after_a_generation(qtbot, loaded_window):
    window = loaded_window
    window.controller.set_chat_settings(ChatSettings(max_new_tokens=24))
    with qtbot.waitSignals([window.controller.message_finished, window.host.estimated], timeout=WAIT_MS):
        window.send("Fill the cache")
    qtbot.wait(300)                                         # a few 10 Hz refreshes
    panels = window.panels
    counts = _numbers(panels.cache_label.text())
    assert counts["hits"] > 0 and counts["misses"] > 0
    assert re.search(r"engine read [1-9][\d.]* (KiB|MiB)", panels.disk_label.text())
    assert panels.device_label.text() == "CPU"
    assert re.search(r"^[1-9][\d.]* (MiB|GiB) besides the cache$", panels.memory_label.text())   # CPU: no driver figure
    per_bank = window.host.worker.engine.info["slots_per_bank"]            # every slot of both banks is drawn
    assert per_bank >= 4 and len(panels.slot_map.slots) == 2 * per_bank
    assert {s["bank"] for s in panels.slot_map.slots} == {0, 1}
    assert any(s["state"] != "empty" for s in panels.slot_map.slots)
    assert "layer" in panels.slot_map.describe(next(s for s in panels.slot_map.slots if s["state"] != "empty"))
    assert panels.core_label.text() != "—"
    if window.host.worker.pinned_cores:                     # torch's threads for the engine thread's ops
        from engine.plan.hardware import compute_threads
        count = window.host.worker.compute_threads
        assert 1 <= count <= compute_threads(window.host.worker.pinned_cores)     # as hardware.compute_threads allows
        assert f"; {count} compute thread" in panels.core_label.text()
    assert window.model_label.text().startswith("Sluice demo")
    # the fastest this machine could go at these hit rates (the estimate), beside the measured speed
    assert re.search(r"tok/s of \d+\.\d possible", window.speed_label.text())
    assert "fastest this machine could go" in window.speed_label.toolTip()
    qtbot.waitUntil(lambda: re.search(r"possible \d+\.\d", panels.speed_label.text()), timeout=3000)  # 1 Hz idle


def test_switching_model_while_generating_keeps_the_partial_answer(qtbot, loaded_window, demo_model):
    window = loaded_window
    window.controller.set_chat_settings(ChatSettings(max_new_tokens=400, seed=2))
    chunks = []
    window.host.chunk.connect(lambda *_: chunks.append(1))
    window.send("A long one")
    qtbot.waitUntil(lambda: len(chunks) >= 3, timeout=WAIT_MS)
    with qtbot.waitSignals([window.controller.message_finished, window.model_loaded], timeout=WAIT_MS):
        window.load_model(demo_model)
    answer = window.controller.messages()[-1]
    assert answer.state == "done" and answer.stats["finish_reason"] == "cancelled" and answer.content
    assert window.model_info is not None


def test_closing_the_window_while_generating_saves_the_answer_and_ends_the_thread(qtbot, data_dir, demo_model):
    window = make_window(qtbot, data_dir, **SMALL_BUDGETS)
    with qtbot.waitSignal(window.model_loaded, timeout=WAIT_MS):
        window.load_model(demo_model)
    window.controller.set_chat_settings(ChatSettings(max_new_tokens=400, seed=4))
    chunks = []
    window.host.chunk.connect(lambda *_: chunks.append(1))
    window.send("Keep going")
    qtbot.waitUntil(lambda: len(chunks) >= 3, timeout=WAIT_MS)
    window.close()
    assert not window.host.thread.isRunning()
    with sqlite3.connect(paths.database_path()) as db:
        content, state, stats = db.execute("SELECT content, state, stats FROM messages WHERE role='assistant'").fetchone()
    assert content and state == "done" and json.loads(stats)["finish_reason"] == "cancelled"


def test_a_budget_too_small_is_one_sentence_in_a_dialog_and_the_app_stays_usable(qtbot, data_dir, demo_model):
    window = make_window(qtbot, data_dir, vram_budget="1MB")
    with qtbot.waitSignal(window.host.load_failed, timeout=WAIT_MS):
        window.load_model(demo_model)
    dialog = window.last_dialog
    assert dialog is not None and dialog.isVisible() and dialog.objectName() == "errorDialog"
    text = dialog.text()
    assert "VRAM budget" in text and "Traceback" not in text and text.count(". ") == 0
    assert window.model_label.text() == "No model"
    dialog.accept()
    window.apply_app_settings(type(window.settings)(**{**window.settings.__dict__, **SMALL_BUDGETS}))
    with qtbot.waitSignal(window.model_loaded, timeout=WAIT_MS):
        window.load_model(demo_model)
    assert window.shutdown()


def test_a_prompt_longer_than_the_context_is_one_sentence_and_the_next_chat_works(qtbot, loaded_window):
    window = loaded_window
    window.controller.new_conversation()
    with qtbot.waitSignal(window.controller.message_finished, timeout=WAIT_MS) as failed:
        window.send("experts " * 5000)                     # the demo model's context is 4,096 tokens
    assert failed.args[0].state == "error"
    text = window.last_dialog.text()
    assert re.match(r"This message is too long: your message takes [\d,]+ tokens, and the model's context holds "
                    r"4,096 tokens", text) and "\n" not in text and text.count(". ") == 0
    assert failed.args[0].stats["error"] == text
    window.last_dialog.accept()
    window.controller.new_conversation()
    window.controller.set_chat_settings(ChatSettings(max_new_tokens=8))
    with qtbot.waitSignal(window.controller.message_finished, timeout=WAIT_MS) as answered:
        window.send("short")
    assert answered.args[0].state == "done" and answered.args[0].content
