"""Window behaviour without generating: conversations, keyboard, settings persistence, first run, opening models."""
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from app_helpers import WAIT_MS, make_window
from app.store import ChatSettings
from app.views.window_models import DEMO_DIR_NAME


def test_conversations_new_rename_search_delete(qtbot, data_dir):
    window = make_window(qtbot, data_dir)
    conversations = window.conversations
    conversations.confirm_delete = False
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=WAIT_MS)
    QTest.keyClick(window.composer.edit, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)   # Ctrl+N
    first = window.controller.conversation.id
    window.controller.new_conversation()
    second = window.controller.conversation.id
    assert conversations.ids() == [second, first]                                       # newest first
    window.store.add_message(first, "user", "a question about zebras")
    item = conversations.list.item(conversations.ids().index(first))
    conversations.rename(first)
    assert conversations.list.state() == conversations.list.State.EditingState       # F2-style in-place editor
    item.setText("Zoo trip")                                                           # what the editor commits
    assert window.store.conversation(first).title == "Zoo trip"
    qtbot.keyClicks(conversations.search, "zebra")                                      # matches message text
    qtbot.waitUntil(lambda: conversations.ids() == [first], timeout=WAIT_MS)
    conversations.search.clear()
    qtbot.waitUntil(lambda: len(conversations.ids()) == 2, timeout=WAIT_MS)
    conversations.list.setCurrentRow(conversations.ids().index(second))
    conversations.list.setFocus()
    qtbot.keyClick(conversations.list, Qt.Key.Key_Delete)
    assert conversations.ids() == [first] and window.store.conversation(second) is None
    assert window.shutdown()


