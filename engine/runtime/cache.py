"""RAM cache of expert blocks: a fixed number of block-sized slots, allocated as it fills.

Eviction (residency.ram_victim): a block also held in a VRAM slot (demoted) goes first, as it costs nothing to
lose; then the least used (`uses`: the slot banks' routing counts, SlotPolicy.rank) of the least recently used
half of the cache, so hot experts stay in RAM while the newer half stays whatever its counts say: a block read
ahead for a guess, or written back from a slot, is there before its next use. With no `uses` it is plain LRU.
Locked entries are never evicted.

Memory is taken in chunks only when the cache grows, so a large budget costs nothing until used (and on CUDA,
pinned memory is never taken past the budget). Once it grows, the next chunk is allocated ahead on a thread of
its own: page-locking 16 blocks takes ~10 ms, which the thread filling the cache (a prompt's pass, a decode
step) would otherwise spend instead of keeping the disk busy.
"""
from __future__ import annotations

import mmap
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Callable

import torch

from engine.runtime.residency import ram_victim
from engine.runtime.telemetry import Telemetry

Key = tuple[int, int]      # (layer, expert)
CHUNK_SLOTS = 16


def anonymous_buffer(num_bytes: int) -> torch.Tensor:
    """Page-aligned host memory (O_DIRECT needs aligned buffers); committed only when touched."""
    return torch.frombuffer(mmap.mmap(-1, num_bytes), dtype=torch.uint8)


