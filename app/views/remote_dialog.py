"""Remote endpoints: add an OpenAI-compatible server (URL + optional API key) as a model source, or remove one.

Connecting asks the endpoint for its models on a short-lived thread (the GUI never waits on the
network); its models then appear in the model picker.
"""
from __future__ import annotations

import threading

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QFormLayout, QHBoxLayout, QLabel, QLineEdit, QListWidget,
                               QListWidgetItem, QPushButton, QVBoxLayout, QWidget)

from ..remote import list_models, normalise_url
from ..settings import AppSettings


class RemoteEndpointsDialog(QDialog):
    changed = Signal()                       # the settings' remote_endpoints changed (saved by the owner)
    _answered = Signal(str, str, list, str)  # url, key, models, error sentence ("" when it worked)

    def __init__(self, settings: AppSettings, parent: QWidget | None = None):
        super().__init__(parent)
        self.settings = settings
        self.setWindowTitle("Remote endpoints")
        self.setMinimumWidth(520)
        layout = QVBoxLayout(self)
        intro = QLabel("Chat with a model served elsewhere: any OpenAI-compatible endpoint (vLLM, SGLang, "
                       "LM Studio, another Sluice). Its models appear in the model picker.")
        intro.setWordWrap(True)
        layout.addWidget(intro)
        form = QFormLayout()
        self.url_edit = QLineEdit()
        self.url_edit.setPlaceholderText("http://192.168.1.20:8000/v1")
        self.key_edit = QLineEdit()
        self.key_edit.setPlaceholderText("optional")
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        form.addRow("Address", self.url_edit)
        form.addRow("API key", self.key_edit)
        layout.addLayout(form)
        row = QHBoxLayout()
        self.connect_button = QPushButton("Connect")
        self.connect_button.setDefault(True)
        self.connect_button.clicked.connect(self.connect_endpoint)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        row.addWidget(self.connect_button)
        row.addWidget(self.status, 1)
        layout.addLayout(row)
        layout.addWidget(QLabel("Endpoints"))
        self.list = QListWidget()
        layout.addWidget(self.list)
        self.remove_button = QPushButton("Remove")
        self.remove_button.clicked.connect(self._remove_selected)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.addButton(self.remove_button, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self._answered.connect(self._on_answer)
        self._refresh_list()

    def connect_endpoint(self) -> None:
        try:
            url = normalise_url(self.url_edit.text())
        except Exception as exc:
            self.status.setText(str(exc))
            return
        key = self.key_edit.text().strip()
        self.connect_button.setEnabled(False)
        self.status.setText(f"Connecting to {url}…")

        def ask() -> None:                     # on a plain thread; the signal is queued to the GUI thread
            try:
                self._answered.emit(url, key, list_models(url, key or None), "")
            except Exception as exc:
                self._answered.emit(url, key, [], str(exc))
        threading.Thread(target=ask, name="sluice-remote-models", daemon=True).start()

    def _on_answer(self, url: str, key: str, models: list, error: str) -> None:
        self.connect_button.setEnabled(True)
        if error:
            self.status.setText(error)
            return
        self.settings.remove_remote_endpoint(url)          # replaced: the old key goes too
        self.settings.remote_endpoints.append({"url": url, "api_key": key, "models": models})
        self.status.setText(f"Connected: {len(models)} model{'s' if len(models) != 1 else ''} "
                            f"({', '.join(models[:3])}{'…' if len(models) > 3 else ''}).")
        self._refresh_list()
        self.changed.emit()

    def _refresh_list(self) -> None:
        self.list.clear()
        for endpoint in self.settings.remote_endpoints:
            models = ", ".join(endpoint.get("models", []))
            item = QListWidgetItem(f"{endpoint['url']}   {models}" + ("   (key set)" if endpoint.get("api_key") else ""))
            item.setData(256, endpoint["url"])
            self.list.addItem(item)
        self.remove_button.setEnabled(bool(self.settings.remote_endpoints))

    def _remove_selected(self) -> None:
        item = self.list.currentItem()
        if item is None:
            return
        self.settings.remove_remote_endpoint(item.data(256))
        self._refresh_list()
        self.changed.emit()
