"""How fast can this host compute routed experts from the RAM cache? (issue #10's CPU side)

OLMoE-1B-7B shapes, int8 blocks in the engine's own layout, in a pinned arena larger than the L3 (so
every expert comes from DRAM, as in decode), one token, a layer's batch of experts at a time. Rows:
  read        - the bound: each block summed as int64 (a plain DRAM read of the same bytes)
  engine      - engine.runtime.cpu_experts.CpuExperts.compute, the decode thread alone
  pool P      - the same experts split over P worker threads of 16/P torch threads each
                (the decode thread only waits; torch ops release the GIL while they compute)
Usage: python3 scripts/probe_cpu_experts.py [batch=6]
"""
from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.format.layout import block_layout  # noqa: E402
from engine.model.model import swiglu_expert  # noqa: E402
from engine.runtime.cpu_experts import CpuExperts  # noqa: E402
from engine.runtime.placement import Placement  # noqa: E402
from engine.runtime.telemetry import Telemetry  # noqa: E402
from kernels.formats import random_bank  # noqa: E402

HIDDEN, INTER, TOP_K = 2048, 1024, 8
NUM_BLOCKS = 192          # 1.2 GB: far past any L3


def arena():
    layout = block_layout(INTER, HIDDEN, "int8")
    offsets = {f.name: f.offset for f in layout.fields}
    one = random_bank(4, layout.block_bytes, "int8", offsets, INTER, HIDDEN)
    blocks = torch.empty(NUM_BLOCKS, layout.block_bytes, dtype=torch.uint8,
                         pin_memory=torch.cuda.is_available())
    for i in range(NUM_BLOCKS):
        blocks[i].copy_(one[i % 4])
    return layout, blocks


def per_expert(run_batch, blocks, batch: int, rounds: int = 3) -> float:
    """Seconds per expert over `rounds` passes through all blocks, `batch` experts a call."""
    ids = list(range(NUM_BLOCKS))
    run_batch(ids[:batch])
    start = time.perf_counter()
    for _ in range(rounds):
        for i in range(0, NUM_BLOCKS - batch + 1, batch):
            run_batch(ids[i:i + batch])
    return (time.perf_counter() - start) / (rounds * (NUM_BLOCKS // batch) * batch)


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def fused_rows(layout, blocks, batch: int, cores: int) -> list:
    """The fused kernel's rows: per call, batched, with a gap of other work, from a worker thread."""
    import threading

    from kernels import cpu_moe
    from kernels.activation import SILU
    kernel = cpu_moe.FusedExperts({f.name: f.offset for f in layout.fields}, INTER, HIDDEN, SILU)
    x, y = torch.randn(1, HIDDEN), torch.zeros(1, HIDDEN)
    token, w = torch.zeros(1, dtype=torch.long), torch.ones(1)

    def each(ids):
        for i in ids:
            kernel.into(y, x, [blocks[i]], [token], [w])

    def one_call(ids):
        kernel.into(y, x, [blocks[i] for i in ids], [token] * len(ids), [w] * len(ids))

    def gapped(run):
        def call(ids):
            _busy(300e-6)
            run(ids)
        return call

    rows = []
    print(f"numba {cpu_moe.numba.__version__}, threading layer ", end="")
    one_call([0])
    print(cpu_moe.numba.threading_layer(), flush=True)
    for threads in sorted({cores, cores - 1, max(1, cores * 3 // 4), max(1, cores // 2)}, reverse=True):
        cpu_moe.set_threads(threads)
        rows.append(("fused, a call an expert", threads, per_expert(each, blocks, batch)))
        rows.append(("fused, the batch in one call", threads, per_expert(one_call, blocks, batch)))
        gap = per_expert(gapped(one_call), blocks, batch) - 300e-6 / batch
        rows.append(("fused, one call, after 300 us of other work", threads, gap))
        gap = per_expert(gapped(each), blocks, batch) - 300e-6 / batch
        rows.append(("fused, a call an expert, after 300 us", threads, gap))
    cpu_moe.set_threads(cores - 1)
    stop = threading.Event()
    times = []

    def worker():
        cpu_moe.set_threads(cores - 1)
        times.append(per_expert(one_call, blocks, batch))
        stop.set()

    thread = threading.Thread(target=worker)
    thread.start()
    spins = 0
    while not stop.is_set():               # the main thread keeps the GIL busy meanwhile
        spins += sum(range(50))
    thread.join()
    rows.append(("fused, one call from a worker, main thread in Python", cores - 1, times[0]))
    return rows


def main() -> None:
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    cores = len(os.sched_getaffinity(0))
    layout, blocks = arena()
    if "fused" in sys.argv[2:]:
        torch.set_num_threads(cores - 1)
        rows = [("read", cores - 1, per_expert(lambda ids: [blocks[i].view(torch.int64).sum() for i in ids], blocks,
                                                batch))] + fused_rows(layout, blocks, batch, cores)
        _print(rows, batch, cores, layout)
        return
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.randn(1, HIDDEN).bfloat16()
    weights = torch.rand(1, TOP_K)
    rows = []

    for threads in sorted({cores, cores - 1, max(1, cores * 3 // 4), max(1, cores // 2)}, reverse=True):
        torch.set_num_threads(threads)
        s = per_expert(lambda ids: [blocks[i].view(torch.int64).sum() for i in ids], blocks, batch)
        rows.append(("read", threads, s))
        cpu = CpuExperts(layout, swiglu_expert, torch.bfloat16, device, TOP_K, Telemetry(),
                         Placement(cpu_s=1e-4, copy_s=1e-4))

        def engine_batch(ids):
            routed = ids + [NUM_BLOCKS + j for j in range(TOP_K - len(ids))]
            cpu.stage(x.to(device), weights.to(device))
            if device.type == "cuda":
                torch.cuda.synchronize()
            cpu.compute({i: blocks[i] for i in ids}, routed, TOP_K, x, weights)
        rows.append(("engine", threads, per_expert(engine_batch, blocks, batch)))

    views = CpuExperts(layout, swiglu_expert, torch.bfloat16, torch.device("cpu"), TOP_K, Telemetry(),
                       Placement(cpu_s=1e-4, copy_s=1e-4))
    for pool_size in (2, 3, 4, 5, 8):
        per_thread = max(1, cores // pool_size)
        with ThreadPoolExecutor(pool_size, initializer=lambda n=per_thread: torch.set_num_threads(n)) as pool:
            def pooled(ids):
                with torch.inference_mode():
                    outs = list(pool.map(lambda i: swiglu_expert(x, views.weights(blocks[i])), ids))
                    return torch.stack(outs).sum(0)
            rows.append((f"pool {pool_size}x{per_thread}", pool_size * per_thread, per_expert(pooled, blocks, batch)))

    rows += fused_rows(layout, blocks, batch, cores)
    _print(rows, batch, cores, layout)


def _print(rows, batch, cores, layout) -> None:
    print(f"\ncpu experts, OLMoE shapes, int8 blocks from DRAM, batch {batch}, {cores} cores")
    print("| path | threads | us/expert | GB/s of blocks |")
    for name, threads, s in rows:
        print(f"| {name} | {threads} | {s * 1e6:.0f} | {layout.block_bytes / s / 1e9:.1f} |")


if __name__ == "__main__":
    main()
