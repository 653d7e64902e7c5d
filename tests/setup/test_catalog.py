"""The shipped catalog of supported models: shown before any search and offline; a hub that does not
answer is reported within seconds, with Retry in view."""
from __future__ import annotations

import threading

import pytest

pytest.importorskip("pytestqt")

from app.setup.catalog import load_catalog  # noqa: E402
from engine.hub.search import supported_families  # noqa: E402


def test_the_catalog_lists_supported_families_with_sizes_and_active_parameters():
    models = load_catalog()
    assert len(models) >= 6 and len({m.repo for m in models}) == len(models)
    for model in models:
        assert model.family in supported_families() and "/" in model.repo
        assert 0 < model.active_params_b < model.total_params_b and model.download_gb > 0


def test_the_wizard_shows_the_catalog_offline_and_a_failed_search_offers_retry(qtbot, tmp_path):
    from app.setup.wizards import DownloadWizard
    wizard = DownloadWizard(tmp_path / "models")
    qtbot.addWidget(wizard)
    wizard.show()
    page = wizard.search_page
    repos = [page.results.topLevelItem(i).data(0, 256) for i in range(page.results.topLevelItemCount())]
    assert repos == [m.repo for m in load_catalog()]                     # before any search, no network
    page.results.setCurrentItem(page.results.topLevelItem(0))
    assert page.isComplete()
    page.query.setText("qwen")
    page.search()                                                        # HF_HUB_OFFLINE: fails at once
    qtbot.waitUntil(page.retry_button.isVisible, timeout=5000)
    assert page.search_button.isEnabled() and page.status.text()
    wizard.reject()


def test_offline_a_search_narrows_the_catalog_and_a_typed_name_says_where_next_goes(qtbot, tmp_path):
    from app.setup.wizards import DownloadWizard
    wizard = DownloadWizard(tmp_path / "models")
    qtbot.addWidget(wizard)
    wizard.show()
    page = wizard.search_page
    qtbot.keyClicks(page.query, "qwen3 moe")
    assert not page.isComplete() and "Press Search" in page.status.text()     # why Next is grey
    page.search()                                                         # HF_HUB_OFFLINE: fails at once
    qtbot.waitUntil(page.retry_button.isVisible, timeout=5000)
    shown = [page.results.topLevelItem(i).data(0, 256) for i in range(page.results.topLevelItemCount())
             if not page.results.topLevelItem(i).isHidden()]
    expected = [m.repo for m in load_catalog() if m.family == "qwen3_moe"]
    assert shown == expected and f"the catalog's {len(expected)} models matching 'qwen3 moe'" in page.status.text()
    page.query.clear()
    qtbot.keyClicks(page.query, "Qwen/Qwen3-30B-A3B")
    assert page.isComplete() and page.status.text() == "Next: Qwen/Qwen3-30B-A3B."
    wizard.reject()


def test_a_hub_that_does_not_answer_is_reported_within_seconds(qtbot, tmp_path, monkeypatch):
    from app.setup import search_page
    from app.setup.wizards import DownloadWizard
    from engine.hub import search as hub_search
    release = threading.Event()
    monkeypatch.setattr(hub_search, "search", lambda *a, **k: release.wait(30) and [])   # a silent network
    wizard = DownloadWizard(tmp_path / "models")
    qtbot.addWidget(wizard)
    wizard.show()
    page = wizard.search_page
    page._timeout.setInterval(300)                                       # SEARCH_TIMEOUT_S, shortened
    page.search()
    qtbot.waitUntil(page.retry_button.isVisible, timeout=3000)
    assert f"did not answer within {search_page.SEARCH_TIMEOUT_S} s" in page.status.text()
    assert page.results.topLevelItemCount() == len(load_catalog())      # the catalog is still there to pick
    release.set()
    wizard.reject()


def test_the_estimate_page_offline_shows_what_the_catalog_knows_and_retry(qtbot, tmp_path):
    from app.setup.wizards import DownloadWizard
    wizard = DownloadWizard(tmp_path / "models")
    qtbot.addWidget(wizard)
    wizard.show()
    known = load_catalog()[2]
    wizard.search_page.query.setText(known.repo)
    wizard.next()                                                        # HF_HUB_OFFLINE: the hub cannot be read
    page = wizard.estimate_page
    qtbot.waitUntil(page.retry_button.isVisible, timeout=10_000)
    assert page.status.text() and known.family in page.family_label.text()
    assert f"{known.download_gb:g} GB to download" in page.family_label.text()
    assert not page.isComplete()
    page.retry_button.click()                                            # tries again: fails again, offline
    assert not page.retry_button.isVisible()
    qtbot.waitUntil(page.retry_button.isVisible, timeout=10_000)
    wizard.reject()
