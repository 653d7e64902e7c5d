"""What each host call of a streaming decode step costs the decode thread (in fits-ram the decode thread's host
path is what limits decode). Times, in microseconds a call, the torch and CUDA calls a
layer makes (events, stream switches, a block's copy issue, the slot rows' upload, a host sync with
nothing pending, a graph replay) and their raw driver-API equivalents through ctypes, so a change to the
host path is chosen by numbers. Needs CUDA; prints a table.

    python -m bench host-calls
"""
from __future__ import annotations

import ctypes
import itertools
import time

import torch

from engine.runtime.pinned import pinned_buffer

N = 4000


def per_call(fn, n: int = N, sync_every: int = 0) -> float:
    """Microseconds a call of fn, host time only (the GPU is drained every sync_every calls, untimed)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    total = 0.0
    done = 0
    while done < n:
        batch = min(n - done, sync_every or n)
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        total += time.perf_counter() - start
        torch.cuda.synchronize()
        done += batch
    return total / n * 1e6


def add_arguments(p) -> None:
    """No options: the shapes are OLMoE-1B-7B's."""


def run(args) -> int:
    rows = []

    def row(name, us):
        rows.append((name, us))
        print(f"{name:<58} {us:8.2f} us", flush=True)
    compute, copy, cuda = torch.cuda.current_stream(), torch.cuda.Stream(), _driver()
    event_rows(row, compute, copy, cuda)
    copy_rows(row, compute, copy, cuda)
    launch_rows(row, compute)
    print("\nhost call                                                        us/call")
    for name, us in rows:
        print(f"{name:<64} {us:7.2f}")
    return 0


def _driver():
    """The CUDA driver API through ctypes, for the raw equivalents of torch's calls."""
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    cuda.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    cuda.cuStreamWaitEvent.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
    cuda.cuEventQuery.argtypes = [ctypes.c_void_p]
    return cuda


def event_rows(row, compute, copy, cuda) -> None:
    """Events and stream switches: what a layer's ordering costs."""
    row("torch.cuda.Event() + record (a new one each call)", per_call(lambda: torch.cuda.Event().record(compute)))
    row("torch.cuda.Event(enable_timing) + record", per_call(lambda: torch.cuda.Event(enable_timing=True).record(compute)))
    reused = torch.cuda.Event()
    reused.record(compute)
    row("event.record (re-recorded)", per_call(lambda: reused.record(compute)))
    handle, stream_handle = ctypes.c_void_p(reused.cuda_event), ctypes.c_void_p(compute.cuda_stream)
    row("cuEventRecord (ctypes)", per_call(lambda: cuda.cuEventRecord(handle, stream_handle)))
    torch.cuda.synchronize()
    row("event.query() (done)", per_call(reused.query))
    row("cuEventQuery (ctypes)", per_call(lambda: cuda.cuEventQuery(handle)))
    row("stream.wait_event", per_call(lambda: copy.wait_event(reused)))
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record(compute)
    t1.record(compute)
    torch.cuda.synchronize()
    row("event.elapsed_time", per_call(lambda: t0.elapsed_time(t1)))
    row("torch.cuda.set_stream x2 (there and back)",
        per_call(lambda: (torch.cuda.set_stream(copy), torch.cuda.set_stream(compute))))
    row("torch.cuda.current_stream()", per_call(lambda: torch.cuda.current_stream(torch.device("cuda"))))


def copy_rows(row, compute, copy, cuda) -> None:
    """A block's copy issue and the slot rows' upload, through torch and through the driver."""
    block = 6_602_752 // 2                # about an OLMoE int8 expert's half: the copy issue does not depend on size
    ram_views = list(pinned_buffer(64 * block).view(64, block).unbind())
    bank = torch.empty(64, block, dtype=torch.uint8, device="cuda")
    bank_views, turn = list(bank.unbind()), itertools.cycle(range(64))
    copy_handle = ctypes.c_void_p(copy.cuda_stream)

    def copy_block():
        i = next(turn)
        bank_views[i].copy_(ram_views[i], non_blocking=True)

    def copy_block_raw():
        i = next(turn)
        cuda.cuMemcpyHtoDAsync_v2(bank_views[i].data_ptr(), ram_views[i].data_ptr(), block, copy_handle)
    row("block copy_ issue (registered pinned -> device)", per_call(copy_block, n=1000, sync_every=50))
    row("block cuMemcpyHtoDAsync issue (ctypes)", per_call(copy_block_raw, n=1000, sync_every=50))
    row("slot view bank[slot] (indexing)", per_call(lambda: bank[3]))
    stage = torch.empty(512, dtype=torch.int32, pin_memory=True)
    stage_np, stage_dev = stage.numpy(), torch.empty(512, dtype=torch.int32, device="cuda")

    def upload():
        stage_np[:16] = range(16)
        stage_dev[:16].copy_(stage[:16], non_blocking=True)
    row("16-int upload: numpy row + copy_ (torch-pinned)", per_call(upload))
    src, dst, stream_handle = stage.data_ptr(), stage_dev.data_ptr(), ctypes.c_void_p(compute.cuda_stream)

    def upload_raw():
        stage_np[:16] = range(16)
        cuda.cuMemcpyHtoDAsync_v2(dst, src, 64, stream_handle)
    row("16-int upload: numpy row + cuMemcpyHtoDAsync (ctypes)", per_call(upload_raw))


def launch_rows(row, compute) -> None:
    """A host sync with nothing pending, a graph replay and an eager launch."""
    ids = torch.arange(24, device="cuda", dtype=torch.int32)
    row("ids.tolist() (nothing pending: a host sync's floor)", per_call(ids.tolist))
    x = torch.zeros(1, 2048, device="cuda")
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(compute)
    with torch.cuda.stream(side):
        x.add_(1)
    compute.wait_stream(side)
    with torch.cuda.graph(graph):
        x.add_(1)
    row("graph.replay() (one kernel)", per_call(graph.replay, sync_every=500))
    row("x.add_(1) eager launch", per_call(lambda: x.add_(1), sync_every=500))