def test_enter_sends_shift_enter_adds_a_line(qtbot, data_dir):
    window = make_window(qtbot, data_dir)
    sent = []
    window.composer.send_requested.disconnect()
    window.composer.send_requested.connect(sent.append)
    edit = window.composer.edit
    qtbot.keyClicks(edit, "line one")
    qtbot.keyClick(edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(edit, "line two")
    assert sent == [] and edit.toPlainText() == "line one\nline two"
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    assert sent == ["line one\nline two"] and edit.toPlainText() == ""
    assert window.shutdown()


def test_sending_without_a_model_explains_and_keeps_the_text(qtbot, data_dir):
    window = make_window(qtbot, data_dir)
    window.send("hello?")
    assert window.last_dialog.objectName() == "errorDialog" and "No model is loaded" in window.last_dialog.text()
    assert window.composer.edit.toPlainText() == "hello?" and window.store.conversations() == []
    assert window.shutdown()


def test_settings_persist_across_restarts(qtbot, data_dir, tmp_path):
    window = make_window(qtbot, data_dir)
    window.edit_chat_settings()
    dialog = window.last_dialog
    dialog.system_prompt.setPlainText("You are terse.")
    dialog.temperature.setValue(0.3)
    dialog.top_p.setValue(0.8)
    dialog.top_k.setValue(20)
    dialog.max_new_tokens.setValue(77)
    dialog.seed.setValue(1234)
    dialog.accept()
    conversation_id = window.controller.conversation.id
    window.edit_app_settings()
    app_dialog = window.last_dialog
    app_dialog.models_dir.setText(str(tmp_path / "my-models"))
    app_dialog.device.setCurrentIndex(app_dialog.device.findData("cpu"))
    app_dialog.ram_cache.setText("3GB")
    app_dialog.accept()
    window.panels_action.setChecked(False)                                            # hide the live panels
    window.resize(window.width(), 500)             # (the offscreen screen is 800 px wide: only the height can change)
    assert window.shutdown()

    again = make_window(qtbot, data_dir)
    assert again.store.conversation(conversation_id).settings == ChatSettings("You are terse.", 0.3, 0.8, 20, 77, 1234)
    assert again.settings.models_path() == tmp_path / "my-models"
    assert (again.settings.device, again.settings.ram_cache) == ("cpu", "3GB")
    assert not again.panels_action.isChecked() and not again.panels_dock.isVisible()
    assert again.height() == 500
    assert again.shutdown()


def test_a_bad_size_in_settings_is_refused_with_one_sentence(qtbot, data_dir):
    window = make_window(qtbot, data_dir)
    window.apply_app_settings(type(window.settings)(**{**window.settings.__dict__, "ram_cache": "lots"}))
    assert "Cannot read the size 'lots'" in window.last_dialog.text()
    assert window.settings.ram_cache == ""
    assert window.shutdown()


def test_first_run_page_builds_the_demo_model_and_opens_the_chat(qtbot, data_dir):
    window = make_window(qtbot, data_dir, vram_budget="1400KB", ram_cache="400KB")
    assert window.pages.currentWidget() is window.first_run
    assert "produces noise" in window.first_run.demo_button.text()
    window.resize(1300, 850)                        # the panels open beside it: each choice's text fits its button
    qtbot.waitUntil(lambda: window.first_run.demo_button.width() > 100)
    for button in (window.first_run.open_button, window.first_run.download_button, window.first_run.demo_button):
        assert button.fontMetrics().horizontalAdvance(button.text()) + 16 <= button.width(), button.text()
    with qtbot.waitSignal(window.model_loaded, timeout=60_000) as loaded:
        qtbot.mouseClick(window.first_run.demo_button, Qt.MouseButton.LeftButton)
    assert loaded.args[0]["path"] == str(window.settings.models_path() / DEMO_DIR_NAME)
    assert "noise" in loaded.args[0]["name"]
    assert window.pages.currentWidget() is window.chat_page
    assert window.model_picker.currentData() == loaded.args[0]["path"]
    assert window.shutdown()


def test_open_folder_on_a_snapshot_opens_the_repack_wizard_then_loads_the_model(qtbot, data_dir, tmp_path):
    from PySide6.QtWidgets import QWizard
    from engine.tools.demo import build_hf_model
    snapshot = build_hf_model("olmoe", tmp_path / "tiny-olmoe", num_layers=2)
    window = make_window(qtbot, data_dir, vram_budget="1400KB", ram_cache="400KB")
    window.open_folder(snapshot)
    wizard = window.last_wizard
    assert wizard.isVisible()
    table = wizard.options_page.quants
    qtbot.waitUntil(lambda: table.rowCount() == 5, timeout=WAIT_MS)      # bf16, fp8, int8, nvfp4, mxfp4 with size and speed
    table.select("fp8")
    qtbot.mouseClick(wizard.button(QWizard.WizardButton.NextButton), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: wizard.currentPage() is wizard.done_page, timeout=60_000)
    with qtbot.waitSignal(window.model_loaded, timeout=60_000) as loaded:
        qtbot.mouseClick(wizard.button(QWizard.WizardButton.FinishButton), Qt.MouseButton.LeftButton)
    assert loaded.args[0]["family"] == "olmoe" and loaded.args[0]["quant"] == "fp8"
    assert loaded.args[0]["path"] == str(window.settings.models_path() / "tiny-olmoe-fp8")
    assert window.model_picker.findData(loaded.args[0]["path"]) > 0
    assert window.shutdown()


def test_open_folder_refuses_a_folder_without_a_model(qtbot, data_dir, tmp_path):
    window = make_window(qtbot, data_dir)
    (tmp_path / "photos").mkdir()
    window.open_folder(tmp_path / "photos")
    assert "holds neither a Sluice model nor a Hugging Face snapshot" in window.last_dialog.text()
    assert window.shutdown()


def test_an_unsupported_model_family_is_one_sentence(qtbot, data_dir, tmp_path):
    import json
    snapshot = tmp_path / "llama-ish"
    snapshot.mkdir()
    (snapshot / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    (snapshot / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    window = make_window(qtbot, data_dir)
    window.open_folder(snapshot)
    text = window.last_dialog.text()
    assert "llama" in text and "Traceback" not in text and "\n" not in text
    assert window.shutdown()


def test_download_button_opens_the_setup_wizard(qtbot, data_dir):
    window = make_window(qtbot, data_dir)
    qtbot.mouseClick(window.first_run.download_button, Qt.MouseButton.LeftButton)
    from app.setup.wizards import DownloadWizard
    wizard = window.findChild(DownloadWizard)
    assert wizard is not None and wizard.isVisible()
    wizard.close()
    assert window.shutdown()


def test_loading_shows_progress_and_can_be_cancelled(qtbot, data_dir):
    import time as _time

    def slow_load(model_dir, progress=None, **_options):        # stands in for a big model's dense weights
        for step in range(200):
            progress(step, 200, "loading dense weights")
            _time.sleep(0.01)
        raise AssertionError("the load was not cancelled")

    window = make_window(qtbot, data_dir)
    window.host.worker._load_fn = slow_load
    window.load_model(data_dir / "big-model")
    qtbot.waitUntil(lambda: window.load_bar.maximum() == 200 and window.load_bar.value() > 5, timeout=WAIT_MS)
    assert window.load_cancel.isVisible() and "Loading big-model" in window.model_label.text()
    with qtbot.waitSignal(window.host.load_failed, timeout=WAIT_MS) as failed:
        qtbot.mouseClick(window.load_cancel, Qt.MouseButton.LeftButton)
    assert failed.args == [""]                                       # cancelled: no error dialog
    assert window.last_dialog is None and window.model_info is None and not window.load_bar.isVisible()
    assert window.shutdown()


def test_the_first_window_fits_a_small_screen():
    """1280 x 800 on a first start, but never past a small laptop's screen (the composer stays on it)."""
    from PySide6.QtCore import QSize
    from app.views.main_window import first_size
    assert first_size(QSize(1920, 1040)) == (1280, 800)
    width, height = first_size(QSize(1366, 728))           # 1366 x 768 less a task bar
    assert width <= 1280 and height < 728
