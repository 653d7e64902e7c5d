"""Expert block reader: whole blocks from experts.bin into caller buffers, on reader threads.

O_DIRECT where the file system allows it (page-cache bypass: what the user's NVMe really does),
buffered reads with posix_fadvise(DONTNEED) otherwise. Each block's CRC32 is checked the first
time it is read in a session.
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


class ExpertStore:
    def __init__(self, model: ModelDir, telemetry: Telemetry, num_threads: int = 4, direct: bool = True):
        self.model, self.telemetry = model, telemetry
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
        self._pool = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="sluice-reader")
        self.block_bytes = model.layout.block_bytes

    @property
    def is_direct(self) -> bool:
        return self._direct_fd is not None

    def submit(self, layer: int, expert: int, buf: np.ndarray) -> Future:
        return self._pool.submit(self.read_into, layer, expert, buf)

    def read_into(self, layer: int, expert: int, buf: np.ndarray) -> None:
        """Read block (layer, expert) into buf (uint8, block_bytes long; 4096-aligned for O_DIRECT)."""
        offset = self.model.expert_offset(layer, expert)
        start = self._read_starts()
        view = memoryview(buf)
        try:
            n = self._read(view, offset)
        finally:
            end = self._read_ends()
        if n != self.block_bytes:
            raise SluiceError(f"experts.bin ended early at layer {layer}, expert {expert}; repack the model again.")
        self.telemetry.add(disk_bytes_read=n, disk_reads=1, disk_busy_s=end - start)
        key = (layer, expert)
        if key not in self._verified:
            if zlib.crc32(view) != self.model.expert_crc32(layer, expert):
                raise SluiceError(f"Expert {expert} of layer {layer} is corrupted on disk (checksum mismatch); "
                                  "repack the model again.")
            with self._verified_lock:
                self._verified.add(key)

    def _read_starts(self) -> float:
        with self._active_lock:
            now = time.perf_counter()
            if not self._in_flight:
                self._active_since = now
            self._in_flight += 1
            return now

    def _read_ends(self) -> float:
        with self._active_lock:
            now = time.perf_counter()
            self._in_flight -= 1
            if not self._in_flight:
                self.telemetry.add(disk_active_s=now - self._active_since)
            return now

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
