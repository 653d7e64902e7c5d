"""Can the decode kernel read a RAM-resident expert where it sits (pinned host memory over PCIe, through
unified addressing: `moe_decode(..., bases=...)`) about as fast as the copy engine brings it into a slot?

If it can, a decode step needs no host sync per layer (BENCHMARKS.md run 60: with every expert resident the
host's path of 16 syncs and launches alone caps OLMoE at ~140 tok/s): the routing stays on the GPU, a slot
table says where each expert is, and the misses are read in place. This measures the kernel's side of that
on the running GPU, each case checked against moe_decode_ref on a device bank holding the same blocks:

    python3 scripts/probe_in_place_reads.py            # OLMoE and Qwen3-30B-A3B expert shapes, int8

Without a GPU it runs tiny shapes through Triton's interpreter (TRITON_INTERPRET=1): the answers only.

Cases, one token and its K experts, each timed over rotating expert sets (400+ MB, past the GPU's L2):
  resident      every expert in a VRAM slot (the floor)
  in place      every expert read from pinned host memory by the kernel itself
  1 in place    one expert read in place, the others resident (a typical miss)
  copy + kernel the copy engine brings every expert into a slot first, then the kernel (today's miss)
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.runtime.pinned import pinned_buffer  # noqa: E402
from kernels.formats import make_offsets, random_bank  # noqa: E402
from kernels.moe_decode import moe_decode, moe_decode_ref  # noqa: E402
from kernels.selfcheck import rel_error  # noqa: E402

SHAPES = {"olmoe-1b-7b": (1024, 2048, 8), "qwen3-30b-a3b": (768, 2048, 8)}   # intermediate, hidden, K
HOST_BLOCKS, REPEATS = 64, 50
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":                                   # the interpreter: tiny shapes, no timing
    SHAPES, HOST_BLOCKS = {"tiny": (16, 32, 2)}, 4


def _timed(run, sets: int) -> float:
    """Microseconds one call takes, averaged over REPEATS rounds of the `sets` rotating inputs."""
    if DEVICE == "cpu":
        return float("nan")
    for i in range(sets):
        run(i)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPEATS):
        for i in range(sets):
            run(i)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (REPEATS * sets)


def probe(name: str, fmt: str = "int8") -> list[tuple]:
    intermediate, hidden, top_k = SHAPES[name]
    g = torch.Generator().manual_seed(0)
    offsets, block = make_offsets(fmt, intermediate, hidden)
    blocks = random_bank(HOST_BLOCKS, block, fmt, offsets, intermediate, hidden, device="cpu", generator=g)
    pinned = pinned_buffer(HOST_BLOCKS * block)         # as the RAM cache pins its chunks (kept: views do not pin)
    host = pinned.view(HOST_BLOCKS, block)
    host.copy_(blocks)
    bank = blocks.to(DEVICE, copy=True)                  # slot i holds what host block i holds
    x = torch.randn(1, hidden, generator=g).to(DEVICE, torch.bfloat16)
    weights = torch.rand(1, top_k, generator=g).to(DEVICE)
    sets = HOST_BLOCKS // top_k
    ids = [torch.arange(i * top_k, (i + 1) * top_k, dtype=torch.int32).view(1, top_k) for i in range(sets)]
    slots = [i.to(DEVICE) for i in ids]
    # with bases the slots only say which pairs run: these point elsewhere, so a kernel that read its slots
    # instead of the bases would give another answer than the reference's
    elsewhere = [((i + 1) % HOST_BLOCKS).to(DEVICE) for i in ids]
    in_place = [(host.data_ptr() - bank.data_ptr() + i.long() * block).to(DEVICE) for i in ids]
    one_in_place = []
    for i in ids:                                        # the first choice read in place, the rest from slots
        b = i.long() * block
        b[0, 0] += host.data_ptr() - bank.data_ptr()
        one_in_place.append(b.to(DEVICE))
    out = torch.empty(1, hidden, device=DEVICE)
    h_buf = torch.empty(top_k, intermediate, device=DEVICE)
    copy_slots = torch.arange(top_k, dtype=torch.int32).view(1, top_k).to(DEVICE)  # the copies land in slots 0..K-1
    scratch = bank.clone()

    def copy_then_kernel(i):
        for k, b in enumerate(ids[i][0].tolist()):
            scratch[k].copy_(host[b], non_blocking=True)
        moe_decode(x, scratch, copy_slots, weights, fmt, offsets, intermediate, out=out, h_buf=h_buf)

    cases = {
        "resident": lambda i: moe_decode(x, bank, slots[i], weights, fmt, offsets, intermediate, out=out, h_buf=h_buf),
        "in place": lambda i: moe_decode(x, bank, elsewhere[i], weights, fmt, offsets, intermediate, out=out,
                                         h_buf=h_buf, bases=in_place[i]),
        "1 in place": lambda i: moe_decode(x, bank, elsewhere[i], weights, fmt, offsets, intermediate, out=out,
                                           h_buf=h_buf, bases=one_in_place[i]),
        "copy + kernel": copy_then_kernel,
    }
    rows = []
    for case, run in cases.items():
        errors = []
        for i in (0, sets - 1):                         # the answer each way: the same blocks read from slots
            run(i)
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            ref = moe_decode_ref(x, bank, slots[i], weights, fmt, offsets, intermediate)
            errors.append(rel_error(out, ref))
        us = _timed(run, sets)
        rows.append((name, case, us, top_k * block / us / 1e3, max(errors)))
    return rows


def main() -> int:
    rows = [row for name in SHAPES for row in probe(name)]
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else "the CPU (Triton's interpreter: answers only)"
    print(f"in-place expert reads on {where}: one token, int8 experts")
    print("| experts of | case | us a layer | GB/s of expert bytes | rel. error vs reference |")
    print("|---|---|---|---|---|")
    for name, case, us, gbs, err in rows:
        print(f"| {name} | {case} | {us:.1f} | {gbs:.1f} | {err:.1e} |")
    bad = [row for row in rows if not row[4] < 1e-4]
    if bad:
        print(f"WRONG: {len(bad)} case(s) differ from the reference")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
