"""Guard against a Qt binding that corrupts reference counts (PySide6 6.12.0 on Python 3.11 does:
each void call drops a reference to None and each Signal.emit one to True, so the app aborts
with "Fatal Python error: none_dealloc" within seconds of streaming)."""
import sys

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QLabel


class _Emitter(QObject):
    ping = Signal(int)


def test_qt_calls_and_signals_keep_reference_counts(qtbot):
    label = QLabel()
    qtbot.addWidget(label)
    emitter = _Emitter()
    emitter.ping.connect(lambda _value: None)
    none_before, true_before = sys.getrefcount(None), sys.getrefcount(True)
    for i in range(50):
        label.setText(str(i))
        emitter.ping.emit(i)
    assert sys.getrefcount(None) - none_before > -25, "the Qt binding leaks references to None; pin PySide6 6.11.3"
    assert sys.getrefcount(True) - true_before > -25, "the Qt binding leaks references to True; pin PySide6 6.11.3"
