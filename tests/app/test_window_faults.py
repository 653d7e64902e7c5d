"""Faults a walk-through found in the window: each ends in one sentence, with nothing lost and nothing stuck."""
import subprocess
import sys
from pathlib import Path

from PySide6.QtWidgets import QDialogButtonBox

from app_helpers import make_window
from app.main import main
from app.settings import AppSettings
from app.startup import UNREADABLE_SETTINGS_KEY, load_settings
from app.store import Store
from app.views.settings_dialog import AppSettingsDialog, MachineLimits

ROOT = Path(__file__).resolve().parents[2]


def test_settings_refuse_a_models_folder_that_cannot_be_created(qtbot, data_dir, tmp_path):
    window = make_window(qtbot, data_dir)
    dialog = AppSettingsDialog(window.settings, window, limits=MachineLimits(16 * 2**30))
    qtbot.addWidget(dialog)
    dialog.show()
    blocker = tmp_path / "a file"
    blocker.write_text("not a folder")
    dialog.models_dir.setText(str(blocker / "models"))            # under a file: no one can create it
    height_before = dialog.height()
    dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
    error = dialog.models_dir_error
    assert dialog.isVisible() and error.isVisible()
    assert error.text().startswith("Sluice cannot create the models folder") and error.text().count(". ") == 0
    assert dialog.height() >= height_before and dialog.height() >= dialog.sizeHint().height()   # it grew
    assert error.geometry().bottom() < dialog.findChild(QDialogButtonBox).geometry().top()
    dialog.models_dir.setText(str(tmp_path / "models"))
    dialog.accept()
    assert not dialog.isVisible() and (tmp_path / "models").is_dir()
    assert window.shutdown()


def test_malformed_remote_endpoints_and_server_port_do_not_stop_the_app(qtbot, data_dir):
    good = {"url": "http://127.0.0.1:9/v1", "api_key": "", "models": ["m"]}
    saved = {"remote_endpoints": ["junk", {"url": 5}, good, {"url": "http://x/v1", "models": [3]}],
             "server": {"port": "eighty", "lan": True}, "device": "cpu"}
    store = Store(data_dir / "sluice.db")
    store.set_setting("app", saved)
    [notice] = load_settings(store)
    assert "2 of the saved remote endpoints" not in notice.text and "3 of the saved remote endpoints" in notice.text
    assert "'port' ('eighty')" in notice.text and notice.text.count(". ") == 0
    assert store.get_setting(UNREADABLE_SETTINGS_KEY) == saved                # nothing lost: the original is kept
    settings = AppSettings.load(store)
    assert settings.remote_endpoints == [good] and settings.server == {"lan": True} and settings.device == "cpu"
    store.close()
    window = make_window(qtbot, data_dir)                                     # the window opens on them
    assert window.server_panel.port.value() == 8000
    assert any("remote" in window.model_picker.itemText(i) for i in range(window.model_picker.count()))
    assert window.shutdown()


def test_the_exit_hook_is_a_flag_not_an_environment_variable(capsys):
    assert main(["--exit-after-ms", "soon"]) == 2
    assert "--exit-after-ms takes a number of milliseconds." in capsys.readouterr().err
    product = [p for p in (ROOT / "app").rglob("*.py") if "SLUICE_EXIT_AFTER_MS" in p.read_text()]
    assert not product


def test_the_app_reads_no_environment_variable_but_the_documented_ones():
    """Only SLUICE_DATA_DIR (app.paths) among SLUICE_*; the desktop's XDG_* and display variables are the OS's."""
    found = subprocess.run(["grep", "-rhoE", "SLUICE_[A-Z_]+", "app"], cwd=ROOT, capture_output=True, text=True)
    assert set(found.stdout.split()) <= {"SLUICE_DATA_DIR", "SLUICE_API_KEY"}, found.stdout
    assert sys.executable


def test_an_unreachable_remote_model_keeps_the_local_model_loaded(qtbot, loaded_window):
    from app.remote import model_key
    window = loaded_window
    engine, name = window.host.worker.engine, window.model_info["name"]
    url = "http://127.0.0.1:9/v1"                                        # the discard port: nothing listens
    window.settings.remote_endpoints = [{"url": url, "api_key": "", "models": ["far-model"]}]
    with qtbot.waitSignal(window.host.load_failed, timeout=30_000):
        window.load_model(model_key(url, "far-model"))
    assert window.host.worker.engine is engine and window.model_info["name"] == name
    assert window.model_label.text().startswith(name)
    sentence = window.last_dialog.text()
    assert sentence.endswith(f"; {name} stays loaded.") and sentence.count(". ") == 0
    window.last_dialog.close()


def _clipped_labels(root) -> list[str]:
    """Visible labels narrower than their text needs (a label that wraps needs only its longest word)."""
    from PySide6.QtWidgets import QLabel
    return [label.text() for label in root.findChildren(QLabel)
            if label.isVisible() and label.text() and label.width() < label.minimumSizeHint().width()]


def test_nothing_is_clipped_at_the_default_size_or_the_minimum_one(qtbot, loaded_window):
    window = loaded_window
    window.controller.new_conversation()
    for size in ((1280, 800), (window.minimumSize().width(), window.minimumSize().height())):
        window.resize(*size)
        qtbot.wait(100)
        hidden = [a.text() for a in window.toolbar.actions()
                  if a.text() and a.isVisible() and not window.toolbar.widgetForAction(a).isVisible()]
        assert not hidden, f"toolbar actions behind the chevron at {size}: {hidden}"
        assert window.chat_view.placeholder.wordWrap() and window.chat_view.placeholder.isVisible()
        assert not _clipped_labels(window.panels), size
    window.server_action.trigger()                                   # the Server panel opens as a tab
    qtbot.wait(100)
    assert window.panels_action.isChecked() and window.server_dock.isVisible()
    assert window.tabifiedDockWidgets(window.server_dock) == [window.panels_dock]
    assert window.width() >= window.minimumSizeHint().width()
    window.server_action.trigger()


def test_idle_panels_show_idle_not_the_last_speed(qtbot):
    from app.views.panels import LivePanels
    from engine.runtime.telemetry import Telemetry
    telemetry = Telemetry()
    telemetry.set(decode_tok_s=42.0, prefill_tok_s=300.0)
    panels = LivePanels(telemetry.snapshot)
    qtbot.addWidget(panels)
    panels.show()
    panels.set_busy(True)
    panels.refresh()
    assert panels.speed_label.text().startswith("decode 42.0 · prefill 300.0")
    panels.set_busy(False)                                   # the answer ended: the engine's figures stay 42
    assert panels.speed_label.text() == "idle" and panels.last_value("decode_tok_s") == 42.0
