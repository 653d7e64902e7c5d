"""How fast this host computes routed experts from the RAM cache: what the CPU's share of a decode step can pay
for against a copy over PCIe (engine/runtime/placement.py decides from the same kind of timing at load).

OLMoE-1B-7B shapes, int8 blocks in the engine's layout, in a pinned arena far larger than the L3 (every expert
comes from DRAM, as in decode), one token, a layer's batch of experts at a time, at several thread counts:
  read                    the bound: each block summed as int64 (a plain DRAM read of the same bytes)
  fused, a call an expert kernels/cpu_moe.py's fused int8 kernel, one call per expert
  fused, one call         the same kernel, the layer's batch in one call (what the engine runs)

    python -m bench cpu-experts [--batch 6]
"""
from __future__ import annotations

import argparse
import os
import time

NUM_BLOCKS = 192                      # 1.2 GB of OLMoE int8 blocks: far past any L3
HIDDEN, INTER = 2048, 1024


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=6, help="experts a call (a decode layer's CPU share; default 6)")


def run(args) -> int:
    import torch

    from kernels import cpu_moe
    from kernels.activation import SILU
    offsets, blocks = arena()
    cores = len(os.sched_getaffinity(0))
    kernel = cpu_moe.FusedExperts(offsets, INTER, HIDDEN, SILU)
    x, y = torch.randn(1, HIDDEN), torch.zeros(1, HIDDEN)
    token, w = torch.zeros(1, dtype=torch.long), torch.ones(1)
    calls = {
        "read": lambda ids: [blocks[i].view(torch.int64).sum() for i in ids],
        "fused, a call an expert": lambda ids: [kernel.into(y, x, [blocks[i]], [token], [w]) for i in ids],
        "fused, one call": lambda ids: kernel.into(y, x, [blocks[i] for i in ids], [token] * len(ids), [w] * len(ids)),
    }
    print(f"numba {cpu_moe.numba.__version__}; OLMoE int8 blocks of {blocks.shape[1] / 2**20:.1f} MiB from DRAM, "
          f"batch {args.batch}, {cores} cores\n| path | threads | us/expert | GB/s of blocks |")
    for threads in sorted({cores, cores - 1, max(1, cores * 3 // 4), max(1, cores // 2)}, reverse=True):
        torch.set_num_threads(threads)
        cpu_moe.set_threads(threads)
        for name, call in calls.items():
            s = per_expert(call, args.batch)
            print(f"| {name} | {threads} | {s * 1e6:.0f} | {blocks.shape[1] / s / 1e9:.1f} |", flush=True)
    return 0


def arena():
    """(field offsets, [NUM_BLOCKS, block bytes] uint8 of random valid int8 blocks, pinned where CUDA is)."""
    import torch

    from engine.format.layout import block_layout
    from kernels.formats import random_bank
    layout = block_layout(INTER, HIDDEN, "int8")
    offsets = {f.name: f.offset for f in layout.fields}
    four = random_bank(4, layout.block_bytes, "int8", offsets, INTER, HIDDEN)
    blocks = torch.empty(NUM_BLOCKS, layout.block_bytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
    for i in range(NUM_BLOCKS):
        blocks[i].copy_(four[i % 4])
    return offsets, blocks


def per_expert(run_batch, batch: int, rounds: int = 3) -> float:
    """Seconds an expert over `rounds` passes through all blocks, `batch` experts a call."""
    ids = list(range(NUM_BLOCKS))
    run_batch(ids[:batch])
    start = time.perf_counter()
    for _ in range(rounds):
        for i in range(0, NUM_BLOCKS - batch + 1, batch):
            run_batch(ids[i:i + batch])
    return (time.perf_counter() - start) / (rounds * (NUM_BLOCKS // batch) * batch)
