"""The Local server panel: the app's loaded engine served over HTTP, shared with in-app chats through one queue."""
import socket
from pathlib import Path

import httpx
from PySide6.QtCore import Qt

from app.store import ChatSettings

from app_helpers import WAIT_MS

HI = [{"role": "user", "content": "hello"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_panel_serves_the_loaded_model_and_shares_the_engine_with_chats(qtbot, loaded_window):
    window, panel = loaded_window, loaded_window.server_panel
    window.server_action.trigger()                     # the toolbar's Server button opens the panel
    assert window.server_dock.isVisible()
    served_id = Path(window.host.worker.engine.info["path"]).name
    assert f'"model": "{served_id}"' in panel.curl.toPlainText()    # before it starts: the id it will serve
    panel.port.setValue(free_port())
    panel.key.setText("sk-panel")
    qtbot.mouseClick(panel.switch, Qt.MouseButton.LeftButton)
    assert panel.local.running, window.last_dialog and window.last_dialog.text()
    url = panel.local.server.url
    assert url in panel.status.text() and "sluice-demo" in panel.status.text()
    assert f"curl {url}/v1/chat/completions" in panel.curl.toPlainText()
    assert "Bearer sk-panel" in panel.curl.toPlainText() and not panel.key.isEnabled()

    headers = {"Authorization": "Bearer sk-panel"}
    answer = httpx.post(url + "/v1/chat/completions", headers=headers, timeout=60,
                        json={"messages": HI, "max_tokens": 4, "temperature": 0}).json()
    assert answer["usage"]["completion_tokens"] == 4
    qtbot.waitUntil(lambda: "POST /v1/chat/completions 200" in panel.log.toPlainText(), timeout=WAIT_MS)
    assert httpx.post(url + "/v1/chat/completions", json={"messages": HI}).status_code == 401

    # A server request generating: the app's chat waits its turn in the same queue, then answers.
    window.controller.new_conversation()
    window.controller.set_chat_settings(ChatSettings(max_new_tokens=5, temperature=0.0))
    with httpx.Client(headers=headers, timeout=60) as client:
        with client.stream("POST", url + "/v1/chat/completions",
                           json={"messages": HI, "max_tokens": 300, "stream": True}) as stream:
            lines = stream.iter_lines()           # kept: a dropped iterator closes the connection
            next(lines)
            window.send("in-app question")
            qtbot.waitUntil(lambda: panel.local.counters()["queued"] == 1, timeout=WAIT_MS)
            panel._update_counters()
            assert "queued 1 · generating 1" in panel.counters.text()
            with qtbot.waitSignal(window.controller.message_finished, timeout=WAIT_MS) as finished:
                pass                                   # leaving the stream disconnects: the app's turn comes
    assert finished.args[0].state == "done" and finished.args[0].stats["num_tokens"] == 5
    assert panel.local.counters()["served"] >= 3

    qtbot.mouseClick(panel.switch, Qt.MouseButton.LeftButton)
    assert not panel.local.running and panel.status.text() == "Off" and panel.key.isEnabled()
    panel._update_counters()
    assert panel.counters.text() == "not serving"
    try:
        httpx.get(url + "/health", timeout=2)
        raise AssertionError("the server still answers after Stop")
    except httpx.TransportError:
        pass


def test_server_panel_refuses_to_start_without_a_model(qtbot, data_dir):
    from app_helpers import make_window
    window = make_window(qtbot, data_dir)
    window.server_action.trigger()
    qtbot.mouseClick(window.server_panel.switch, Qt.MouseButton.LeftButton)
    assert not window.server_panel.local.running and not window.server_panel.switch.isChecked()
    assert window.last_dialog.text() == "Load a model first; the server serves the model the app has loaded."
    assert window.shutdown()
