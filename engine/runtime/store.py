"""Expert block reader: whole blocks from experts.bin into caller buffers, on reader threads.

O_DIRECT where the file system allows it (page-cache bypass: what the user's NVMe really does),
buffered reads with posix_fadvise(DONTNEED) otherwise. Each block's CRC32 is checked the first
time it is read in a session.

`pieces`=N reads each block as N page-aligned pieces in parallel (on 2N threads) instead of whole (on 4): a
decode layer has a few misses, and at the end of its batch one or two reads are left in flight, where a
whole-block read may get less than the disk gives. Whole blocks by default: pieces gained nothing measured.
"""
from __future__ import annotations

import os
import threading
import time
import zlib
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from engine.errors import SluiceError
from engine.format.modeldir import EXPERTS_FILE, ModelDir
from engine.runtime.telemetry import Telemetry


READ_PIECES = 1        # whole blocks (see the docstring)
PAGE = 4096


def reader_threads(pieces: int) -> int:
    """Four whole blocks in flight, or two blocks' pieces."""
    return 4 if pieces == 1 else 2 * pieces


def piece_ranges(block_bytes: int, pieces: int) -> list[tuple[int, int]]:
    """(start, length) of each piece of a block: page-aligned (O_DIRECT), the last one shorter."""
    size = -(-block_bytes // pieces // PAGE) * PAGE
    return [(start, min(size, block_bytes - start)) for start in range(0, block_bytes, size)]


class ExpertStore:
    def __init__(self, model: ModelDir, telemetry: Telemetry, num_threads: int | None = None, direct: bool = True,
                 pieces: int | None = None):
        """num_threads: reader threads (default: reader_threads(pieces))."""
        self.model, self.telemetry = model, telemetry
        self.pieces = max(1, pieces or READ_PIECES)
        num_threads = num_threads or reader_threads(self.pieces)
        path = model.path / EXPERTS_FILE
        self._fd = os.open(path, os.O_RDONLY)
        self._direct_fd = None
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self._direct_fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            except OSError:
                self._direct_fd = None
        self._verified: set[tuple[int, int]] = set()
        self._verified_lock = threading.Lock()
        # The disk's active time: the union of the reads' intervals (their summed time counts overlaps
        # once per reader thread), so active time / wall time says how busy the reads kept the disk.
        self._active_lock = threading.Lock()
        self._in_flight, self._active_since = 0, 0.0
        self.num_threads = num_threads
        self._pool = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="sluice-reader")
        self.block_bytes = model.layout.block_bytes

    @property
    def is_direct(self) -> bool:
        return self._direct_fd is not None

    def submit(self, layer: int, expert: int, buf: np.ndarray) -> Future:
        """Start reading block (layer, expert) into buf (uint8, block_bytes long; 4096-aligned for O_DIRECT).
        The future is done when every piece has landed (cancel() never stops a read midway)."""
        if self.pieces == 1:
            return self._pool.submit(self.read_into, layer, expert, buf)
        block: Future = Future()
        block.set_running_or_notify_cancel()
        offset, view = self.model.expert_offset(layer, expert), memoryview(buf)
        ranges = piece_ranges(self.block_bytes, self.pieces)
        lock = threading.Lock()
        state = {"left": len(ranges), "bytes": 0, "error": None, "start": float("inf"), "end": 0.0}

        def landed(piece: Future) -> None:
            try:
                (n, start, end), error = piece.result(), None
            except BaseException as exc:      # noqa: BLE001 - cancelled at close, or an OSError: the block's
                (n, start, end), error = (0, float("inf"), 0.0), exc
            with lock:
                state["bytes"] += n
                state["error"] = state["error"] or error
                state["start"], state["end"] = min(state["start"], start), max(state["end"], end)
                state["left"] -= 1
                if state["left"]:
                    return
            try:
                if state["error"] is not None:
                    raise state["error"]
                self._landed(layer, expert, view, state["bytes"], state["end"] - state["start"])
            except BaseException as exc:      # noqa: BLE001 - the caller's result() raises it
                block.set_exception(exc)
            else:
                block.set_result(None)
        for start, length in ranges:
            self._pool.submit(self._read_piece, view[start:start + length], offset + start).add_done_callback(landed)
        return block

    def _read_piece(self, view: memoryview, offset: int) -> tuple[int, float, float]:
        start = time.perf_counter()
        return self._read_in_flight(view, offset), start, time.perf_counter()

    def read_into(self, layer: int, expert: int, buf: np.ndarray) -> None:
        """Read block (layer, expert) into buf whole, on the calling thread."""
        view = memoryview(buf)
        start = time.perf_counter()
        n = self._read_in_flight(view, self.model.expert_offset(layer, expert))
        self._landed(layer, expert, view, n, time.perf_counter() - start)

    def _read_in_flight(self, view: memoryview, offset: int) -> int:
        """`_read`, counted in the disk's active time (the union of the reads' intervals)."""
        with self._active_lock:
            if not self._in_flight:
                self._active_since = time.perf_counter()
            self._in_flight += 1
        try:
            return self._read(view, offset)
        finally:
            with self._active_lock:
                self._in_flight -= 1
                if not self._in_flight:
                    self.telemetry.add(disk_active_s=time.perf_counter() - self._active_since)

    def _landed(self, layer: int, expert: int, view: memoryview, n: int, seconds: float) -> None:
        """A block's bytes are in: its size, telemetry and (the first time) its CRC32."""
        if n != self.block_bytes:
            raise SluiceError(f"experts.bin ended early at layer {layer}, expert {expert}; repack the model again.")
        self.telemetry.add(disk_bytes_read=n, disk_reads=1, disk_busy_s=seconds)
        key = (layer, expert)
        if key not in self._verified:
            if zlib.crc32(view) != self.model.expert_crc32(layer, expert):
                raise SluiceError(f"Expert {expert} of layer {layer} is corrupted on disk (checksum mismatch); "
                                  "repack the model again.")
            with self._verified_lock:
                self._verified.add(key)

    def _read(self, view: memoryview, offset: int) -> int:
        if self._direct_fd is not None and _is_aligned(view):
            try:
                return os.preadv(self._direct_fd, [view], offset)
            except OSError:
                pass   # e.g. EINVAL on a file system without O_DIRECT: fall back to buffered
        n = os.preadv(self._fd, [view], offset)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._fd, offset, n, os.POSIX_FADV_DONTNEED)
        return n

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for fd in (self._fd, self._direct_fd):
            if fd is not None:
                os.close(fd)
        self._direct_fd = None


def _is_aligned(view: memoryview) -> bool:
    address = np.frombuffer(view, dtype=np.uint8).ctypes.data
    return address % 4096 == 0 and len(view) % 4096 == 0
