"""How fast the disk reads expert blocks with few reads in flight (issue #10, the exceeds regime).

The bench's disk probe keeps 4 whole-block reads in flight all the time; a decode layer has a few misses,
and at the end of each layer's batch only one or two reads are left in flight. This measures random
whole-block O_DIRECT reads of an experts.bin at 1, 2, 4 and 8 in flight, and one block at a time read as
2, 4 or 8 parallel pieces, each as GB/s and milliseconds a block.
Usage: python3 scripts/probe_disk_reads.py MODEL_DIR [reads=96]
"""
from __future__ import annotations

import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from engine.runtime.store import PAGE, piece_ranges  # noqa: E402


def aligned(num_bytes: int) -> memoryview:
    raw = np.empty(num_bytes + PAGE, dtype=np.uint8)
    start = (-raw.ctypes.data) % PAGE
    return memoryview(raw[start:start + num_bytes])


def run(path: str, block: int, reads: int, in_flight: int, pieces: int) -> tuple[float, float]:
    """(GB/s, ms a block): `reads` random blocks, `in_flight` blocks at a time, each in `pieces` parallel reads."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    num_blocks = os.path.getsize(path) // block
    rng = random.Random(in_flight * 100 + pieces)
    offsets = [rng.randrange(num_blocks) * block for _ in range(reads)]
    buffers = [aligned(block) for _ in range(in_flight)]
    with ThreadPoolExecutor(in_flight * pieces) as pool:
        def read_block(i):
            buf, base = buffers[i % in_flight], offsets[i]
            parts = piece_ranges(block, pieces)
            if len(parts) == 1:
                return os.preadv(fd, [buf], base)
            return sum(f.result() for f in [pool.submit(os.preadv, fd, [buf[s:s + n]], base + s) for s, n in parts])
        with ThreadPoolExecutor(in_flight) as blocks:
            start = time.perf_counter()
            total = sum(blocks.map(read_block, range(reads)))
            seconds = time.perf_counter() - start
    os.close(fd)
    return total / seconds / 1e9, seconds / reads * in_flight * 1e3


def main() -> None:
    from engine.format.modeldir import EXPERTS_FILE, open_model_dir
    model = open_model_dir(sys.argv[1])
    path, block = str(model.path / EXPERTS_FILE), model.layout.block_bytes
    reads = int(sys.argv[2]) if len(sys.argv) > 2 else 96
    print(f"{path}: {os.path.getsize(path) / 1e9:.2f} GB, blocks of {block / 1e6:.2f} MB, {reads} random reads a row")
    print(f"{'blocks in flight':>16} {'pieces a block':>15} {'GB/s':>7} {'ms a block':>11}")
    for in_flight, pieces in ((1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (1, 4), (1, 8), (2, 4), (4, 4)):
        gbps, ms = run(path, block, reads, in_flight, pieces)
        print(f"{in_flight:>16} {pieces:>15} {gbps:>7.2f} {ms:>11.2f}")


if __name__ == "__main__":
    main()
