"""The window at its own minimum size and at 1280 x 800: the status bar and the Local server dock fit, nothing overlaps."""
from PySide6.QtWidgets import QWidget

LONG_MODEL = "Qwen3-235B-A22B-Instruct-2507-fp8-repacked-for-streaming"
LONGEST_SPEED = "123.4 tok/s of 456.7 possible · TTFT 12.34 s"


def _sizes(window) -> list[tuple[int, int]]:
    return [(1280, 800), (window.minimumSize().width(), window.minimumSize().height())]


def _status_widgets(window) -> list[QWidget]:
    bar = window.statusBar()
    return [w for w in bar.findChildren(QWidget) if w.parentWidget() is bar and w.isVisible()]


def test_status_bar_labels_never_overlap_and_the_long_one_elides(qtbot, loaded_window):
    window = loaded_window
    window._show_loaded({**window.model_info, "name": LONG_MODEL, "dense_quant": "int8", "max_context": 262_144,
                         "device": "cuda:0"})
    window.speed_label.setText(LONGEST_SPEED)
    full = window.model_label.text()
    for size in _sizes(window):
        window.resize(*size)
        qtbot.wait(100)
        widgets = _status_widgets(window)
        assert window.model_label in widgets and window.speed_label in widgets and window.device_label in widgets
        for i, first in enumerate(widgets):
            assert first.width() >= first.minimumSizeHint().width(), (size, first)
            assert window.statusBar().rect().contains(first.geometry()), (size, first)
            for second in widgets[i + 1:]:
                assert not first.geometry().intersects(second.geometry()), (size, first, second)
        for label in (window.speed_label, window.device_label):                 # short: shown whole
            assert label.width() >= label.fontMetrics().horizontalAdvance(label.text()), (size, label.text())
        assert window.model_label.text() == full and window.model_label.toolTip() == full
    shown = window.model_label.shown_text()                                       # at the minimum size
    assert shown.endswith("…") and full.startswith(shown[:-1]) and LONG_MODEL in window.model_label.toolTip()
