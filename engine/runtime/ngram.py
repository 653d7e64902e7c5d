"""The n-gram tier: PLE rows read from ngram.bin as a step needs them, through a RAM cache of hot rows.

A prompt's lookups start when its first layer mixes (Qwen4Block.mix), a decode step's before its first layer
(Qwen4Model.before_step): the row ids of every PLE layer are hashed on the host and each layer's rows are
fetched on a worker thread, in layer order, while the layers before it run; a decode step's rows land in a
pinned host buffer per layer, copied into the layer's static input just before the layer runs. A fetch takes
the step's distinct rows (a prompt reads each once), copies the cached ones, and reads the
pages holding the others: pages sorted, adjacent ones coalesced into one read (at most MAX_RUN_PAGES), the
reads in flight together on reader threads, O_DIRECT where the file system allows (what the disk really
gives; buffered elsewhere). Rows read enter the cache (least recently used out). Where the RAM budget holds the
whole model, experts and tables (`holds_tables`), the tables are held in RAM instead: read once in the background,
front to back, and a row below the part read so far is a plain gather, one past it read from disk (a disk read
costs ~0.1 ms, and random text's n-grams are new rows a cache of hot ones does not have). Nothing of the tables
is held on the device: a step's rows go there as its PLE layers' input.
"""
from __future__ import annotations

import mmap
import os
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from engine.errors import SluiceError
from engine.format.ngram import NGRAM_FILE, PAGE, NgramIndex
from engine.runtime.telemetry import Telemetry

MAX_RUN_PAGES = 64          # one read at most 256 KiB
READER_THREADS = 16         # a decode step's rows (a page each) all in flight together
CACHE_SHARE = 16            # the rows' cache: this fraction (1 / n) of the RAM budget, at most the tables
HOLD_READ_PAGES = 4096      # the held tables are read 16 MiB at a time


class RowCache:
    """Least-recently-used rows, (table, row) -> a slot of one preallocated pool [capacity, row bytes]."""

    def __init__(self, capacity: int, row_bytes: int):
        self.pool = torch.empty((capacity, row_bytes), dtype=torch.uint8)
        self.slots: OrderedDict[tuple[int, int], int] = OrderedDict()
        self.free = list(range(capacity))

    def get(self, key: tuple[int, int]) -> torch.Tensor | None:
        slot = self.slots.get(key)
        if slot is None:
            return None
        self.slots.move_to_end(key)
        return self.pool[slot]

    def put(self, key: tuple[int, int], row: np.ndarray) -> None:
        if not self.free and not self.slots:
            return                                   # no cache at all
        slot = self.free.pop() if self.free else self.slots.popitem(last=False)[1]
        self.pool[slot] = torch.from_numpy(row)
        self.slots[key] = slot


