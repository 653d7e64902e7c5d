"""Screenshots of every setup wizard page, against the local mock hub, for the README.

    .venv/bin/python tests/setup/screenshots.py [OUT_DIR]   # re-runs itself under xvfb-run without a display
Serves a mid-size random-weight qwen3_moe (so download and repack are slow enough to catch mid-way),
the tiny test models, a small DeepSeek-V3, and a dense llama that must be refused.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.pop("HF_HUB_OFFLINE", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from hubserver import HubServer  # noqa: E402
from shots import Camera, run_with_display  # noqa: E402

SIZE = (1280, 900)


def build_models(root: Path) -> dict[str, tuple[Path, int, int]]:
    from engine.tools.demo import build_hf_model
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from setup_support import build_llama
    return {
        "sluice-test/Qwen3-MoE-small-random": (build_hf_model(
            "qwen3_moe", root / "small", num_layers=12, num_experts=64, num_experts_per_tok=4, hidden_size=256,
            moe_intermediate_size=256, num_attention_heads=8, num_key_value_heads=4, head_dim=32), 5400, 120),
        "sluice-test/DeepSeek-V3-small-random": (build_hf_model("deepseek_v3", root / "dsv3"), 2400, 90),
        "sluice-test/Mixtral-tiny-random": (build_hf_model("mixtral", root / "mixtral", num_layers=2), 820, 31),
        "sluice-test/OLMoE-tiny-random": (build_hf_model("olmoe", root / "olmoe", num_layers=2), 310, 12),
        "sluice-test/Llama-dense-tiny": (build_llama(root / "llama"), 99000, 800),
    }


def main() -> int:
    return run_with_display(__file__, SIZE, take_screenshots)


def take_screenshots(out: Path, tmp: Path) -> None:
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QWizard
    from app.setup.wizards import DownloadWizard, RepackWizard

    app = QApplication.instance() or QApplication([])
    camera = Camera(app, out)
    wait = camera.wait_until
    hub = HubServer()
    for repo_id, (folder, downloads, likes) in build_models(tmp / "repos").items():
        hub.add_repo(repo_id, folder, downloads, likes)
    hub.start()
    os.environ["HF_ENDPOINT"] = hub.url

    def shoot(widget, name):
        camera.shoot(f"setup-{name}", widget)

    def next_page(wizard):
        wait(lambda: wizard.button(QWizard.WizardButton.NextButton).isEnabled())
        wizard.next()

    def pick(page, name_part: str) -> None:
        items = [page.results.topLevelItem(i) for i in range(page.results.topLevelItemCount())]
        page.results.setCurrentItem(next(item for item in items if name_part in item.text(0)))

    models = tmp / "models"
    wizard = DownloadWizard(models)
    wizard.show()
    page = wizard.search_page
    page.query.setText("sluice-test")
    page.search()
    wait(lambda: page.results.topLevelItemCount() == len(hub.repos))
    shoot(wizard, "1-search")

    # the unsupported one first: refused on the estimate page
    pick(page, "Llama-dense")
    next_page(wizard)
    wait(lambda: wizard.estimate_page.info is not None)
    shoot(wizard, "2b-estimate-unsupported")
    wizard.back()
    pick(page, "DeepSeek-V3")          # MLA, grouped sigmoid routing, a shared expert, a dense first layer
    next_page(wizard)
    wait(lambda: wizard.estimate_page.quants.rowCount() >= 4)
    shoot(wizard, "2c-estimate-deepseek")
    wizard.back()
    pick(page, "Qwen3-MoE-small")
    next_page(wizard)
    wait(lambda: wizard.estimate_page.quants.rowCount() == 5)
    shoot(wizard, "2-estimate")

    hub.throttle_bps = 40e6
    next_page(wizard)
    size = sum(f.size for f in wizard.repo_info.model_files())
    wait(lambda: wizard.download_page.bar.value() * 1024 > size * 0.4)
    shoot(wizard, "3-download")
    hub.throttle_bps = None
    wait(lambda: wizard.currentPage() is wizard.options_page and wizard.options_page.quants.rowCount() == 5)
    shoot(wizard, "4-repack-options")
    next_page(wizard)
    wait(lambda: wizard.progress_page.bar.value() >= 3)
    shoot(wizard, "5-repack-progress")
    wait(lambda: wizard.currentPage() is wizard.done_page)
    shoot(wizard, "6-done")
    wizard.accept()

    repack = RepackWizard(models, wizard.snapshot_dir)
    repack.show()
    wait(lambda: repack.options_page.quants.rowCount() == 5)
    repack.options_page.quants.select("nvfp4")
    shoot(repack, "7-repack-wizard")
    repack.reject()
    hub.stop()
    QTimer.singleShot(0, app.quit)


if __name__ == "__main__":
    sys.exit(main())
