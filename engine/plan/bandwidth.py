"""Bandwidths measured in the benchmark's own run: the roofline is computed from these, not from
datasheets. Each returns bytes per second."""
from __future__ import annotations

import os
import random
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from engine.runtime.pinned import pinned_buffer
from engine.runtime.store import READ_PIECES, piece_ranges, reader_threads


def disk_read_bps(path, block_bytes: int, num_reads: int = 128, pieces: int = READ_PIECES, seed: int = 0) -> float:
    """Random O_DIRECT block reads of `path` into pinned buffers as the expert store reads its misses: each
    block in `pieces` page-aligned pieces (1: whole), on as many threads as the store has."""
    size = os.path.getsize(path)
    num_blocks = size // block_bytes
    offsets = [random.Random(seed).randrange(num_blocks) * block_bytes for _ in range(num_reads)]
    flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0)
    fd = os.open(path, flags)
    threads = reader_threads(pieces)
    in_flight = max(1, threads // pieces)
    buffers = [memoryview(pinned_buffer(block_bytes).numpy()) for _ in range(in_flight)]
    reads = [(buffers[i % in_flight][start:start + n], offsets[i] + start)
             for i in range(num_reads) for start, n in piece_ranges(block_bytes, pieces)]
    try:
        with ThreadPoolExecutor(threads) as pool:
            start = time.perf_counter()
            total = sum(pool.map(lambda read: os.preadv(fd, [read[0]], read[1]), reads))
            return total / (time.perf_counter() - start)
    finally:
        os.close(fd)


def h2d_bps(device="cuda", num_bytes: int = 256 << 20, repeats: int = 5) -> float:
    """Pinned host -> device copy, best of `repeats` (on the CPU device: a RAM copy)."""
    src = pinned_buffer(num_bytes)
    src.fill_(1)
    dst = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    return _best(lambda: dst.copy_(src, non_blocking=True), num_bytes, repeats, device)


def hbm_copy_bps(device="cuda", num_bytes: int = 2 << 30, repeats: int = 10) -> float:
    """Device-to-device copy, counting bytes read plus bytes written."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    return _best(lambda: dst.copy_(src), 2 * num_bytes, repeats, device)


def _best(fn, num_bytes: int, repeats: int, device) -> float:
    is_cuda = torch.device(device).type == "cuda"
    fn()
    best = float("inf")
    for _ in range(repeats):
        if not is_cuda:
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
            continue
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return num_bytes / best
