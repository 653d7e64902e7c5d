"""Opening the app where no window can be shown says why in one sentence instead of a Qt abort."""
import subprocess
import sys
from pathlib import Path

from app.display_check import display_problem

found = lambda name: f"lib{name}.so"     # noqa: E731


def test_no_display_is_one_sentence():
    assert "No graphical display" in display_problem({}, "linux", found)
    assert display_problem({"DISPLAY": ":0"}, "linux", found) is None
    assert display_problem({"WAYLAND_DISPLAY": "wayland-0"}, "linux", lambda n: None) is None
    assert display_problem({"QT_QPA_PLATFORM": "offscreen"}, "linux", found) is None
    assert display_problem({}, "win32", found) is None


def test_missing_xcb_cursor_names_the_package():
    assert "libxcb-cursor0" in display_problem({"DISPLAY": ":0"}, "linux", lambda n: None)


def test_sluice_without_a_display_exits_with_the_sentence(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SLUICE_DATA_DIR": str(tmp_path / "data")}
    result = subprocess.run([str(Path(sys.executable).parent / "sluice")], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("sluice: No graphical display") and result.stderr.count("\n") == 1
