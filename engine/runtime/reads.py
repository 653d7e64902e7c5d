"""Disk reads of expert blocks into RAM-cache slots: started, waited for, settled or abandoned.

A read's RAM block is inserted and locked when the read starts and unlocked once it has landed, so nothing
evicts or overwrites it meanwhile. Reads started for guesses their layer did not use (`unused`) settle once
landed: the decode thread does not wait for them before its own layer's reads.
"""
from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import Future
from typing import Callable

from engine.runtime.cache import RamCache
from engine.runtime.residency import Key
from engine.runtime.store import ExpertStore
from engine.runtime.telemetry import Telemetry


class DiskReads:
    def __init__(self, store: ExpertStore, cache: RamCache, telemetry: Telemetry, wait_copies: Callable[[], None]):
        self.store, self.cache, self.telemetry = store, cache, telemetry
        self._wait_copies = wait_copies          # the mover's: copies in flight hold RAM blocks locked
        self.pending: dict[Key, tuple[int, Future]] = {}   # reads started ahead, not yet taken: (RAM slot, read)
        self.unused: set[Key] = set()            # of those, guesses their layer did not use (settled once landed)
        self.pass_counts: Counter | None = None  # during a prefill: reads per block (each should be read once)

    def __contains__(self, key: Key) -> bool:
        return key in self.pending

    def __len__(self) -> int:
        return len(self.pending)

    def start(self, key: Key) -> tuple[int, Future]:
        """Insert and lock key's RAM block and start its read -> (RAM slot, the read)."""
        if not self.cache.can_insert():      # every RAM block is locked by a copy in flight: let them land
            self._wait_copies()
        if not self.cache.can_insert():      # or by reads of wrong guesses still in flight
            self.settle_unused(wait=True)
        ram_slot = self.cache.insert(key)
        self.cache.lock(key)
        if self.pass_counts is not None:
            self.pass_counts[key] += 1
        return ram_slot, self.store.submit(*key, self.cache.block(ram_slot).numpy())

    def start_ahead(self, key: Key) -> None:
        """A read nobody waits for yet (a guess, a fill): kept in `pending` until taken or settled."""
        self.pending[key] = self.start(key)

    def finish(self, key: Key, future: Future) -> None:
        """Wait for a read; a failed one leaves no RAM block behind."""
        start = time.perf_counter()
        try:
            future.result()
            self.telemetry.add(read_wait_s=time.perf_counter() - start)
        except BaseException:
            self.cache.unlock(key)
            self.cache.discard(key)
            raise

    def abandon(self, layer: int, reads) -> None:
        """After a failed read: a batch's other reads [(expert, RAM slot, read)] must not land in a reused slot."""
        for expert, _, future in reads:
            if not future.cancel():
                future.exception()
            self.cache.unlock((layer, expert))
            self.cache.discard((layer, expert))

    def settle_unused(self, wait: bool) -> None:
        for key in list(self.unused):
            if key not in self.pending:              # asked for after all: its layer took it
                self.unused.discard(key)
            elif wait or self.pending[key][1].done():
                self.unused.discard(key)
                self.settle(key)

    def settle(self, key: Key) -> None:
        """A read ahead has landed (or failed): its RAM block stays cached, unlocked."""
        _, future = self.pending.pop(key)
        try:
            self.finish(key, future)
            self.cache.unlock(key)
        except Exception:      # noqa: BLE001 - a failed speculative read only loses the prefetch
            pass

    def settle_all(self) -> None:
        for key in list(self.pending):
            self.settle(key)
        self.unused.clear()
