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


def _overlapping_rows(panel) -> list[tuple[str, str]]:
    """Pairs of visible widgets laid out side by side in one box (a row, a form) that overlap."""
    from PySide6.QtWidgets import QGroupBox
    pairs = []
    for box in [panel, *panel.findChildren(QGroupBox)]:
        children = [w for w in box.findChildren(QWidget) if w.parentWidget() is box and w.isVisible()
                    and not w.isWindow()]
        for i, first in enumerate(children):
            pairs += [(type(first).__name__, type(second).__name__) for second in children[i + 1:]
                      if first.geometry().intersects(second.geometry())]
    return pairs


def _usable_height(dock) -> int:
    return dock.widget().viewport().height()


def test_local_server_dock_fits_the_minimum_size_and_leaves_machinery_room(qtbot, data_dir):
    from PySide6.QtCore import Qt

    from app.views.main_window import MIN_HEIGHT
    from app_helpers import make_window
    window = make_window(qtbot, data_dir)
    panel = window.server_panel
    window.server_action.trigger()                              # opened as a tab beside Machinery
    qtbot.wait(100)
    assert window.minimumSize().height() == MIN_HEIGHT          # it scrolls below its height: the window keeps its own
    for size in _sizes(window):
        window.resize(*size)
        qtbot.wait(100)
        assert not _overlapping_rows(panel), size
        assert panel.width() <= window.server_dock.widget().viewport().width(), size    # nothing cut on the right
        placeholder = panel.key.fontMetrics().horizontalAdvance(panel.key.placeholderText())
        assert placeholder + 16 <= panel.key.width(), (size, panel.key.placeholderText())
        assert panel.log.height() >= 6 * panel.log.fontMetrics().lineSpacing()

    # Stacked under Machinery instead of tabbed (a dock dragged there): both keep a usable height.
    window.removeDockWidget(window.server_dock)
    window.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, window.server_dock)
    window.splitDockWidget(window.panels_dock, window.server_dock, Qt.Orientation.Vertical)
    window.server_dock.show()
    qtbot.wait(100)
    window.resize(window.minimumSize())
    qtbot.wait(100)
    assert window.height() == MIN_HEIGHT
    assert _usable_height(window.panels_dock) >= 120 and _usable_height(window.server_dock) >= 120
    assert window.shutdown()
