"""Counters shared by the store, caches and generator; `snapshot()` is the DESIGN.md schema.

Writers call `add`/`set` from the engine and reader threads; readers (GUI at 10 Hz, CLI, server)
call `snapshot()` from any thread. One lock, plain ints and floats: cheap on both sides.
"""
from __future__ import annotations

import threading
from collections import defaultdict


def current_cpu() -> int:
    """The CPU core the calling thread last ran on (Linux), or -1 where the system does not say."""
    try:
        with open("/proc/thread-self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])     # field 39 of proc(5): processor
    except (OSError, ValueError, IndexError):
        return -1


class Telemetry:
    def __init__(self):
        self._lock = threading.Lock()
        self._values: dict[str, float] = defaultdict(float)
        self._slot_source = None      # callable -> list of slot dicts
        self.warnings: list[str] = []
        self.info: dict = {}

    def add(self, **deltas: float) -> None:
        with self._lock:
            for key, delta in deltas.items():
                self._values[key] += delta

    def set(self, **values: float) -> None:
        with self._lock:
            self._values.update(values)

    def set_max(self, **values: float) -> None:
        with self._lock:
            for key, value in values.items():
                self._values[key] = max(self._values[key], value)

    def get(self, key: str) -> float:
        with self._lock:
            return self._values[key]

    def warn(self, message: str) -> None:
        with self._lock:
            if message not in self.warnings:
                self.warnings.append(message)

    def attach_slots(self, source) -> None:
        self._slot_source = source

    def snapshot(self) -> dict:
        with self._lock:
            v = dict(self._values)
            warnings = list(self.warnings)
        slots = self._slot_source() if self._slot_source else []
        i = lambda key: int(v.get(key, 0))                         # noqa: E731
        rate = lambda num, secs: (v.get(num, 0) / v[secs] / 1e9) if v.get(secs) else 0.0   # noqa: E731
        hits, misses = i("ram_hits"), i("ram_misses")
        return {
            "tokens": {"prompt": i("prompt_tokens"), "generated": i("generated_tokens")},
            "speed": {"decode_tok_s": v.get("decode_tok_s", 0.0), "prefill_tok_s": v.get("prefill_tok_s", 0.0),
                      "ttft_s": v.get("ttft_s", 0.0)},
            "ram_cache": {"capacity_bytes": i("ram_capacity_bytes"), "used_bytes": i("ram_used_bytes"),
                          "hits": hits, "misses": misses, "evictions": i("ram_evictions"),
                          "hit_rate": hits / (hits + misses) if hits + misses else 0.0},
            "vram": {"budget_bytes": i("vram_budget_bytes"), "peak_bytes": i("vram_peak_bytes"),
                     "used_bytes": i("vram_used_bytes"), "slot_bytes": i("vram_slot_bytes"),
                     "graph_bytes": i("vram_graph_bytes"), "kv_tokens": i("kv_tokens"),
                     "hits": i("vram_hits"), "misses": i("vram_misses"), "slots": slots},
            "disk": {"bytes_read": i("disk_bytes_read"), "reads": i("disk_reads"),
                     "read_gbps": rate("disk_bytes_read", "disk_busy_s"),
                     "max_reads_per_expert_in_prefill": i("prefill_max_expert_reads")},
            "h2d": {"bytes": i("h2d_bytes"), "gbps": rate("h2d_bytes", "h2d_busy_s")},
            "d2h": {"bytes": i("d2h_bytes")},     # VRAM victims written back to the RAM cache (exclusive tiers)
            "speculation": {"predicted": i("spec_predicted"), "correct": i("spec_correct")},
            "prefetch": {"issued": i("prefetch_issued"), "used": i("prefetch_used")},
            "device": self.info.get("device", "cpu"),
            "decode_thread_core": v.get("decode_thread_core", -1),
            "warnings": warnings,
        }
