"""Screenshots of the Local server panel and of a remote model chatting, for the README.

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/screenshots_server.py [OUT_DIR]
Writes OUT_DIR (default docs/screenshots)/{server-panel,remote-chat}.png. Builds the demo model (random weights: its
answers are noise by design), serves it from a second `sluice serve` process for the remote chat.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from shots import Camera, run_with_display

SIZE = (1440, 900)


def main() -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    return run_with_display(__file__, SIZE, take_screenshots)


def take_screenshots(out: Path, work: Path) -> int:
    from PySide6.QtCore import QTimer

    from app.gui import create_application
    from app.views.main_window import MainWindow
    from engine.tools.demo import build_demo_model

    app = create_application()
    camera = Camera(app, out)
    model = build_demo_model(work / "models" / "sluice-demo")
    window = MainWindow()
    window.setGeometry(0, 0, *SIZE)
    window.show()
    window.settings.vram_budget, window.settings.ram_cache = "1400KB", "400KB"
    window.load_model(model)
    camera.wait_until(lambda: window.model_info is not None)
    try:
        _server_panel(window, camera)
        _remote_chat(window, camera, build_demo_model(work / "remote" / "remote-demo"))
    finally:
        window.close()
    QTimer.singleShot(0, app.quit)
    app.exec()
    return 0


def _server_panel(window, camera: Camera) -> None:
    """The Local server panel, serving while a client streams and the app's own chat waits its turn."""
    import httpx

    from app.store import ChatSettings
    pump, wait_until = camera.pump, camera.wait_until
    panel = window.server_panel
    window.panels_dock.setVisible(False)
    window.server_dock.setVisible(True)
    panel.port.setValue(8765)
    panel.key.setText("sk-sluice-Xo3v7Qm2yH5kP8rT1wZc")
    panel.switch.setChecked(True)
    headers = {"Authorization": f"Bearer {panel.key.text()}"}
    url = panel.local.server.url
    httpx.get(url + "/v1/models", headers=headers)
    httpx.post(url + "/v1/chat/completions", headers=headers, timeout=60,
               json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
    httpx.post(url + "/api/chat", headers=headers, timeout=60, json={
        "messages": [{"role": "user", "content": "Hi"}], "stream": False, "options": {"num_predict": 8}})
    httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]})   # 401
    window.controller.new_conversation()
    window.controller.set_chat_settings(ChatSettings(max_new_tokens=60, temperature=0.8, seed=3))
    with httpx.Client(headers=headers, timeout=60) as client:
        with client.stream("POST", url + "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 120, "stream": True}) as r:
            lines = r.iter_lines()
            next(lines)
            window.send("What does the server do?")
            pump(1.0)
            panel._update_counters()
            camera.shoot("server-panel", window)
    wait_until(lambda: not window.controller.is_generating)
    panel.switch.setChecked(False)


def _remote_chat(window, camera: Camera, remote_model: Path) -> None:
    """A remote model: a second `sluice serve` process, added as an endpoint and chatting."""
    import httpx

    from app.store import ChatSettings
    wait_until = camera.wait_until
    sluice = str(Path(sys.executable).parent / "sluice")
    process = subprocess.Popen([sluice, "serve", str(remote_model), "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        remote_url = process.stdout.readline().split(" at ")[1].split(" ")[0]
        for _ in range(3):                   # warm its RAM cache, as a server that has been running is
            httpx.post(remote_url + "/v1/chat/completions", timeout=120,
                       json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40})
        window.open_remote_endpoints()
        dialog = window.last_dialog
        dialog.url_edit.setText(remote_url)
        dialog.connect_endpoint()
        wait_until(lambda: dialog.connect_button.isEnabled())
        dialog.close()
        index = next(i for i in range(window.model_picker.count()) if "remote:" in window.model_picker.itemText(i))
        window.model_picker.setCurrentIndex(index)
        window._on_model_picked(index)
        wait_until(lambda: window.model_info is not None and window.model_info.get("device") == "remote")
        window.server_dock.setVisible(False)
        window.panels_dock.setVisible(True)
        window.controller.new_conversation()
        window.controller.set_chat_settings(ChatSettings(max_new_tokens=40, temperature=0.8, seed=5))
        window.send("Hello from the other machine")
        wait_until(lambda: not window.controller.is_generating)
        camera.shoot("remote-chat", window)
    finally:
        process.terminate()
        process.wait(20)


if __name__ == "__main__":
    sys.exit(main())
