"""Remote endpoints' API keys go to the OS keyring where there is one, stay in sluice.db where there is none,
and leave either with their endpoint."""
import json
import sqlite3

import keyring
import pytest
from keyring.backend import KeyringBackend
from keyring.backends import fail

from app import paths
from app.settings import AppSettings
from app.store import Store

ENDPOINT = {"url": "http://127.0.0.1:9/v1", "api_key": "sk-secret", "models": ["m"]}


class MemoryKeyring(KeyringBackend):
    """A keyring backend through keyring's own plugin interface (no OS keyring runs in CI)."""
    priority = 1

    def __init__(self):
        super().__init__()
        self.passwords = {}

    def set_password(self, service, username, password):
        self.passwords[(service, username)] = password

    def get_password(self, service, username):
        return self.passwords.get((service, username))

    def delete_password(self, service, username):
        self.passwords.pop((service, username), None)


@pytest.fixture
def backend():
    before = keyring.get_keyring()
    yield keyring.set_keyring
    keyring.set_keyring(before)


def saved_text(data_dir) -> str:
    with sqlite3.connect(paths.database_path()) as db:
        return json.dumps(db.execute("SELECT * FROM settings").fetchall())


def test_the_key_goes_to_the_keyring_not_the_database(data_dir, backend):
    memory = MemoryKeyring()
    backend(memory)
    store = Store(paths.database_path())
    AppSettings(remote_endpoints=[dict(ENDPOINT)]).save(store)
    assert "sk-secret" not in saved_text(data_dir) and "sk-secret" in memory.passwords.values()
    assert AppSettings.load(store).remote_api_key(ENDPOINT["url"]) == "sk-secret"


def test_without_a_keyring_the_key_stays_in_the_database(data_dir, backend):
    backend(fail.Keyring())
    store = Store(paths.database_path())
    AppSettings(remote_endpoints=[dict(ENDPOINT)]).save(store)
    assert "sk-secret" in saved_text(data_dir)
    assert AppSettings.load(store).remote_api_key(ENDPOINT["url"]) == "sk-secret"


def remove_in_dialog(qtbot, settings: AppSettings, url: str) -> None:
    """Select the endpoint in the Remote endpoints dialog and press Remove."""
    from PySide6.QtCore import Qt
    from app.views.remote_dialog import RemoteEndpointsDialog
    dialog = RemoteEndpointsDialog(settings)
    qtbot.addWidget(dialog)
    dialog.list.setCurrentRow(next(i for i in range(dialog.list.count()) if dialog.list.item(i).data(256) == url))
    with qtbot.waitSignal(dialog.changed):
        qtbot.mouseClick(dialog.remove_button, Qt.MouseButton.LeftButton)


def test_removing_an_endpoint_deletes_its_key_from_the_keyring(qtbot, data_dir, backend):
    memory = MemoryKeyring()
    backend(memory)
    store = Store(paths.database_path())
    other = {"url": "http://127.0.0.1:10/v1", "api_key": "sk-other", "models": ["n"]}
    AppSettings(remote_endpoints=[dict(ENDPOINT), other]).save(store)
    settings = AppSettings.load(store)
    remove_in_dialog(qtbot, settings, ENDPOINT["url"])
    settings.save(store)
    assert set(memory.passwords.values()) == {"sk-other"}            # the other endpoint keeps its key
    assert [e["url"] for e in AppSettings.load(store).remote_endpoints] == [other["url"]]


def test_without_a_keyring_removing_an_endpoint_takes_its_key_out_of_the_database(qtbot, data_dir, backend):
    backend(fail.Keyring())
    store = Store(paths.database_path())
    AppSettings(remote_endpoints=[dict(ENDPOINT)]).save(store)
    settings = AppSettings.load(store)
    remove_in_dialog(qtbot, settings, ENDPOINT["url"])
    settings.save(store)
    assert "sk-secret" not in saved_text(data_dir) and AppSettings.load(store).remote_endpoints == []
