"""Turns engine telemetry snapshots (engine.runtime.telemetry) into the series the live panels plot. Qt-free.

Every derived figure comes from the engine: the interval rates from engine.interval_figures (deltas of
the cumulative counters between two snapshots), hit rates and recall from the snapshot itself. While
the engine is idle the speed series hold NaN: an idle panel shows no speed, not the last answer's.
"""
from __future__ import annotations

import math
import sys
from collections import deque
from dataclasses import dataclass, field

from engine import interval_figures

GB = 1e9


def _get(snapshot: dict, section: str, key: str, default=0):
    value = (snapshot.get(section) or {}).get(key, default)
    return default if value is None else value


@dataclass
class Series:
    """Fixed-length history of one quantity; NaN marks "no data in this interval"."""
    max_len: int
    values: deque = field(default_factory=deque)

    def push(self, value: float) -> None:
        self.values.append(value)
        while len(self.values) > self.max_len:
            self.values.popleft()


class TelemetryHistory:
    NAMES = ("time_s", "decode_tok_s", "prefill_tok_s", "disk_gbps", "system_disk_gbps", "h2d_gbps", "hit_rate")

    def __init__(self, window_s: float = 60.0, rate_hz: float = 10.0):
        max_len = int(window_s * rate_hz)
        self.series = {name: Series(max_len) for name in self.NAMES}
        self.latest: dict = {}
        self._previous: tuple[float, dict, int | None] | None = None
        self._t0: float | None = None

    def push(self, snapshot: dict, now_s: float, system_read_bytes: int | None = None,
             is_busy: bool = True) -> None:
        if self._t0 is None:
            self._t0 = now_s
        self.latest = snapshot
        previous = self._previous
        self._previous = (now_s, snapshot, system_read_bytes)
        if previous is None or now_s <= previous[0]:
            return
        dt = now_s - previous[0]
        figures = interval_figures(previous[1], snapshot, dt)
        system = math.nan
        if system_read_bytes is not None and previous[2] is not None:
            system = max(0, system_read_bytes - previous[2]) / dt / GB
        speed = (lambda key: float(_get(snapshot, "speed", key))) if is_busy else (lambda key: math.nan)
        hit_rate = figures["ram_hit_rate"]
        values = {
            "time_s": now_s - self._t0,
            "decode_tok_s": speed("decode_tok_s"),
            "prefill_tok_s": speed("prefill_tok_s"),
            "disk_gbps": figures["disk_gbps"],
            "system_disk_gbps": system,
            "h2d_gbps": figures["h2d_gbps"],
            "hit_rate": math.nan if hit_rate is None else hit_rate,
        }
        for name, value in values.items():
            self.series[name].push(value)

    def values(self, name: str) -> list[float]:
        return list(self.series[name].values)

    # Summaries of the latest snapshot ----------------------------------------------------------
    def cache_summary(self) -> dict:
        s = self.latest
        hits, misses = _get(s, "ram_cache", "hits"), _get(s, "ram_cache", "misses")
        return {
            "used_bytes": _get(s, "ram_cache", "used_bytes"),
            "capacity_bytes": _get(s, "ram_cache", "capacity_bytes"),
            "hits": hits, "misses": misses, "evictions": _get(s, "ram_cache", "evictions"),
            "fill_reads": _get(s, "ram_cache", "fill_reads"),      # read ahead into free slots (Experts.fill)
            "hit_rate": _get(s, "ram_cache", "hit_rate") if hits + misses else None,     # None: no lookup yet
        }

    def speculation_recall(self) -> float | None:
        """The engine's recall, None before its first prediction."""
        has_predicted = _get(self.latest, "speculation", "predicted") > 0
        return _get(self.latest, "speculation", "recall") if has_predicted else None

    def slots(self) -> list[dict]:
        return list(_get(self.latest, "vram", "slots", []) or [])


def thread_last_core(native_thread_id: int | None) -> int | None:
    """CPU core a thread last ran on (Linux: field 39 of /proc/self/task/TID/stat), else None."""
    if native_thread_id is None or not sys.platform.startswith("linux"):
        return None
    try:
        with open(f"/proc/self/task/{native_thread_id}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()      # fields after "(comm)", starting at field 3
    return int(fields[39 - 3])
