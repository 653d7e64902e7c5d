"""Counters shared by the store, caches and generator; `snapshot()` is the schema in docs/ARCHITECTURE.md.

Writers call `add`/`set`/`set_max` from the engine and reader threads; readers (GUI at 10 Hz, CLI,
server) call `snapshot()` from any thread. One lock, plain ints and floats: cheap on both sides.
Every counter is declared in COUNTERS (a typo fails loudly instead of becoming a new counter), and the
figures derived from counters (hit rates, rates, per-phase deltas) are computed here only.
"""
from __future__ import annotations

import threading

from engine.runtime.memory import process_memory
from engine.runtime.ngram_stats import NGRAM_COUNTERS, ngram_section

COUNTERS = frozenset({
    "prompt_tokens", "generated_tokens", "decode_tok_s", "prefill_tok_s", "ttft_s", "decode_thread_core",
    "ram_capacity_bytes", "ram_used_bytes", "ram_held_bytes", "ram_hits", "ram_misses", "ram_evictions",
    "vram_budget_bytes", "vram_peak_bytes", "vram_used_bytes", "vram_slot_bytes", "vram_graph_bytes", "kv_tokens",
    "vram_context_bytes",
    "vram_hits", "vram_misses",
    "disk_bytes_read", "disk_reads", "disk_busy_s", "disk_active_s", "prefill_max_expert_reads", "ram_fill_reads",
    "h2d_bytes", "h2d_busy_s", "d2h_bytes",
    "spec_predicted", "spec_correct", "prefetch_issued", "prefetch_used",
    "cpu_experts", "cpu_expert_bytes", "cpu_busy_s", "sync_wait_s", "read_wait_s",
}) | NGRAM_COUNTERS


