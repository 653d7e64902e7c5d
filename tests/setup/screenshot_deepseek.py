"""Screenshot of the download wizard's estimate page for a DeepSeek model, against the local mock hub.

Run under Xvfb:  xvfb-run -a -s "-screen 0 1280x900x24" .venv/bin/python tests/setup/screenshot_deepseek.py docs/screenshots
The repo is a small random DeepSeek-V3 (MLA, grouped sigmoid routing, a shared expert, a dense first layer).
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


def main(out_dir: str) -> None:
    from PySide6.QtWidgets import QApplication, QWizard

    from app.setup.wizards import DownloadWizard
    from engine.tools.demo import build_hf_model
    app = QApplication.instance() or QApplication([])
    tmp = Path(tempfile.mkdtemp(prefix="sluice-shot-"))
    hub = HubServer()
    hub.add_repo("sluice-test/DeepSeek-V3-small-random", build_hf_model("deepseek_v3", tmp / "dsv3"), 2400, 90)
    hub.start()
    os.environ["HF_ENDPOINT"] = hub.url

    def wait(cond, timeout_s=120):
        deadline = time.monotonic() + timeout_s
        while not cond():
            app.processEvents()
            time.sleep(0.01)
            if time.monotonic() > deadline:
                raise TimeoutError("screenshot step timed out")

    wizard = DownloadWizard(tmp / "models")
    wizard.show()
    page = wizard.search_page
    page.query.setText("sluice-test")
    page.search()

    def found():
        items = [page.results.topLevelItem(i) for i in range(page.results.topLevelItemCount())]
        return next((it for it in items if "DeepSeek" in it.text(0)), None)
    wait(lambda: found() is not None)
    page.results.setCurrentItem(found())
    wait(lambda: wizard.button(QWizard.WizardButton.NextButton).isEnabled())
    wizard.next()
    wait(lambda: wizard.estimate_page.quants.rowCount() >= 4)
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.01)
    path = Path(out_dir) / "setup-2c-estimate-deepseek.png"
    wizard.grab().save(str(path))
    print(path)
    wizard.reject()
    hub.stop()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/screenshots")
