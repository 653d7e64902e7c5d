"""The held n-gram tables' background read goes last on the disk: it waits while other reads are in flight."""
import threading
import time

import numpy as np

from engine.format.ngram import PAGE
from engine.runtime import ngram
from engine.runtime.ngram import HeldTables, PageReader
from engine.runtime.telemetry import Telemetry


def _tables(tmp_path, pages):
    data = np.random.default_rng(0).integers(0, 256, pages * PAGE - 100, dtype=np.uint8)   # a partial last page
    path = tmp_path / "ngram.bin"
    path.write_bytes(data.tobytes())
    return PageReader(path), data


def test_the_read_waits_while_other_reads_are_in_flight_then_reads_everything(tmp_path, monkeypatch):
    monkeypatch.setattr(ngram, "HOLD_READ_PAGES", 2)
    monkeypatch.setattr(ngram, "HOLD_DEFER_S", 30.0)
    reader, data = _tables(tmp_path, 7)
    busy = threading.Event()
    busy.set()                                           # a step's experts are being read
    held = HeldTables(reader, len(data), Telemetry(), busy.is_set)
    time.sleep(0.3)
    assert held.upto == 0                                # nothing read behind them
    busy.clear()
    held._thread.join(timeout=30)
    assert held.upto == len(data) and held.data[:len(data)].tobytes() == data.tobytes()
    held.close()
    reader.close()


def test_under_a_steady_load_the_read_still_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(ngram, "HOLD_READ_PAGES", 2)
    monkeypatch.setattr(ngram, "HOLD_DEFER_S", 0.01)
    reader, data = _tables(tmp_path, 7)
    held = HeldTables(reader, len(data), Telemetry(), lambda: True)
    held._thread.join(timeout=30)
    assert held.upto == len(data) and held.data[:len(data)].tobytes() == data.tobytes()
    held.close()
    reader.close()