class RamCache:
    def __init__(self, capacity_bytes: int, block_bytes: int, telemetry: Telemetry,
                 allocate: Callable[[int], torch.Tensor] = anonymous_buffer):
        self.block_bytes = block_bytes
        self.num_slots = capacity_bytes // block_bytes
        self.telemetry = telemetry
        self._allocate = allocate
        # The chunks themselves, not only views of them: a pinned chunk stays page-locked only while its
        # tensor lives (runtime.pinned unregisters it when collected; views keep the memory, not the pinning).
        self._chunks: list[torch.Tensor] = []
        self._views: list[torch.Tensor] = []      # one view a slot of the chunks allocated so far
        self._entries: OrderedDict[Key, int] = OrderedDict()   # LRU first
        self._locks: dict[Key, int] = {}
        self._demoted: set[Key] = set()           # also in a VRAM slot
        self.uses: Callable[[Key], float] | None = None
        self.window = max(1, self.num_slots // 2)     # the victim's candidates: the least recently used half
        self._free: list[int] = []
        self._num_created = 0
        self._pinned_bytes = 0                    # chunks page-locked whole (resident before they are filled)
        self._ahead: Future | None = None         # the next chunk, being allocated on a thread of its own
        self._held_lock = threading.Lock()        # the held bytes, counted by both threads
        self._ahead_pinned = 0                    # ... of which the chunk made ahead
        telemetry.set(ram_capacity_bytes=self.num_slots * block_bytes)

    def __contains__(self, key: Key) -> bool:
        return key in self._entries

    def lookup(self, key: Key) -> int | None:
        """Slot of a cached block (counted as a hit, made most recent) or None (counted as a miss)."""
        slot = self._entries.get(key)
        if slot is None:
            self.telemetry.add(ram_misses=1)
            return None
        self._entries.move_to_end(key)
        self._demoted.discard(key)
        self.telemetry.add(ram_hits=1)
        return slot

    def demote(self, key: Key) -> None:
        """Make a cached block the first to be evicted (it now also sits in a VRAM slot)."""
        if key in self._entries:
            self._entries.move_to_end(key, last=False)
            self._demoted.add(key)

    def touch(self, key: Key) -> None:
        """Make a cached block the most recent, without counting a hit or a miss."""
        if key in self._entries:
            self._entries.move_to_end(key)
            self._demoted.discard(key)

    def can_insert(self) -> bool:
        """Whether `insert` would find a slot (free, not yet created, or an unlocked entry to evict)."""
        return bool(self._free) or self._num_created < self.num_slots or \
            any(not self._locks.get(k) for k in self._entries)

    def has_free(self, grow: bool = True) -> bool:
        """Whether `insert` would evict nothing at all: a free slot, or one not yet created; without `grow`, only
        where no allocation would wait (a slot of the chunks allocated, or the chunk made ahead is ready)."""
        if self._free or self._num_created < len(self._views):
            return True
        if grow:
            return self._num_created < self.num_slots
        return self._ahead is not None and self._ahead.done()

    def has_spare(self) -> bool:
        """Whether `insert` would evict nothing but a demoted block (or none): room for a read ahead."""
        if self._free or self._num_created < self.num_slots:
            return True
        first = next((key for key in self._entries if not self._locks.get(key)), None)
        return first is not None and first in self._demoted

    def insert(self, key: Key) -> int:
        """A slot for a new block (evicting the least recently used unlocked one). Fill it, then use it."""
        if self._free:
            slot = self._free.pop()
        elif self._num_created < self.num_slots:
            slot = self._grow()
        else:
            victim = self._victim()
            if victim is None:
                raise RuntimeError("RAM cache: every slot is locked")  # callers size batches to avoid this
            slot = self._entries.pop(victim)
            self._demoted.discard(victim)
            self.telemetry.add(ram_evictions=1)
        self._entries[key] = slot
        self.telemetry.set(ram_used_bytes=len(self._entries) * self.block_bytes)
        return slot

    def _victim(self) -> Key | None:
        locks = self._locks
        return ram_victim(self._entries, locks.get, self._demoted, self.uses, self.window, len(locks))

    def discard(self, key: Key) -> None:
        """Forget a block whose read failed."""
        self._demoted.discard(key)
        slot = self._entries.pop(key, None)
        if slot is not None:
            self._free.append(slot)
            self.telemetry.set(ram_used_bytes=len(self._entries) * self.block_bytes)

    def lock(self, key: Key) -> None:
        self._locks[key] = self._locks.get(key, 0) + 1

    def unlock(self, key: Key) -> None:
        self._locks[key] -= 1
        if not self._locks[key]:
            del self._locks[key]

    def block(self, slot: int) -> torch.Tensor:
        return self._views[slot]

    def _grow(self) -> int:
        slot = self._num_created
        if slot >= len(self._views):                   # the allocated chunks are full: one more
            count = min(CHUNK_SLOTS, self.num_slots - slot)
            ahead, self._ahead = self._ahead, None
            chunk = ahead.result() if ahead is not None else self._allocate(count * self.block_bytes)
            pinned = chunk.numel() if chunk.is_pinned() else 0
            with self._held_lock:                         # (one chunk is made ahead at a time)
                self._ahead_pinned = 0
                self._pinned_bytes += pinned
            self._chunks.append(chunk)
            self._views += chunk[:count * self.block_bytes].view(count, self.block_bytes).unbind()
            following = min(CHUNK_SLOTS, self.num_slots - len(self._views))
            if following > 0:
                self._ahead = Future()
                threading.Thread(target=self._allocate_ahead, args=(self._ahead, following * self.block_bytes),
                                 name="sluice-ram-chunk", daemon=True).start()
        self._num_created += 1
        self._count_held()
        return slot

    def _allocate_ahead(self, future: Future, num_bytes: int) -> None:
        try:
            chunk = self._allocate(num_bytes)
        except BaseException as exc:      # noqa: BLE001 - raised where the chunk is taken, as it would have been
            future.set_exception(exc)
            return
        with self._held_lock:
            self._ahead_pinned = chunk.numel() if chunk.is_pinned() else 0
        future.set_result(chunk)
        self._count_held()

    def _count_held(self) -> None:
        """What the cache holds of the process's memory: the slots written so far (used or free), or its pinned
        chunks whole (page-locked, so resident, before their slots are filled), the one made ahead included."""
        with self._held_lock:
            held = max(self._num_created * self.block_bytes, self._pinned_bytes + self._ahead_pinned)
            self.telemetry.set(ram_held_bytes=held)
