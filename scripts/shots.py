"""What every screenshot script shares: an X screen, a fresh data dir, a camera that pumps the event loop.

    from shots import Camera, run_with_display
Used by scripts/screenshots.py (the app), scripts/screenshots_server.py (the Local server, a remote
model) and tests/setup/screenshots.py (the setup wizards). Each takes an output folder as its first
argument (default docs/screenshots), so a look after a change need not touch the README's pictures.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "docs" / "screenshots"


def run_with_display(script: str, size: tuple[int, int], take) -> int:
    """Runs `take(out_dir)` with a display and a fresh SLUICE_DATA_DIR; re-runs `script` under xvfb-run
    when there is none (offscreen cannot grab the whole screen). Returns the exit code."""
    if not os.environ.get("DISPLAY") and os.environ.get("QT_QPA_PLATFORM") != "offscreen" \
            and os.environ.get("SLUICE_SCREENSHOT_CHILD") != "1":
        if not shutil.which("xvfb-run"):
            print("xvfb-run is missing: apt-get install -y --no-install-recommends xvfb xauth", file=sys.stderr)
            return 1
        env = {**os.environ, "SLUICE_SCREENSHOT_CHILD": "1", "QT_QPA_PLATFORM": "xcb"}
        return subprocess.call(["xvfb-run", "-a", "-s", f"-screen 0 {size[0]}x{size[1]}x24",
                                sys.executable, script, *sys.argv[1:]], env=env)
    sys.path.insert(0, str(ROOT))
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sluice-shots-"))
    os.environ["SLUICE_DATA_DIR"] = str(work / "data")
    try:
        return take(out, work) or 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


class Camera:
    """Waits on the app the way app.exec() runs it, and saves pictures into `out`."""

    def __init__(self, app, out: Path):
        self.app = app
        self.out = Path(out)

    def pump(self, seconds: float) -> None:
        """A real event loop for `seconds` (QTest.qWait holds the GIL and starves the engine thread)."""
        from PySide6.QtCore import QEvent, QEventLoop, QTimer
        loop = QEventLoop()
        QTimer.singleShot(int(seconds * 1000), loop.quit)
        loop.exec()
        self.app.sendPostedEvents(None, QEvent.Type.DeferredDelete)

    def wait_until(self, predicate, timeout_s: float = 300.0) -> None:
        end = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > end:
                raise TimeoutError("the app did not get there in time")
            self.pump(0.05)

    def shoot(self, name: str, widget=None) -> Path:
        """Saves `widget` (default: the whole screen, window frame and dialogs included) as out/name.png."""
        from PySide6.QtGui import QGuiApplication
        self.pump(0.3)
        path = self.out / f"{name}.png"
        image = widget.grab() if widget is not None else QGuiApplication.primaryScreen().grabWindow(0)
        image.save(str(path))
        print("wrote", path)
        return path