def current_cpu() -> int:
    """The CPU core the calling thread last ran on (Linux), or -1 where the system does not say."""
    try:
        with open("/proc/thread-self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])     # field 39 of proc(5): processor
    except (OSError, ValueError, IndexError):
        return -1


def ratio(part: float, whole: float) -> float:
    """part / whole, 0 when nothing happened (a hit rate before any lookup)."""
    return part / whole if whole else 0.0


def hit_rate(section: dict) -> float:
    """hits / (hits + misses) of a snapshot section with `hits` and `misses` (ram_cache, vram)."""
    return ratio(section.get("hits", 0), section.get("hits", 0) + section.get("misses", 0))


def value_at(snapshot: dict, path: tuple[str, ...]) -> float:
    for key in path:
        snapshot = snapshot.get(key, 0) if isinstance(snapshot, dict) else 0
    return float(snapshot or 0)


def delta(after: dict, before: dict, *path: str) -> float:
    """How much a counter grew between two snapshots (e.g. over the decode phase)."""
    return value_at(after, path) - value_at(before or {}, path)


def phase_hit_rate(after: dict, before: dict, section: str) -> float:
    """The hit rate of `section` between two snapshots."""
    hits = delta(after, before, section, "hits")
    return ratio(hits, hits + delta(after, before, section, "misses"))


def interval_figures(before: dict, after: dict, dt_s: float) -> dict:
    """The rates between two snapshots taken dt_s apart (the live panels' plots, true averages whatever the
    engine's instantaneous figures say): disk and host->device GB/s, and the RAM cache's hit rate over the
    interval (None when it had no lookup)."""
    lookups = delta(after, before, "ram_cache", "hits") + delta(after, before, "ram_cache", "misses")
    return {"disk_gbps": max(0.0, delta(after, before, "disk", "bytes_read")) / dt_s / 1e9,
            "h2d_gbps": max(0.0, delta(after, before, "h2d", "bytes")) / dt_s / 1e9,
            "ram_hit_rate": phase_hit_rate(after, before, "ram_cache") if lookups > 0 else None}


class Telemetry:
    def __init__(self):
        self._lock = threading.Lock()
        self._values: dict[str, float] = dict.fromkeys(COUNTERS, 0.0)
        self._values["decode_thread_core"] = -1
        self._slot_source = None      # callable -> list of slot dicts
        self._driver_vram = None      # callable -> bytes the GPU driver shows for this process, or None
        self.warnings: list[str] = []
        self.info: dict = {}

    def add(self, **deltas: float) -> None:
        values = self._values                      # every declared counter is a key (a decode step adds ~10 a layer)
        with self._lock:
            try:
                for key, value in deltas.items():
                    values[key] += value
            except KeyError:
                _declared(key)
                raise

    def set(self, **values: float) -> None:
        with self._lock:
            for key, value in values.items():
                self._values[_declared(key)] = value

    def set_max(self, **values: float) -> None:
        with self._lock:
            for key, value in values.items():
                self._values[_declared(key)] = max(self._values[key], value)

    def warn(self, message: str) -> None:
        with self._lock:
            if message not in self.warnings:
                self.warnings.append(message)

    def attach_slots(self, source) -> None:
        self._slot_source = source

    def attach_driver_vram(self, source) -> None:
        self._driver_vram = source

    def snapshot(self) -> dict:
        with self._lock:
            v = dict(self._values)
            warnings = list(self.warnings)
        slots = self._slot_source() if self._slot_source else []
        driver = self._driver_vram() if self._driver_vram else None
        rss, anon = process_memory()
        i = lambda key: int(v[key])                                # noqa: E731
        gbps = lambda num, secs: ratio(v[num], v[secs]) / 1e9       # noqa: E731
        cache_held = max(i("ram_held_bytes"), i("ram_used_bytes"))
        ram = {"capacity_bytes": i("ram_capacity_bytes"), "used_bytes": i("ram_used_bytes"), "held_bytes": cache_held,
               "hits": i("ram_hits"), "misses": i("ram_misses"), "evictions": i("ram_evictions"),
               "fill_reads": i("ram_fill_reads")}       # blocks read ahead of need into free slots (Experts.fill)
        vram = {"budget_bytes": i("vram_budget_bytes"), "peak_bytes": i("vram_peak_bytes"),
                "used_bytes": i("vram_used_bytes"), "slot_bytes": i("vram_slot_bytes"),
                "graph_bytes": i("vram_graph_bytes"), "context_bytes": i("vram_context_bytes"),
                "kv_tokens": i("kv_tokens"),
                "hits": i("vram_hits"), "misses": i("vram_misses"), "slots": slots,
                "driver_bytes": driver or 0}
        return {
            "tokens": {"prompt": i("prompt_tokens"), "generated": i("generated_tokens")},
            "speed": {"decode_tok_s": v["decode_tok_s"], "prefill_tok_s": v["prefill_tok_s"], "ttft_s": v["ttft_s"]},
            "ram_cache": {**ram, "hit_rate": hit_rate(ram)},
            "vram": {**vram, "hit_rate": hit_rate(vram)},
            "disk": {"bytes_read": i("disk_bytes_read"), "reads": i("disk_reads"), "busy_s": v["disk_busy_s"],
                     "active_s": v["disk_active_s"],
                     "read_gbps": gbps("disk_bytes_read", "disk_busy_s"),
                     "max_reads_per_expert_in_prefill": i("prefill_max_expert_reads")},
            "h2d": {"bytes": i("h2d_bytes"), "gbps": gbps("h2d_bytes", "h2d_busy_s")},
            "d2h": {"bytes": i("d2h_bytes")},     # VRAM victims written back to the RAM cache (exclusive tiers)
            "speculation": {"predicted": i("spec_predicted"), "correct": i("spec_correct"),
                            "recall": ratio(v["spec_correct"], v["spec_predicted"])},
            "prefetch": {"issued": i("prefetch_issued"), "used": i("prefetch_used")},
            "ngram": ngram_section(v),            # PLE models' n-gram rows (engine.runtime.ngram)
            # hybrid execution: experts the CPU computed from the RAM cache
            "cpu": {"experts": i("cpu_experts"), "bytes": i("cpu_expert_bytes"), "busy_s": v["cpu_busy_s"],
                    "gbps": gbps("cpu_expert_bytes", "cpu_busy_s")},
            # the decode thread waiting at the layers' host syncs for the GPU (the rest of its time it works)
            "host": {"sync_wait_s": v["sync_wait_s"], "read_wait_s": v["read_wait_s"]},
            # RSS counts the RAM cache's resident pages (its slots written so far, its pinned chunks whole);
            # the rest is what the process needs besides it
            "process": {"rss_bytes": rss, "anon_bytes": anon, "non_cache_bytes": max(rss - cache_held, 0),
                        "non_cache_anon_bytes": max(anon - cache_held, 0)},
            "device": self.info.get("device", "cpu"),
            "placement": self.info.get("placement"),      # hybrid execution: speeds measured at load, or None
            # host-device copies paced to a simulated slower link (Options.copy_rate_gbps), or None
            "copy_pacing": self.info.get("copy_pacing"),
            "decode_thread_core": v["decode_thread_core"],
            "warnings": warnings,
        }


def _declared(key: str) -> str:
    if key not in COUNTERS:
        raise KeyError(f"telemetry counter '{key}' is not declared in engine.runtime.telemetry.COUNTERS")
    return key
