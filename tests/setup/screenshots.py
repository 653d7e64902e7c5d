"""Screenshots of every setup wizard page, against the local mock hub, for the README.

Run under Xvfb:  xvfb-run -a -s "-screen 0 1280x900x24" .venv/bin/python tests/setup/screenshots.py docs/screenshots
Serves a mid-size random-weight qwen3_moe (so download and repack are slow enough to catch mid-way),
the tiny test models, and a dense llama that must be refused.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.pop("HF_HUB_OFFLINE", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hubserver import HubServer  # noqa: E402


def build_models(root: Path) -> dict[str, tuple[Path, int, int]]:
    from engine.tools.demo import build_hf_model
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from setup_support import build_llama
    return {
        "sluice-test/Qwen3-MoE-small-random": (build_hf_model(
            "qwen3_moe", root / "small", num_layers=12, num_experts=64, num_experts_per_tok=4, hidden_size=256,
            moe_intermediate_size=256, num_attention_heads=8, num_key_value_heads=4, head_dim=32), 5400, 120),
        "sluice-test/Mixtral-tiny-random": (build_hf_model("mixtral", root / "mixtral", num_layers=2), 820, 31),
        "sluice-test/OLMoE-tiny-random": (build_hf_model("olmoe", root / "olmoe", num_layers=2), 310, 12),
        "sluice-test/Llama-dense-tiny": (build_llama(root / "llama"), 99000, 800),
    }


def main(out_dir: str) -> None:
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QWizard
    from app.setup.wizards import DownloadWizard, RepackWizard

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication([])
    tmp = Path(tempfile.mkdtemp(prefix="sluice-shots-"))
    hub = HubServer()
    for repo_id, (folder, downloads, likes) in build_models(tmp / "repos").items():
        hub.add_repo(repo_id, folder, downloads, likes)
    hub.start()
    os.environ["HF_ENDPOINT"] = hub.url

    def wait(cond, timeout_s=120):
        deadline = time.monotonic() + timeout_s
        while not cond():
            app.processEvents()
            time.sleep(0.01)
            if time.monotonic() > deadline:
                raise TimeoutError("screenshot step timed out")

    def settle(seconds=0.3):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents()
            time.sleep(0.01)

    def shoot(widget, name):
        settle()
        path = out / f"setup-{name}.png"
        widget.grab().save(str(path))
        print(path)

    def next_page(wizard):
        wait(lambda: wizard.button(QWizard.WizardButton.NextButton).isEnabled())
        wizard.next()

    models = tmp / "models"
    wizard = DownloadWizard(models)
    wizard.show()
    page = wizard.search_page
    page.query.setText("sluice-test")
    page.search()
    wait(lambda: page.results.topLevelItemCount() == 4)
    shoot(wizard, "1-search")

    # the unsupported one first: refused on the estimate page
    page.results.setCurrentItem(page.results.topLevelItem(3))
    next_page(wizard)
    wait(lambda: wizard.estimate_page.info is not None)
    shoot(wizard, "2b-estimate-unsupported")
    wizard.back()
    page.results.setCurrentItem(page.results.topLevelItem(0))
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
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/screenshots")
