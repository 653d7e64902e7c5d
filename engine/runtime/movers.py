"""Movers: how expert blocks get from RAM-cache slots into the device's slot banks, one kind per device.

Both carry out the residency policy's decisions the same way (a slot acquired, the victim written back to
RAM, the RAM copy demoted); they differ in how bytes move and when they are safe to use:
  CudaMover  the copies go on one copy stream (the driver's copy where it loads, else torch's), each batch
             after the last compute that read the bank (`bank_free`); the compute stream waits on the copies'
             done events only, and a RAM block stays locked until its copy has finished (no host sync);
  HostMover  the device is the host: a copy is a memcpy, done when it returns; a slot's expert is decoded
             to the compute dtype once and kept while it stays (counted in the slot budget).
Either paces its copies where the bench simulates a slower link (engine.runtime.pacing).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable

import torch

from engine.runtime.cache import RamCache
from engine.runtime.cuda_driver import HostToDevice
from engine.runtime.pacing import CudaPacing, HostPacing
from engine.runtime.placement import Placement
from engine.runtime.residency import Key, writes_back
from engine.runtime.slots import SlotBanks
from engine.runtime.telemetry import Telemetry

STAGING_ROWS, STAGING_LEN = 8, 512     # int32 rows for small uploads (the kernels' slot indices)


class Mover:
    is_async: bool                # copies overlap compute (the CPU's share then runs after the GPU's is enqueued)
    reads_all_guesses: bool       # every guess of the next layer is read ahead (compute-bound: the disk waits anyway)

    def __init__(self, banks: SlotBanks, cache: RamCache, telemetry: Telemetry, device: torch.device):
        self.banks, self.cache, self.telemetry, self.device = banks, cache, telemetry, device
        self._batch_copies = 0                         # copies issued in the current `copy_batch`
        # Index staging: host rows -> device rows (stream-ordered, so reuse after the next layer's host sync is
        # safe: that sync waits for every copy enqueued before it).
        self._stage = [torch.empty(STAGING_LEN, dtype=torch.int32, pin_memory=self.is_async)
                       for _ in range(STAGING_ROWS)]
        self._stage_np = [row.numpy() for row in self._stage]
        self._stage_dev = [torch.empty(STAGING_LEN, dtype=torch.int32, device=device) for _ in range(STAGING_ROWS)]
        self._stage_next = 0

    def copy(self, layer: int, expert: int, ram_slot: int, protected: set[Key], ram_hit: bool = False) -> int:
        """Copy a locked RAM block into a slot of layer's bank (inside `copy_batch`) -> the slot; the RAM lock is
        released when the copy is done. In a sweep (a prefill) the copy is a passing one: a RAM hit keeps its
        place in RAM, and a block the sweep evicts again is not written back."""
        key = (layer, expert)
        bank = self.banks.bank_of(layer)
        slot = self.banks.acquire(key, protected)
        evicted = self.banks.last_evicted
        passing = self.banks.sweeping
        write_back = self._victim_slot(evicted[0]) if writes_back(
            evicted and evicted[0], passing, self.banks.last_evicted_swept) else None
        dst, src = self.banks.block(key, slot), self.cache.block(ram_slot)
        self._batch_copies += 1
        if not (passing and ram_hit):
            self.cache.demote(key)
        self._move(key, bank, slot, dst, src, evicted[0] if write_back is not None else None, write_back)
        return slot

    def _victim_slot(self, victim: Key) -> int | None:
        """RAM slot to write an evicted VRAM block back into (locked), or None: already in RAM (made
        recent instead), or no RAM slot can be freed right now."""
        if victim in self.cache:
            self.cache.touch(victim)
            return None
        if not self.cache.can_insert():
            return None
        ram_slot = self.cache.insert(victim)
        self.cache.lock(victim)
        self.telemetry.add(d2h_bytes=self.cache.block_bytes)
        return ram_slot

    def upload(self, values: list[int], dst: torch.Tensor | None = None) -> torch.Tensor:
        """int32 values on the device through a staging row, into `dst` if given."""
        src, dst = self._staged(values, dst)
        return dst.copy_(src, non_blocking=True)

    def _staged(self, values: list[int], dst: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """values written into the next host staging row -> (that row's slice, where they go)."""
        i = self._stage_next
        self._stage_next = (i + 1) % len(self._stage)
        n = len(values)
        self._stage_np[i][:n] = values
        return self._stage[i][:n], (self._stage_dev[i][:n] if dst is None else dst)

    def _move(self, key: Key, bank: int, slot: int, dst: torch.Tensor, src: torch.Tensor,
              victim: Key | None, write_back: int | None) -> None:
        raise NotImplementedError

    def expert_weights(self, key: Key, bank: int, slot: int, decode: Callable[[], dict]) -> dict:
        """The expert in this slot decoded to the compute dtype (`decode` makes it)."""
        return decode()

    def keeps_decoded(self, key: Key, bank: int, slot: int) -> bool:
        """Whether the slot keeps a decoded copy of key's expert."""
        return False


class HostMover(Mover):
    is_async = False
    reads_all_guesses = True

    def __init__(self, banks: SlotBanks, cache: RamCache, telemetry: Telemetry, device: torch.device,
                 pacing: HostPacing | None = None):
        super().__init__(banks, cache, telemetry, device)
        self.pacing = pacing
        self._decoded: dict[tuple[int, int], tuple[Key, dict]] = {}     # (bank, slot) -> (key, decoded parts)

    @contextmanager
    def copy_batch(self, layer: int, each: bool = False):
        self._batch_copies = 0
        try:
            yield
        finally:
            self.telemetry.add(h2d_bytes=self._batch_copies * self.cache.block_bytes)

    def _move(self, key, bank, slot, dst, src, victim, write_back) -> None:
        if write_back is not None:
            self._copy(self.cache.block(write_back), dst)
            self.cache.unlock(victim)
        start = time.perf_counter()
        self._copy(dst, src)
        self.telemetry.add(h2d_busy_s=time.perf_counter() - start)
        self.cache.unlock(key)

    def _copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        start = time.perf_counter()
        dst.copy_(src)
        if self.pacing is not None:
            self.pacing.hold(src.numel() * src.element_size(), time.perf_counter() - start)

    def expert_weights(self, key: Key, bank: int, slot: int, decode: Callable[[], dict]) -> dict:
        cached = self._decoded.get((bank, slot))
        if cached is not None and cached[0] == key:
            return cached[1]
        decoded = decode()
        self._decoded[(bank, slot)] = (key, decoded)
        return decoded

    def keeps_decoded(self, key: Key, bank: int, slot: int) -> bool:
        cached = self._decoded.get((bank, slot))
        return cached is not None and cached[0] == key

    # copies are done when they return: nothing to wait for, unlock or time later
    def follow_compute_stream(self) -> None:
        pass

    def begin_step(self) -> None:
        pass

    def wait_slots(self, bank: int, slots: list[int]) -> None:
        pass

    def mark_bank_free(self, bank: int) -> None:
        pass

    def unlock_finished(self) -> None:
        pass

    def count_copy_time(self) -> None:
        pass

    def wait_copies(self) -> None:
        pass

    def queued_copies(self) -> int:
        return 0

    def synchronize(self) -> None:
        pass


class CudaMover(Mover):
    is_async = True
    reads_all_guesses = False

    def __init__(self, banks: SlotBanks, cache: RamCache, telemetry: Telemetry, device: torch.device,
                 placement: Placement | None = None, pacing: CudaPacing | None = None):
        super().__init__(banks, cache, telemetry, device)
        self.placement = placement       # with a CPU share: learns the decode thread's time to issue a copy
        self.pacing = pacing             # a simulated slower link: the copy stream held after each batch's copies
        self.copy_stream = torch.cuda.Stream(device)
        # a block's copy through the driver, not torch's copy_ (engine.runtime.cuda_driver), where it loads
        self._upload = HostToDevice.load()            # the slot-index uploads through it too
        self._h2d = self._upload if banks.block_bytes == cache.block_bytes else None
        self._copy_handle = self.copy_stream.cuda_stream
        self._slot_ready: dict[tuple[int, int], torch.cuda.Event] = {}     # (bank, slot) -> copy done
        # the last compute reading each bank: one event a bank, re-recorded (a copy's wait takes the record made
        # before it; a new event a layer costs the decode thread more than the re-record)
        self._bank_free = [torch.cuda.Event(), torch.cuda.Event()]
        self._inflight: list[tuple[torch.cuda.Event, Key]] = []             # (copy done, RAM block it reads/writes)
        self._timed: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []   # copy batches, for h2d busy time
        self._compute_stream = torch.cuda.current_stream(device)
        self._batch_each = True                        # each copy of the batch with its own done event, or one for all
        self._batch_ready: list[tuple[int, int]] = []  # (bank, slot)s and RAM keys the batch's done event covers
        self._batch_keys: list[Key] = []

    @contextmanager
    def copy_batch(self, layer: int, each: bool = False):
        """Copies into layer's bank issued inside, on the copy stream after the last compute that read the bank;
        the batch is timed as a whole (h2d busy time) by one pair of events, whose end also marks every copy
        done unless `each` copy records its own (the torch path computes each expert as soon as it lands)."""
        self._batch_copies = 0
        bank = self.banks.bank_of(layer)
        issued, self._batch_each = time.perf_counter(), each
        self._batch_ready, self._batch_keys = [], []
        torch.cuda.set_stream(self.copy_stream)      # (cheaper than torch.cuda.stream's context)
        start = torch.cuda.Event(enable_timing=True)
        try:
            self.copy_stream.wait_event(self._bank_free[bank])     # (none recorded yet: no wait)
            start.record(self.copy_stream)
            yield
        finally:        # also when a copy failed: the ones issued before it keep their done event and RAM locks
            self._settle()
            end = torch.cuda.Event(enable_timing=True)
            end.record(self.copy_stream)
            torch.cuda.set_stream(self._compute_stream)
            self._timed.append((start, end))
            for bank_slot in self._batch_ready:
                self._slot_ready[bank_slot] = end
            self._inflight += [(end, key) for key in self._batch_keys]
            self.telemetry.add(h2d_bytes=self._batch_copies * self.cache.block_bytes)
        if self.placement is not None:
            self.placement.observe_copies(time.perf_counter() - issued, self._batch_copies)

    def upload(self, values: list[int], dst: torch.Tensor | None = None) -> torch.Tensor:
        if self._upload is None:
            return super().upload(values, dst)
        src, dst = self._staged(values, dst)
        self._upload(dst.data_ptr(), src.data_ptr(), src.nbytes, self._compute_stream.cuda_stream)
        return dst

    def _move(self, key, bank, slot, dst, src, victim, write_back) -> None:
        if write_back is not None:           # same stream: the victim's bytes leave before new ones land
            self.cache.block(write_back).copy_(dst, non_blocking=True)
        if self._h2d is not None:
            self._h2d(dst.data_ptr(), src.data_ptr(), self.cache.block_bytes, self._copy_handle)
        else:
            dst.copy_(src, non_blocking=True)
        if self.pacing is not None:
            self.pacing.owe(self.cache.block_bytes * (2 if write_back is not None else 1))
        done = [victim, key] if write_back is not None else [key]
        if not self._batch_each:
            self._batch_ready.append((bank, slot))
            self._batch_keys += done
            return
        self._settle()
        end = torch.cuda.Event()
        end.record(self.copy_stream)
        self._slot_ready[(bank, slot)] = end
        self._inflight += [(end, k) for k in done]

    def _settle(self) -> None:
        if self.pacing is not None:
            self.pacing.settle()

    def follow_compute_stream(self) -> None:
        """Launches and copy waits go to the stream current now."""
        self._compute_stream = torch.cuda.current_stream(self.device)

    def begin_step(self) -> None:
        """A decode step: the stream looked up once (not once a layer), the copies' busy time counted once."""
        self.follow_compute_stream()
        self.count_copy_time()

    def wait_slots(self, bank: int, slots: list[int]) -> None:
        """The compute stream waits for these slots' copies (each distinct done event once)."""
        events = {self._slot_ready.pop((bank, slot), None) for slot in slots}
        events.discard(None)
        for event in events:
            self._compute_stream.wait_event(event)

    def mark_bank_free(self, bank: int) -> None:
        self._bank_free[bank].record(self._compute_stream)

    def unlock_finished(self) -> None:
        """Unlock the RAM blocks whose copies have finished. All copies run in order on the one copy
        stream, so the first unfinished one ends the scan."""
        done = _finished_prefix([end for end, _ in self._inflight])
        for _, key in self._inflight[:done]:
            self.cache.unlock(key)
        del self._inflight[:done]

    def count_copy_time(self) -> None:
        """Add the finished copy batches' h2d busy time (telemetry)."""
        done = _finished_prefix([end for _, end in self._timed])
        for start, end in self._timed[:done]:
            self.telemetry.add(h2d_busy_s=start.elapsed_time(end) / 1e3)
        del self._timed[:done]

    def wait_copies(self) -> None:
        for end, _ in self._inflight:
            end.synchronize()
        self.unlock_finished()
        self.count_copy_time()

    def queued_copies(self) -> int:
        """Copies still on the copy stream (a copied miss waits behind them)."""
        return len(self._inflight) - _finished_prefix([done for done, _ in self._inflight])

    def synchronize(self) -> None:
        self.copy_stream.synchronize()
        self.unlock_finished()
        self.count_copy_time()


def make_mover(device: torch.device, banks: SlotBanks, cache: RamCache, telemetry: Telemetry,
               placement: Placement | None = None, pacing: CudaPacing | HostPacing | None = None) -> Mover:
    if device.type == "cuda":
        return CudaMover(banks, cache, telemetry, device, placement, pacing)
    return HostMover(banks, cache, telemetry, device, pacing)


def _finished_prefix(events: list) -> int:
    """How many of the events, recorded in this order on one stream, have completed (a copy batch's
    event stands for each of its copies: it is asked once)."""
    done = None
    for i, event in enumerate(events):
        if event is not done:
            if not event.query():
                return i
            done = event
    return len(events)
