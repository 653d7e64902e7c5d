"""The app chatting with a model on a remote OpenAI-compatible endpoint: a second, real `sluice serve` process."""
import json

import httpx
import pytest
from PySide6.QtCore import Qt

from app.store import ChatSettings
from tests.serve.serve_helpers import start_server

from app_helpers import WAIT_MS, make_window

KEY = "sk-remote"
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    from engine.tools.demo import build_demo_model
    model = build_demo_model(tmp_path_factory.mktemp("remote") / "remote-demo")
    server = start_server(model, api_key=KEY)
    yield server
    server.stop()


def add_endpoint(qtbot, window, url: str, key: str) -> str:
    """Through the Remote endpoints dialog; returns its status line."""
    window.open_remote_endpoints()
    dialog = window.last_dialog
    dialog.url_edit.setText(url)
    dialog.key_edit.setText(key)
    qtbot.mouseClick(dialog.connect_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.connect_button.isEnabled(), timeout=WAIT_MS)
    status = dialog.status.text()
    dialog.close()
    return status


def test_remote_model_chats_with_client_side_speed_and_panels_say_remote(qtbot, data_dir, remote):
    window = make_window(qtbot, data_dir)
    assert add_endpoint(qtbot, window, remote.url, KEY).startswith("Connected: 1 model")
    index = window.model_picker.findText("remote-demo", Qt.MatchFlag.MatchStartsWith)
    assert index > 0 and "remote: 127.0.0.1" in window.model_picker.itemText(index)
    with qtbot.waitSignal(window.model_loaded, timeout=WAIT_MS) as loaded:
        window.model_picker.setCurrentIndex(index)
        window.model_picker.activated.emit(index)
    assert loaded.args[0]["device"] == "remote"
    assert window.device_label.text() == "Remote"

    window.controller.new_conversation()
    window.controller.set_chat_settings(ChatSettings(max_new_tokens=12, temperature=0.0))
    with qtbot.waitSignal(window.controller.message_finished, timeout=WAIT_MS) as finished:
        window.send("hello world")
    answer = finished.args[0]
    assert answer.state == "done" and answer.stats["num_tokens"] >= 2
    assert answer.stats["tok_s"] > 0 and answer.stats["ttft_s"] > 0

    expected = httpx.post(remote.url + "/v1/chat/completions", headers=remote.headers, json={
        "messages": [{"role": "user", "content": "hello world"}], "max_tokens": 12, "temperature": 0}, timeout=60).json()
    assert answer.content == expected["choices"][0]["message"]["content"]       # the same model, the same tokens

    window.panels.refresh()
    assert window.panels.remote_label.isVisible() or not window.panels.isVisible()
    assert "runs remotely" in window.panels.remote_label.text()
    slot_map = window.panels.slot_map                       # not "load a model": one is loaded, remotely
    assert not slot_map.slots and slot_map.empty_text == "No slots here: a remote model runs on its own server."
    assert window.panels.slots_box.title() == "Device slots" and window.panels.slot_legend.isHidden()
    assert window.panels.core_label.text() == "none here: the model decodes on its server"     # not this PC's cores
    assert window.shutdown()


def test_endpoint_errors_are_one_sentence(qtbot, data_dir, remote):
    window = make_window(qtbot, data_dir)
    status = add_endpoint(qtbot, window, remote.url, "wrong-key")
    assert "refused the API key (401)" in status and status.endswith(".") and "\n" not in status
    status = add_endpoint(qtbot, window, "http://127.0.0.1:9", "")
    assert status.startswith("Cannot reach 127.0.0.1:9")
    assert window.settings.remote_endpoints == []
    assert window.shutdown()


def test_a_remote_chat_with_a_schema_answers_in_it(qtbot, data_dir, remote):
    """The chat's "Structured output" goes to the endpoint as response_format; a random-weight model
    answers JSON only if the remote server constrains it."""
    window = make_window(qtbot, data_dir)
    add_endpoint(qtbot, window, remote.url, KEY)
    index = window.model_picker.findText("remote-demo", Qt.MatchFlag.MatchStartsWith)
    with qtbot.waitSignal(window.model_loaded, timeout=WAIT_MS):
        window.model_picker.setCurrentIndex(index)
        window.model_picker.activated.emit(index)
    window.controller.new_conversation()
    window.controller.set_chat_settings(ChatSettings(max_new_tokens=16, temperature=0.9, seed=2,
                                                     structured_output=json.dumps(SCHEMA)))
    with qtbot.waitSignal(window.controller.message_finished, timeout=WAIT_MS) as finished:
        window.send("Is it?")
    assert isinstance(json.loads(finished.args[0].content)["ok"], bool)
    assert window.shutdown()
