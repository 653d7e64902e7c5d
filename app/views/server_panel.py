"""The "Local server" panel: serve the loaded model over the OpenAI and Ollama APIs (like LM Studio's
developer tab): address, on/off, API key, a copyable curl example and a live request log."""
from __future__ import annotations

import time

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (QCheckBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit,
                               QPushButton, QSpinBox, QVBoxLayout, QWidget)

from engine.setup import served_model_id

from ..local_server import LocalServer, curl_example, new_api_key

LOG_LINES = 500
MIN_LOG_LINES = 6            # below it the panel scrolls (the dock holds it in a scroll area)


def _monospace_log() -> QPlainTextEdit:
    text = QPlainTextEdit()
    text.setReadOnly(True)
    text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
    text.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
    return text


class ServerPanel(QWidget):
    error = Signal(str)                        # one sentence for a dialog
    _request_seen = Signal(dict)               # from the server's thread, queued to the GUI thread

    def __init__(self, worker, settings: dict, parent: QWidget | None = None):
        """settings: the app's `server` dict ({"port", "api_key", "lan"}), updated in place."""
        super().__init__(parent)
        self.settings = settings
        self.local = LocalServer(worker, on_request=self._request_seen.emit)
        self.model_id: str | None = None         # what clients call the loaded model
        self.wanted = False                    # on: serve whichever local model is loaded
        self.setMinimumWidth(400)          # as narrow as the Machinery tab beside it
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addLayout(self._build_switch_row())
        layout.addWidget(self._build_access_box(settings))
        layout.addWidget(self._build_example_box())
        layout.addWidget(self._build_log_box(), 1)
        self.port.valueChanged.connect(self._on_options_changed)
        self.lan.toggled.connect(self._on_options_changed)
        self.key.textChanged.connect(self._on_options_changed)
        self._request_seen.connect(self._on_request)
        self.timer = QTimer(self, interval=500)
        self.timer.timeout.connect(self._update_counters)
        self.timer.start()
        self._update_example()

    def _build_switch_row(self) -> QHBoxLayout:
        self.status = QLabel("Off")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.switch = QPushButton("Start server")
        self.switch.setCheckable(True)
        self.switch.toggled.connect(self._on_switch)
        row = QHBoxLayout()
        row.addWidget(self.switch)
        row.addWidget(self.status, 1)
        return row

    def _build_access_box(self, settings: dict) -> QGroupBox:
        """Port, LAN reach and API key, from the saved settings."""
        box = QGroupBox("Address and access")
        form = QFormLayout(box)
        self.port = QSpinBox()
        self.port.setRange(1, 65535)
        self.port.setValue(int(settings.get("port", 8000)))
        self.lan = QCheckBox("Reachable from other computers (0.0.0.0)")
        self.lan.setChecked(bool(settings.get("lan", False)))
        self.key = QLineEdit(settings.get("api_key", ""))
        self.key.setToolTip("Clients send it as 'Authorization: Bearer KEY'. Without one, anyone who can connect "
                            "may use the server.")
        self.key.setPlaceholderText("none: open to anyone")
        self.new_key = QPushButton("New key")
        self.new_key.clicked.connect(lambda: self.key.setText(new_api_key()))
        key_row = QHBoxLayout()
        key_row.addWidget(self.key, 1)
        key_row.addWidget(self.new_key)
        form.addRow("Port", self.port)
        form.addRow("", self.lan)
        form.addRow("API key", key_row)
        return box

    def _build_example_box(self) -> QGroupBox:
        """A curl command for the current address and key, with a Copy button."""
        box = QGroupBox("Try it")
        self.curl = _monospace_log()
        self.curl.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)   # the whole command in view; Copy
        self.curl.setFixedHeight(110)                                          # copies its lines as they are
        self.copy = QPushButton("Copy")
        self.copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.curl.toPlainText()))
        hint = QLabel("OpenAI clients (chat, completions, responses, structured output): base URL <i>address</i>/v1"
                      " · Anthropic Messages and Ollama clients: the address itself.")
        hint.setWordWrap(True)
        row = QHBoxLayout()
        row.addWidget(hint, 1)
        row.addWidget(self.copy, 0, Qt.AlignmentFlag.AlignTop)
        box_layout = QVBoxLayout(box)
        box_layout.addWidget(self.curl)
        box_layout.addLayout(row)
        return box

    def _build_log_box(self) -> QGroupBox:
        """The request counters and the last LOG_LINES requests."""
        box = QGroupBox("Requests")
        self.counters = QLabel("not serving")
        self.log = _monospace_log()
        self.log.setMaximumBlockCount(LOG_LINES)
        self.log.setMinimumHeight(self.log.fontMetrics().lineSpacing() * MIN_LOG_LINES)
        box_layout = QVBoxLayout(box)
        box_layout.addWidget(self.counters)
        box_layout.addWidget(self.log)
        return box

    # the window calls these -----------------------------------------------------------------------
    def model_changing(self) -> None:
        """The engine is about to be replaced: stop serving it (restarted by model_ready if on)."""
        if self.local.running:
            self.local.stop()
            self._log_line("server stopped: the model is being changed")
            self._show_state()

    def model_ready(self, info: dict) -> None:
        self.model_id = served_model_id(info)
        if self.wanted and info.get("device") != "remote":
            self._start()
        self._show_state()

    def shutdown(self) -> None:
        self.timer.stop()
        self.local.stop()

    @property
    def host(self) -> str:
        return "0.0.0.0" if self.lan.isChecked() else "127.0.0.1"

    # private ------------------------------------------------------------------------------------
    def _on_switch(self, on: bool) -> None:
        self.wanted = on
        if on:
            self._start()
        else:
            self.local.stop()
            self._log_line("server stopped")
        self._show_state()

    def _start(self) -> None:
        try:
            url = self.local.start(self.host, self.port.value(), self.key.text().strip() or None)
        except Exception as exc:
            from ..work import user_message
            self.wanted = False
            self.switch.blockSignals(True)
            self.switch.setChecked(False)
            self.switch.blockSignals(False)
            self.error.emit(user_message(exc))
            return
        self._log_line(f"serving {self.local.server.service.model_id} at {url}")

    def _on_options_changed(self, *_args) -> None:
        self.settings.update(port=self.port.value(), lan=self.lan.isChecked(), api_key=self.key.text().strip())
        self._update_example()

    def _show_state(self) -> None:
        running = self.local.running
        for widget in (self.port, self.lan, self.key, self.new_key):    # the address and key apply when the server starts
            widget.setEnabled(not running)
        self.switch.blockSignals(True)
        self.switch.setChecked(self.wanted)
        self.switch.setText("Stop server" if self.wanted else "Start server")
        self.switch.blockSignals(False)
        if running:
            server = self.local.server
            text = f"Serving <b>{server.service.model_id}</b> at <b>{server.url}</b>"
            if self.local.exposed_without_key(server.host, server.api_key):
                text += "<br><span style='color:#b45309'>Reachable from other computers without an API key.</span>"
        elif self.wanted:
            text = "Waiting for a local model to load."
        else:
            text = "Off"
        self.status.setText(text)
        self._update_example()

    def _update_example(self) -> None:
        server = self.local.server
        url = server.url if server else f"http://{'127.0.0.1'}:{self.port.value()}"
        model = server.service.model_id if server else (self.model_id or "MODEL")
        self.curl.setPlainText(curl_example(url, model, self.key.text().strip() or None))

    def _on_request(self, record: dict) -> None:
        client = "" if record["client"] in ("127.0.0.1", "::1") else f"{record['client']} "
        self._log_line(f"{client}{record['method']} {record['path']} {record['status']} {record['duration_s']:.2f} s")

    def _log_line(self, text: str) -> None:
        self.log.appendPlainText(f"{time.strftime('%H:%M:%S')}  {text}")

    def _update_counters(self) -> None:
        counters = self.local.counters()
        if counters is None:
            self.counters.setText("not serving")
        else:
            self.counters.setText(f"queued {counters['queued']} · generating {counters['active']} · "
                                  f"served {counters['served']}")
