"""The setup wizards with real widgets against the local hub: search -> estimate -> download -> repack -> chat."""
from __future__ import annotations

import shutil
import threading

import pytest

pytest.importorskip("pytestqt")
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QWizard  # noqa: E402

from setup_support import SUPPORTED_REPO, UNSUPPORTED_REPO  # noqa: E402

WAIT_MS = 60_000


@pytest.fixture(autouse=True)
def quick_disk_test(monkeypatch):
    """The wizard measures the disk once per models folder; 4 MiB keeps tests quick on shared cores."""
    from app.setup import common
    monkeypatch.setattr(common, "DISK_TEST_BYTES", 4 * 2**20)
    monkeypatch.setattr(common, "_machines", {})


def _next(qtbot, wizard):
    button = wizard.button(QWizard.WizardButton.NextButton)
    qtbot.waitUntil(button.isEnabled, timeout=WAIT_MS)
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def _search_and_pick(qtbot, wizard, text, repo_id):
    page = wizard.search_page
    qtbot.keyClicks(page.query, text)
    qtbot.mouseClick(page.search_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(page.search_button.isEnabled, timeout=WAIT_MS)        # the catalog rows were there before
    for i in range(page.results.topLevelItemCount()):
        if page.results.topLevelItem(i).text(0) == repo_id:
            page.results.setCurrentItem(page.results.topLevelItem(i))
    return page


def test_search_pick_estimate_download_repack_then_the_model_answers_in_the_chat(qtbot, hub, tmp_path, monkeypatch):
    from app.setup.wizards import DownloadWizard
    from app.store import ChatSettings, Store
    from app.views.main_window import MainWindow

    monkeypatch.setenv("SLUICE_DATA_DIR", str(tmp_path / "data"))
    window = MainWindow(store=Store(tmp_path / "chat.db"), autoload=False)
    qtbot.addWidget(window)
    window.show()
    # budgets small enough that experts stream: the estimate must use the same ones the app loads with
    window.settings.device, window.settings.vram_budget, window.settings.ram_cache = "cpu", "950KB", "300KB"
    models_dir = window.settings.models_path()
    window.open_download_wizard()                           # the app's own menu action
    wizard = window.findChild(DownloadWizard)
    assert wizard is not None and wizard.isVisible()

    page = _search_and_pick(qtbot, wizard, "tiny", SUPPORTED_REPO)
    listed = [page.results.topLevelItem(i).text(2) for i in range(page.results.topLevelItemCount())]
    assert listed == ["yes", "yes", "no"]                  # supported families first
    _next(qtbot, wizard)

    est_page = wizard.estimate_page
    qtbot.waitUntil(lambda: est_page.quants.isVisible() and est_page.quants.rowCount() == 5, timeout=WAIT_MS)
    assert est_page.family_label.text().startswith("qwen3_moe — supported")
    assert "total" in est_page.params_label.text() and "active per token" in est_page.params_label.text()
    assert "tok/s" in est_page.verdict.text() and "moved per token" in est_page.verdict.text()
    assert wizard.estimate.verdict == "fits fast"
    assert wizard.estimate.ram_cache_bytes == 300_000 and wizard.estimate.vram_budget_bytes == 950_000
    assert 0 < wizard.estimate.slot_hit < 1 and wizard.estimate.bytes_per_token > 0
    assert hub.weight_requests() == []                     # the estimate came from config.json + file list
    est_page.quants.select("bf16")
    assert wizard.quant == "bf16"
    _next(qtbot, wizard)

    qtbot.waitUntil(lambda: wizard.currentPage() is wizard.options_page, timeout=WAIT_MS)   # download done
    assert len(hub.weight_requests()) == 1
    qtbot.waitUntil(lambda: wizard.options_page.quants.rowCount() == 5, timeout=WAIT_MS)
    assert wizard.options_page.quants.quant() == "bf16"
    assert wizard.options_page.name.text() == "Qwen3-MoE-tiny-bf16"
    _next(qtbot, wizard)

    qtbot.waitUntil(lambda: wizard.currentPage() is wizard.done_page, timeout=WAIT_MS)
    model_dir = models_dir / "Qwen3-MoE-tiny-bf16"
    assert (model_dir / "sluice.json").is_file()
    with qtbot.waitSignal(window.model_loaded, timeout=WAIT_MS) as loaded:
        qtbot.mouseClick(wizard.button(QWizard.WizardButton.FinishButton), Qt.MouseButton.LeftButton)
    assert loaded.args[0]["family"] == "qwen3_moe" and loaded.args[0]["ram_cache_bytes"] <= 300_000
    assert loaded.args[0]["slots_per_bank"] * 2 == round(wizard.estimate.slot_hit * 2 * 16)
    assert window.model_picker.findData(str(model_dir)) > 0  # listed in the model picker

    window.controller.set_chat_settings(ChatSettings(max_new_tokens=12, temperature=0.0))
    with qtbot.waitSignal(window.controller.message_finished, timeout=WAIT_MS) as finished:
        window.send("Hello, who are you?")
    answer = finished.args[0]
    assert answer.role == "assistant" and answer.state == "done" and answer.content.strip()
    assert window.shutdown()


def test_unsupported_repo_is_refused_on_the_estimate_page_before_any_weight(qtbot, hub, tmp_path):
    from app.setup.wizards import DownloadWizard
    wizard = DownloadWizard(tmp_path / "models")
    qtbot.addWidget(wizard)
    wizard.show()
    _search_and_pick(qtbot, wizard, "llama", UNSUPPORTED_REPO)
    _next(qtbot, wizard)
    page = wizard.estimate_page
    qtbot.waitUntil(lambda: page.info is not None, timeout=WAIT_MS)
    assert "'llama' model, which Sluice cannot run" in page.status.text()
    assert not wizard.button(QWizard.WizardButton.NextButton).isEnabled()
    assert hub.weight_requests() == [] and not (tmp_path / "models" / ".downloads").exists()


def test_pasted_name_lost_network_retry_then_pause_and_reopened_wizard_resumes(qtbot, hub, tmp_path):
    from app.setup.wizards import DownloadWizard
    from engine.hub.download import STATE_DIR
    models_dir = tmp_path / "models"
    wizard = DownloadWizard(models_dir)
    qtbot.addWidget(wizard)
    wizard.show()
    qtbot.keyClicks(wizard.search_page.query, f"{hub.url}/{SUPPORTED_REPO}")   # a pasted address
    _next(qtbot, wizard)
    qtbot.waitUntil(lambda: wizard.estimate_page.isComplete(), timeout=WAIT_MS)

    size = (hub.repos[SUPPORTED_REPO].folder / "model.safetensors").stat().st_size
    part = models_dir / ".downloads" / SUPPORTED_REPO.replace("/", "--") / STATE_DIR / "model.safetensors.part"
    hub.throttle_bps = 1_000_000
    hub_stopped = threading.Event()

    def stop_hub_mid_file():
        while not (part.exists() and part.stat().st_size > size // 4):
            pass
        hub.stop()
        hub_stopped.set()
    threading.Thread(target=stop_hub_mid_file, daemon=True).start()
    _next(qtbot, wizard)
    page = wizard.download_page
    qtbot.waitUntil(page.retry_button.isVisible, timeout=WAIT_MS)   # the network "dropped"
    assert "connection to the model hub was lost" in page.status.text()
    hub.start()
    qtbot.mouseClick(page.retry_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: part.exists() and part.stat().st_size > size // 2, timeout=WAIT_MS)
    qtbot.mouseClick(page.pause_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: page.pause_button.text() == "Resume", timeout=WAIT_MS)
    assert "Paused" in page.status.text() and "of" in page.bytes_label.text()
    kept = part.stat().st_size
    wizard.reject()                                        # the user closes the window (or the app)
    assert not page.task.is_running()

    hub.throttle_bps = None
    hub.reset_counters()
    again = DownloadWizard(models_dir)                     # opened again later
    qtbot.addWidget(again)
    again.show()
    first = again.search_page.results.topLevelItem(0)      # offered first, already selected
    assert first.text(0).startswith(f"{SUPPORTED_REPO} — unfinished") and first.isSelected()
    _next(qtbot, again)
    _next(qtbot, again)
    qtbot.waitUntil(lambda: again.currentPage() is again.options_page, timeout=WAIT_MS)
    assert hub.bytes_sent_by_path["model.safetensors"] == size - kept
    again.reject()


def test_repack_wizard_offers_each_quant_and_makes_a_loadable_model(qtbot, model_folders, tmp_path):
    from app.setup.wizards import RepackWizard
    from engine import GenerationParams, load
    src = tmp_path / "snapshot"
    shutil.copytree(model_folders[SUPPORTED_REPO], src)
    wizard = RepackWizard(tmp_path / "models", src)
    qtbot.addWidget(wizard)
    wizard.show()
    table = wizard.options_page.quants
    qtbot.waitUntil(lambda: table.rowCount() == 5, timeout=WAIT_MS)
    sizes = {q: e.repacked_bytes for q, e in table.estimates.items()}
    assert sizes["bf16"] > sizes["fp8"] >= sizes["nvfp4"]          # tiny blocks round up to 4 KiB pages
    assert sizes["bf16"] > sizes["int8"] >= sizes["nvfp4"]
    table.select("fp8")
    assert wizard.options_page.name.text() == "snapshot-fp8"
    _next(qtbot, wizard)
    qtbot.waitUntil(lambda: wizard.currentPage() is wizard.done_page, timeout=WAIT_MS)
    with qtbot.waitSignal(wizard.model_ready, timeout=WAIT_MS) as ready:
        qtbot.mouseClick(wizard.button(QWizard.WizardButton.FinishButton), Qt.MouseButton.LeftButton)
    engine = load(ready.args[0], device="cpu")
    try:
        assert engine.info["quant"] == "fp8"
        events = list(engine.generate([{"role": "user", "content": "Hi"}],
                                      GenerationParams(max_new_tokens=5, temperature=0.0)))
        assert events[-1].finished and sum(e.token_id is not None for e in events) >= 1
    finally:
        engine.close()


def test_repack_stopped_after_a_layer_resumes_without_redoing_it(qtbot, model_folders, tmp_path, monkeypatch):
    import engine.format.repack
    from app.setup.wizards import RepackWizard
    real_repack = engine.format.repack.repack
    runs: list[list[str]] = []

    def repack_pressing_stop_after_first_layer(src, dst, quant="bf16", progress=None, cancel_event=None, **kw):
        messages = []
        runs.append(messages)

        def on_progress(done, total, message):
            messages.append(message)
            progress(done, total, message)
            if len(runs) == 1 and message.startswith("layer"):
                cancel_event.set()            # exactly what the Stop button does, at a known point
        return real_repack(src, dst, quant, on_progress, cancel_event, **kw)
    monkeypatch.setattr(engine.format.repack, "repack", repack_pressing_stop_after_first_layer)

    wizard = RepackWizard(tmp_path / "models", model_folders[SUPPORTED_REPO])
    qtbot.addWidget(wizard)
    wizard.show()
    qtbot.waitUntil(lambda: wizard.options_page.quants.rowCount() == 5, timeout=WAIT_MS)
    _next(qtbot, wizard)
    page = wizard.progress_page
    qtbot.waitUntil(page.restart_button.isVisible, timeout=WAIT_MS)
    assert "Stopped" in page.status.text() and not (wizard.repack_dst / "sluice.json").exists()
    assert runs[0] == ["dense weights written", "layer 0 repacked"]
    qtbot.mouseClick(page.restart_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: wizard.currentPage() is wizard.done_page, timeout=WAIT_MS)
    assert runs[1] == ["dense weights written", "layer 1 repacked", "done"]     # layer 0 was not redone
    assert (wizard.repack_dst / "sluice.json").is_file()


def test_too_little_disk_is_shown_on_the_estimate_page_and_blocks_the_download(qtbot, hub, tmp_path, monkeypatch):
    import engine.hub.download
    from app.setup.wizards import DownloadWizard
    monkeypatch.setattr(engine.hub.download, "free_disk_bytes", lambda path: 100_000)   # a nearly full drive
    wizard = DownloadWizard(tmp_path / "models")
    qtbot.addWidget(wizard)
    wizard.show()
    _search_and_pick(qtbot, wizard, "tiny", SUPPORTED_REPO)
    _next(qtbot, wizard)
    page = wizard.estimate_page
    qtbot.waitUntil(lambda: page.quants.rowCount() == 5, timeout=WAIT_MS)
    assert {e.verdict for e in page.quants.estimates.values()} == {"will not run"}
    assert "of disk for download and repack" in page.verdict.text() and "97.66 KiB is free" in page.verdict.text()
    assert not wizard.button(QWizard.WizardButton.NextButton).isEnabled()
    assert hub.weight_requests() == []


def test_cancel_download_asks_then_deletes_the_partial_download(qtbot, hub, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QMessageBox
    from app.setup.wizards import DownloadWizard
    models_dir = tmp_path / "models"
    wizard = DownloadWizard(models_dir)
    qtbot.addWidget(wizard)
    wizard.show()
    _search_and_pick(qtbot, wizard, "tiny", SUPPORTED_REPO)
    _next(qtbot, wizard)
    hub.throttle_bps = 300_000
    _next(qtbot, wizard)
    page = wizard.download_page
    qtbot.waitUntil(lambda: page.bar.value() > 0, timeout=WAIT_MS)
    answers = iter([QMessageBox.StandardButton.No, QMessageBox.StandardButton.Yes])
    monkeypatch.setattr(QMessageBox, "question", lambda *args, **kw: next(answers))
    qtbot.mouseClick(page.discard_button, Qt.MouseButton.LeftButton)        # "No": nothing happens
    assert page.task.is_running() and wizard.currentPage() is page
    qtbot.mouseClick(page.discard_button, Qt.MouseButton.LeftButton)        # "Yes"
    assert wizard.currentPage() is wizard.estimate_page
    assert not (models_dir / ".downloads" / SUPPORTED_REPO.replace("/", "--")).exists()
