"""Which expert goes where, when: device hits compute first, misses come from RAM or disk in batches.

For one MoE layer the model hands over the experts its tokens were routed to and a `compute`
callback; the scheduler makes each expert resident in a device slot exactly once and calls
`compute(expert, block)` with the slot's bytes. Reads for a whole batch are in flight on the
reader threads while the first experts of the batch copy and compute.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Callable

import torch

from engine.runtime.cache import RamCache
from engine.runtime.slots import SlotBanks
from engine.runtime.store import ExpertStore
from engine.runtime.telemetry import Telemetry

DEFAULT_BATCH = 32


class ExpertScheduler:
    def __init__(self, store: ExpertStore, cache: RamCache, slots: SlotBanks, telemetry: Telemetry,
                 batch_size: int = DEFAULT_BATCH):
        self.store, self.cache, self.slots, self.telemetry = store, cache, slots, telemetry
        self.batch_size = max(1, min(batch_size, slots.slots_per_bank, cache.num_slots))
        self._pass_reads: Counter = Counter()     # disk reads per (layer, expert) in the current prefill

    def begin_pass(self) -> None:
        self._pass_reads.clear()

    def end_pass(self) -> None:
        if self._pass_reads:
            self.telemetry.set_max(prefill_max_expert_reads=max(self._pass_reads.values()))

    def run_layer(self, layer: int, expert_ids: list[int], compute: Callable[[int, torch.Tensor], None]) -> None:
        resident, missing = [], []
        for expert in expert_ids:
            slot = self.slots.find((layer, expert))
            (resident if slot is not None else missing).append((expert, slot))
        self.telemetry.add(vram_hits=len(resident), vram_misses=len(missing))
        for expert, slot in resident:
            self._compute(layer, expert, slot, compute)
        for start in range(0, len(missing), self.batch_size):
            self._run_batch(layer, [e for e, _ in missing[start:start + self.batch_size]], compute)

    def _run_batch(self, layer: int, experts: list[int], compute) -> None:
        keys = [(layer, e) for e in experts]
        protected = set(keys)              # a batch never evicts its own blocks from the device slots
        pending = {}
        for key in keys:
            slot = self.cache.lookup(key)
            if slot is None:
                slot = self.cache.insert(key)
                future = self.store.submit(*key, self.cache.block(slot).numpy())
                self._pass_reads[key] += 1
            else:
                future = None
            self.cache.lock(key)
            pending[key] = (slot, future)
        try:
            for key in keys:
                ram_slot, future = pending.pop(key)
                try:
                    if future is not None:
                        future.result()
                except BaseException:
                    self.cache.discard(key)
                    raise
                finally:
                    self.cache.unlock(key)
                dev_slot = self.slots.acquire(key, protected=protected)
                start = time.perf_counter()
                self.slots.block(key, dev_slot).copy_(self.cache.block(ram_slot))
                self.telemetry.add(h2d_bytes=self.cache.block_bytes, h2d_busy_s=time.perf_counter() - start)
                self._compute(layer, key[1], dev_slot, compute)
        finally:
            for key, (_, future) in pending.items():     # after an error: release the rest of the batch
                if future is not None:
                    if not future.cancel():
                        future.exception()       # a read still running must not land in a reused slot
                    self.cache.discard(key)
                self.cache.unlock(key)

    def _compute(self, layer: int, expert: int, slot: int, compute) -> None:
        key = (layer, expert)
        self.slots.set_state(key, slot, "computing")
        compute(expert, self.slots.block(key, slot))
        self.slots.set_state(key, slot, "ready")