class PageReader:
    """Whole pages of a file into page-aligned buffers: O_DIRECT where it works, else buffered reads."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_RDONLY)
        self.direct_fd = None
        if hasattr(os, "O_DIRECT"):
            try:
                self.direct_fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            except OSError:
                pass

    def read(self, first_page: int, count: int) -> mmap.mmap:
        buf = mmap.mmap(-1, count * PAGE)                 # page aligned, as O_DIRECT needs
        self.read_into(buf, first_page)
        return buf

    def read_into(self, buf, first_page: int) -> None:
        """Whole pages from `first_page` into a page-aligned buffer (the file's end leaves the rest as it was)."""
        if self.direct_fd is not None:
            try:
                os.preadv(self.direct_fd, [buf], first_page * PAGE)
                return
            except OSError:
                self.direct_fd = None                     # a file system that refuses it: buffered from now on
        os.preadv(self.fd, [buf], first_page * PAGE)

    def close(self) -> None:
        for fd in (self.fd, self.direct_fd):
            if fd is not None:
                os.close(fd)


class HeldTables:
    """The whole tables in RAM, read front to back by a background thread: `upto` bytes are in so far."""

    def __init__(self, reader: PageReader, total_bytes: int, telemetry: Telemetry):
        self.reader, self.total_bytes, self.telemetry = reader, total_bytes, telemetry
        self.buffer = mmap.mmap(-1, held_bytes(total_bytes))               # page aligned, as O_DIRECT needs
        self.data = np.frombuffer(self.buffer, dtype=np.uint8)
        self.upto = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read_all, name="sluice-ngram-hold", daemon=True)
        self._thread.start()

    def _read_all(self) -> None:
        pages = len(self.data) // PAGE
        for first in range(0, pages, HOLD_READ_PAGES):
            if self._stop.is_set():
                return
            count = min(HOLD_READ_PAGES, pages - first)
            try:
                self.reader.read_into(memoryview(self.buffer)[first * PAGE:(first + count) * PAGE], first)
            except OSError:
                return                      # the rows past `upto` are read as they are needed (and fail there)
            self.upto = min((first + count) * PAGE, self.total_bytes)
            self.telemetry.set(ngram_held_read_bytes=(first + count) * PAGE)     # of len(data), whole pages

    def rows(self, offsets: np.ndarray, row_bytes: int) -> np.ndarray:
        """[N, row bytes] of rows that start at `offsets`, all below `upto`."""
        return self.data[offsets[:, None] + np.arange(row_bytes)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def page_runs(pages: np.ndarray) -> list[tuple[int, int]]:
    """Sorted distinct pages -> (first page, count) reads: adjacent pages together, at most MAX_RUN_PAGES."""
    runs: list[list[int]] = []
    for page in pages.tolist():
        if runs and page == runs[-1][0] + runs[-1][1] and runs[-1][1] < MAX_RUN_PAGES:
            runs[-1][1] += 1
        else:
            runs.append([page, 1])
    return [(first, count) for first, count in runs]


class Lookups:
    """One step's rows, a future per PLE layer."""

    def __init__(self, futures: list[Future], telemetry: Telemetry):
        self.futures, self.telemetry = futures, telemetry

    def rows(self, ple_index: int) -> torch.Tensor:
        t0 = time.perf_counter()
        rows = self.futures[ple_index].result()
        self.telemetry.add(ngram_wait_s=time.perf_counter() - t0)
        return rows


class NgramTier:
    def __init__(self, path: Path, index: NgramIndex, hasher, telemetry: Telemetry, cache_bytes: int,
                 dtype: torch.dtype, device: torch.device, hold: bool = False):
        """hold: the whole tables in RAM (read in the background; `cache_bytes` is then unused)."""
        self.index, self.hasher, self.telemetry = index, hasher, telemetry
        self.dtype, self.device = dtype, device
        self.reader = PageReader(path / NGRAM_FILE)
        self.held = HeldTables(self.reader, index.total_bytes, telemetry) if hold else None
        self.cache = RowCache(0 if hold else cache_bytes // index.row_bytes, index.row_bytes)
        self.cache_bytes = len(self.held.data) if hold else self.cache.pool.numel()
        telemetry.set(ngram_cache_bytes=self.cache_bytes, ngram_held=int(hold))
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="sluice-ngram")       # layer order
        self._readers = ThreadPoolExecutor(READER_THREADS, thread_name_prefix="sluice-ngram-read")
        weakref.finalize(self, _close, self._worker, self._readers, self.reader, self.held)

    def begin(self, tokens: list[int], start: int, staging: list[torch.Tensor] | None = None) -> Lookups:
        """The rows of tokens at positions start.. for every PLE layer, fetched in the background: on the device,
        or written into `staging` (a host buffer [T, E] per PLE layer)."""
        ids = self.hasher.step(tokens, start)
        self.telemetry.add(ngram_tokens=len(tokens))
        if len(tokens) == 1 and self.held is not None and self.held.upto == self.index.total_bytes:
            return Lookups([_done(self._fetch(table, layer_ids, staging and staging[table]))   # a gather: no
                            for table, layer_ids in enumerate(ids)], self.telemetry)           # thread's handoff
        return Lookups([self._worker.submit(self._fetch, table, layer_ids, staging and staging[table])
                        for table, layer_ids in enumerate(ids)], self.telemetry)

    def _offsets(self, table: int, row_ids: np.ndarray) -> np.ndarray:
        """Byte offsets of `table`'s rows in the file."""
        return self.index.tables[table].offset + row_ids.astype(np.int64) * self.index.row_stride

    def _fetch(self, table: int, ids: np.ndarray, out: torch.Tensor | None) -> torch.Tensor:
        """ids [T, heads] -> their rows concatenated [T, heads * row_dim] in the compute dtype, in `out` or on
        the device."""
        values = self._held_step_rows(table, ids) if ids.shape[0] == 1 and self.held is not None else None
        if values is None:
            values = self._gathered(table, ids)
        return values.to(device=self.device, dtype=self.dtype) if out is None else out.copy_(values)

    def _held_step_rows(self, table: int, ids: np.ndarray) -> torch.Tensor | None:
        """A decode step's rows [1, heads * row_dim] gathered from the held tables, in order and without
        `np.unique`; None while one of them is past the part read so far."""
        offsets = self._offsets(table, ids[0])
        if offsets.max() + self.index.row_bytes > self.held.upto:
            return None
        distinct = len(set(ids[0].tolist()))
        self.telemetry.add(ngram_rows=distinct, ngram_hits=distinct, ngram_misses=0)
        return torch.from_numpy(self.held.rows(offsets, self.index.row_bytes)).view(self.index.dtype).reshape(1, -1)

    def _gathered(self, table: int, ids: np.ndarray) -> torch.Tensor:
        """ids [T, heads] -> their rows [T, heads * row_dim] as stored, each distinct row fetched once: from the
        held tables or the row cache, the others read from disk."""
        distinct, inverse = np.unique(ids, return_inverse=True)
        inverse = torch.from_numpy(inverse.reshape(ids.shape))
        rows = torch.empty((distinct.shape[0], self.index.row_bytes), dtype=torch.uint8)
        if self.held is not None:            # the rows the background read has passed; the others from disk
            offsets = self._offsets(table, distinct)
            below = offsets + self.index.row_bytes <= self.held.upto
            rows.numpy()[below] = self.held.rows(offsets[below], self.index.row_bytes)
            missing = np.flatnonzero(~below).tolist()
        else:
            missing = []
            for j, row in enumerate(distinct.tolist()):
                cached = self.cache.get((table, row))
                if cached is None:
                    missing.append(j)
                else:
                    rows[j] = cached
        if missing:
            rows[missing] = torch.from_numpy(self._read(table, distinct[missing]))
        self.telemetry.add(ngram_rows=distinct.shape[0], ngram_hits=distinct.shape[0] - len(missing),
                           ngram_misses=len(missing))
        return rows.view(self.index.dtype)[inverse].flatten(-2)                   # [T, heads * row_dim]

    def _read(self, table: int, row_ids: np.ndarray) -> np.ndarray:
        """Rows [N, row bytes] of `table` read from disk (each page once), put in the cache."""
        t0 = time.perf_counter()
        offsets = self._offsets(table, row_ids)
        pages = np.unique(offsets // PAGE)
        runs = page_runs(pages)
        staged = np.concatenate([np.frombuffer(b, dtype=np.uint8)
                                 for b in self._readers.map(lambda r: self.reader.read(*r), runs)])
        at = np.searchsorted(pages, offsets // PAGE) * PAGE + offsets % PAGE         # page k staged at k * PAGE
        rows = staged[at[:, None] + np.arange(self.index.row_bytes)]
        for row, data in zip(row_ids.tolist(), rows):
            self.cache.put((table, row), data)
        self.telemetry.add(ngram_reads=len(runs), ngram_bytes_read=pages.shape[0] * PAGE,
                           ngram_bytes_used=rows.size, ngram_read_s=time.perf_counter() - t0)
        return rows

    def close(self) -> None:
        _close(self._worker, self._readers, self.reader, self.held)


def _done(result) -> Future:
    future = Future()
    future.set_result(result)
    return future


def _close(worker: ThreadPoolExecutor, readers: ThreadPoolExecutor, reader: PageReader,
           held: HeldTables | None) -> None:
    if held is not None:
        held.close()
    worker.shutdown(wait=True)
    readers.shutdown(wait=True)
    if reader.fd is not None:
        reader.close()
        reader.fd = reader.direct_fd = None


def held_bytes(table_bytes: int) -> int:
    """What the tables take held in RAM: whole pages."""
    return -(-table_bytes // PAGE) * PAGE


def holds_tables(ram_budget: int, expert_bytes: int, table_bytes: int) -> bool:
    """Whether the RAM budget holds the whole model (every expert block and the tables): the tables are then held
    in RAM, not cached by row."""
    return ram_budget >= expert_bytes + held_bytes(table_bytes)


def attach_ngram(model, model_dir: Path, index: NgramIndex | None, ram_budget: int, expert_bytes: int,
                 telemetry: Telemetry) -> int:
    """A PLE model's rows from the model dir's ngram.bin (model.ngram), `index` its ngram.json as read
    (engine.format.ngram.read_index); returns the RAM the rows take, their cache's or the held tables' (0 for
    other models)."""
    if not hasattr(model, "ngram") or not model.d.ple_layers:
        return 0
    if index is None:
        raise SluiceError(f"'{model_dir}' has no {NGRAM_FILE} for this model's n-gram tables; repack it again.")
    cache_bytes = min(ram_budget // CACHE_SHARE, index.total_bytes)
    model.ngram = NgramTier(Path(model_dir), index, model.hasher, telemetry, cache_bytes, model.compute_dtype,
                            model.device, hold=holds_tables(ram_budget, expert_bytes, index.total_bytes))
    return model.ngram.cache_bytes
