"""Chats the way LM Studio users expect: long chats, answers that keep streaming in the background,
one generation at a time, and Send/Stop/status that always match the engine (demo model, real engine)."""
from PySide6.QtCore import Qt

from app_helpers import WAIT_MS
from app.store import ChatSettings
from app.views.conversation_list import STREAMING_ROLE


def _long_chat(window, num_exchanges: int) -> int:
    """A chat stored as if typed earlier: each exchange ~700 tokens of the demo tokenizer."""
    store = window.store
    conversation = store.create_conversation("Long chat", ChatSettings(max_new_tokens=16, seed=1))
    for i in range(num_exchanges):
        store.add_message(conversation.id, "user", f"question {i}: " + "experts stream from disk " * 60)
        store.add_message(conversation.id, "assistant", f"answer {i}: " + "the cache keeps hot experts " * 60)
    window.conversations.refresh()
    window.controller.open_conversation(conversation.id)
    return conversation.id


def test_a_chat_past_the_context_keeps_going_and_marks_where_turns_were_dropped(qtbot, loaded_window):
    window = loaded_window
    assert window.model_info["max_context"] == 4096                      # the demo's old limit was 512
    _long_chat(window, 8)                                                # ~5,600 tokens: past the context
    with qtbot.waitSignal(window.controller.message_finished, timeout=WAIT_MS) as finished:
        window.send("and now?")
    answer = finished.args[0]
    assert answer.state == "done" and answer.content
    context = answer.stats["context"]
    assert context["num_dropped"] >= 2 and context["prompt_tokens"] + 16 <= 4096
    messages = window.controller.messages()
    first_dropped = messages.index(next(m for m in messages if m.id == context["dropped_ids"][0]))
    assert first_dropped == 2                              # the first exchange is kept (default policy)
    marker = window.chat_view.context_marker
    last = first_dropped + context["num_dropped"]          # 1-based numbers of the dropped messages: 3..last
    assert marker.isVisible() and marker.text().startswith(f"Messages 3–{last} are out of the model's context")
    assert f"messages {last + 1} onwards it saw" in marker.text()
    layout = window.chat_view._layout
    last_dropped = window.chat_view.widgets[context["dropped_ids"][-1]]
    assert layout.indexOf(marker) == layout.indexOf(last_dropped) + 1
    window.controller.open_conversation(None)                            # reopened later: still marked
    window.controller.open_conversation(answer.conversation_id)
    assert window.chat_view.context_marker.isVisible()


def _streaming_chat(qtbot, window, max_new_tokens: int, seed: int, text: str) -> int:
    """A new chat whose long answer is streaming (two chunks in); returns its id."""
    controller = window.controller
    controller.new_conversation()
    chat = controller.conversation.id
    controller.set_chat_settings(ChatSettings(max_new_tokens=max_new_tokens, seed=seed))
    chunks = []
    window.host.chunk.connect(lambda *_: chunks.append(1))
    window.send(text)
    qtbot.waitUntil(lambda: len(chunks) >= 2, timeout=WAIT_MS)
    return chat


def test_an_answer_keeps_streaming_while_another_chat_is_open_and_one_runs_at_a_time(qtbot, loaded_window):
    window = loaded_window
    controller, conversations = window.controller, window.conversations
    first = _streaming_chat(qtbot, window, 300, 3, "a long answer please")
    controller.new_conversation()                                         # look at another chat meanwhile
    second = controller.conversation.id
    row = conversations.ids().index(first)
    assert conversations.list.item(row).data(STREAMING_ROLE) is True     # the list marks the busy chat
    assert not conversations.list.item(conversations.ids().index(second)).data(STREAMING_ROLE)
    composer = window.composer
    assert composer.send_button.text() == "Send" and not composer.send_button.isEnabled()
    assert composer.busy_banner.isVisible() and "one chat at a time" in composer.busy_label.text()
    qtbot.keyClicks(composer.edit, "my turn")
    qtbot.keyClick(composer.edit, Qt.Key.Key_Return)                      # refused, the text stays
    assert composer.edit.toPlainText() == "my turn" and controller.messages() == []
    with qtbot.waitSignal(controller.message_finished, timeout=WAIT_MS) as finished:
        pass
    answer = finished.args[0]
    assert answer.conversation_id == first and answer.state == "done"
    assert answer.stats["finish_reason"] in ("length", "eos") and len(answer.content) > 20
    assert not composer.busy_banner.isVisible() and composer.send_button.isEnabled()
    assert not any(conversations.list.item(i).data(STREAMING_ROLE) for i in range(conversations.list.count()))
    controller.open_conversation(first)
    assert window.chat_view.widgets[answer.id].message.content == answer.content


def test_switching_back_to_a_streaming_chat_shows_it_live_with_stop(qtbot, loaded_window):
    window = loaded_window
    controller = window.controller
    first = _streaming_chat(qtbot, window, 400, 5, "go on")
    controller.new_conversation()
    controller.open_conversation(first)
    assert window.composer.send_button.text() == "Stop" and window.composer.send_button.isEnabled()
    stream_id = controller.messages()[-1].id
    widget = window.chat_view.widgets[stream_id]
    before = len(widget.message.content)
    qtbot.waitUntil(lambda: len(widget.message.content) > before, timeout=WAIT_MS)   # still arriving here
    with qtbot.waitSignal(controller.message_finished, timeout=WAIT_MS):
        qtbot.mouseClick(window.composer.send_button, Qt.MouseButton.LeftButton)      # Stop
    assert window.composer.send_button.text() == "Send" and window.speed_label.text() != "generating…"


def test_send_stop_and_status_match_the_engine_after_stop_before_the_first_token_and_errors(qtbot, loaded_window):
    window = loaded_window
    controller = window.controller
    controller.new_conversation()
    with qtbot.waitSignal(controller.message_finished, timeout=WAIT_MS) as finished:
        window.send("hello")
        assert window.speed_label.text() == "generating…" and window.composer.send_button.text() == "Stop"
        controller.stop()                                                 # before any token arrived
    assert finished.args[0].stats["finish_reason"] == "cancelled"
    assert window.speed_label.text() == "" and window.composer.send_button.text() == "Send"
    with qtbot.waitSignal(controller.message_finished, timeout=WAIT_MS) as failed:
        window.send("experts " * 5000)                                    # one message longer than the context
    assert failed.args[0].state == "error"
    window.last_dialog.accept()
    assert window.speed_label.text() == "" and window.composer.send_button.text() == "Send"
    assert window.composer.send_button.isEnabled() and not controller.is_generating
