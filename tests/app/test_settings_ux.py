"""Settings checked in place, devices this machine has, limits beside sizes, the context per model,
changing back reloads; chat defaults for new chats and named presets."""
from PySide6.QtWidgets import QDialogButtonBox, QLabel

from app_helpers import WAIT_MS, make_window
from app.store import ChatSettings
from app.views.settings_dialog import AppSettingsDialog, MachineLimits
from engine import format_size

GiB = 2**30


def test_only_devices_this_machine_has_are_offered(qtbot, data_dir):
    window = make_window(qtbot, data_dir)
    settings = window.settings
    without_gpu = AppSettingsDialog(settings, window, limits=MachineLimits(16 * GiB))
    assert [without_gpu.device.itemData(i) for i in range(without_gpu.device.count())] == ["auto", "cpu"]
    assert "No CUDA GPU" in without_gpu.device_note.text()
    with_gpu = AppSettingsDialog(settings, window, limits=MachineLimits(16 * GiB, "RTX 5060", 8 * GiB))
    assert with_gpu.device.findData("cuda") >= 0
    assert window.shutdown()


def test_a_wrong_size_says_so_under_its_field_and_the_dialog_keeps_the_edits(qtbot, data_dir):
    window = make_window(qtbot, data_dir)
    info = {"name": "demo", "min_ram_cache_bytes": 48 * 1024, "min_vram_budget_bytes": 5 * 2**20,
            "model_max_context": 4096, "max_context": 4096}
    dialog = AppSettingsDialog(window.settings, window, info, limits=MachineLimits(16 * GiB))
    qtbot.addWidget(dialog)
    dialog.show()
    notes = [label.text() for label in dialog.findChildren(QLabel)]
    assert any(f"This computer: {format_size(16 * GiB)} of RAM. demo needs at least 48.00 KiB" in n for n in notes)
    assert any("No GPU" in n and "demo needs at least 5.00 MiB" in n for n in notes)
    dialog.ram_cache.setText("lots")
    dialog.vram_budget.setText("1KB")
    dialog.models_dir.setText(str(data_dir / "somewhere" / "else"))
    dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
    assert dialog.isVisible() and dialog.result() == 0
    assert "Cannot read the size 'lots'" in dialog.ram_error.text() and dialog.ram_error.isVisible()
    assert "too small for demo" in dialog.vram_error.text() and "5.00 MiB" in dialog.vram_error.text()
    assert dialog.models_dir.text() == str(data_dir / "somewhere" / "else")  # nothing typed is lost
    dialog.ram_cache.setText("64GB")                                          # more than this machine has
    dialog.vram_budget.setText("")
    dialog.accept()
    assert dialog.isVisible() and "more than this computer has" in dialog.ram_error.text()
    assert not dialog.vram_error.isVisible()
    dialog.ram_cache.setText("1GB")
    dialog.accept()
    assert not dialog.isVisible() and dialog.value().ram_cache == "1GB"
    assert window.shutdown()


def test_the_context_is_set_per_model_and_changing_a_setting_back_reloads(qtbot, loaded_window):
    window = loaded_window
    assert "context 4,096 tokens" in window.model_label.text()
    window.edit_app_settings()
    dialog = window.last_dialog
    assert dialog.context.maximum() == 4096
    dialog.context.setValue(2048)
    with qtbot.waitSignal(window.model_loaded, timeout=WAIT_MS) as loaded:
        dialog.accept()
    assert loaded.args[0]["max_context"] == 2048 and "context 2,048 tokens" in window.model_label.text()
    good = window.settings
    with qtbot.waitSignal(window.host.load_failed, timeout=WAIT_MS):
        window.apply_app_settings(type(good)(**{**good.__dict__, "vram_budget": "1MB"}), 2048)
    window.last_dialog.accept()
    assert window.model_info is None
    with qtbot.waitSignal(window.model_loaded, timeout=WAIT_MS) as reloaded:       # changed back: loads again
        window.apply_app_settings(type(good)(**{**good.__dict__, "vram_budget": ""}), 2048)
    assert reloaded.args[0]["max_context"] == 2048


def test_new_chats_start_with_the_default_settings_and_presets_are_named(qtbot, data_dir):
    window = make_window(qtbot, data_dir)
    window.edit_chat_settings()
    dialog = window.last_dialog
    assert dialog.system_prompt.toPlainText() == "" and dialog.system_prompt.placeholderText().startswith("None.")
    dialog.system_prompt.setPlainText("Answer in French.")
    dialog.temperature.setValue(0.2)
    dialog.save_preset("French")
    dialog.save_default.click()
    dialog.accept()
    window.controller.new_conversation()
    assert window.controller.conversation.settings.system_prompt == "Answer in French."
    assert window.controller.conversation.settings.temperature == 0.2
    window.edit_chat_settings()
    dialog = window.last_dialog
    dialog.set_value(ChatSettings())
    index = dialog.preset.findData("French")
    dialog.preset.setCurrentIndex(index)
    dialog.preset.activated.emit(index)
    assert dialog.value().system_prompt == "Answer in French." and dialog.value().temperature == 0.2
    dialog._delete_preset()
    assert dialog.preset.findData("French") == -1 and "French" not in window.controller.chat_presets()
    dialog.reject()
    assert window.shutdown()


def test_int8_dense_weights_reload_the_model_with_them_and_back(qtbot, loaded_window):
    window = loaded_window
    assert window.model_info["dense_quant"] == "none" and "int8 dense" not in window.model_label.text()
    window.edit_app_settings()
    dialog = window.last_dialog
    dialog.dense_weights.setCurrentIndex(dialog.dense_weights.findData("int8"))
    with qtbot.waitSignal(window.model_loaded, timeout=WAIT_MS) as loaded:
        dialog.accept()
    assert loaded.args[0]["dense_quant"] == "int8" and "int8 dense" in window.model_label.text()
    assert window.settings.dense_weights == "int8"
    with qtbot.waitSignal(window.model_loaded, timeout=WAIT_MS) as reloaded:          # changed back: as stored
        window.apply_app_settings(type(window.settings)(**{**window.settings.__dict__, "dense_weights": "stored"}))
    assert reloaded.args[0]["dense_quant"] == "none"


def test_a_saved_dense_weights_value_that_is_not_offered_falls_back_to_stored(data_dir):
    from app.settings import AppSettings
    from app.store import Store
    store = Store(data_dir / "s.sqlite")
    store.set_setting("app", {"dense_weights": "int4"})
    settings, problems = AppSettings.load_checked(store)
    assert settings.dense_weights == "stored" and "not one of stored, int8" in problems[0]


def test_int8_dense_weights_are_asked_only_of_families_that_have_them(data_dir, sluice_models, monkeypatch):
    from app.model_options import load_options
    from app.settings import AppSettings
    from app.store import Store
    from engine.model.families import family_module
    store = Store(data_dir / "s.sqlite")
    settings = AppSettings(dense_weights="int8")
    assert load_options(settings, store, sluice_models("qwen3_moe"))["dense_quant"] == "int8"
    assert load_options(settings, store, sluice_models("gpt_oss"))["dense_quant"] == "int8"
    monkeypatch.delattr(family_module("gpt_oss"), "DENSE_INT8")       # a family that does not name them
    assert "dense_quant" not in load_options(settings, store, sluice_models("gpt_oss"))
    assert "dense_quant" not in load_options(settings, store, data_dir / "no-such-model")
    assert "dense_quant" not in load_options(AppSettings(), store, sluice_models("qwen3_moe"))
