"""The menu bar (File, Edit, View, Help; Ctrl+Q; About) and an idle app that leaves the CPU alone."""
import time

import psutil
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from app_helpers import WAIT_MS, make_window


def test_menu_bar_quit_shortcut_and_about_box(qtbot, data_dir):
    window = make_window(qtbot, data_dir)
    titles = [action.text().replace("&", "") for action in window.menuBar().actions()]
    assert titles == ["File", "Edit", "View", "Help"]
    window.show_about()
    about = window.last_dialog
    assert about.objectName() == "aboutDialog" and "Sluice 0.1.0" in about.text()
    assert "LGPL-3.0" in about.text() and "Apache-2.0" in about.text()
    about.accept()
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=WAIT_MS)
    QTest.keyClick(window, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=WAIT_MS)
    assert window._is_shut_down and not window.host.thread.isRunning()


def _cpu_percent(qtbot, seconds: float) -> float:
    process = psutil.Process()
    start_cpu, start = sum(process.cpu_times()[:2]), time.perf_counter()
    qtbot.wait(int(seconds * 1000))
    return 100 * (sum(process.cpu_times()[:2]) - start_cpu) / (time.perf_counter() - start)


def test_an_idle_window_uses_at_most_2_percent_of_a_core_hidden_panels_and_5_shown(qtbot, loaded_window):
    window = loaded_window
    window.panels_action.setChecked(True)
    qtbot.wait(500)
    shown = _cpu_percent(qtbot, 4)
    window.panels_action.setChecked(False)
    qtbot.wait(500)
    hidden = _cpu_percent(qtbot, 4)
    print(f"idle CPU: panels shown {shown:.1f} %, hidden {hidden:.1f} %")
    assert shown <= 5 and hidden <= 2
    assert not window.panels.timer.isActive()                  # hidden panels do not refresh at all
