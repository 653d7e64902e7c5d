"""What a prompt's prefill does to the caches: VRAM hits, copies into VRAM, RAM hits and disk reads of
each prefill and of the decode after it, with a prefill's misses rotating through a pool of slots (the
default) and with recency eviction as in decode (SLUICE_SWEEP=0), on the CPU device.

    .venv/bin/python scripts/probe_prefill_residency.py [WORK_DIR] [SLOTS_PER_BANK RAM_BLOCKS]

Builds a tiny 16-layer OLMoE (64 experts, top-8, int8; hidden 64) in WORK_DIR (default
/tmp/sluice-probe-sweep) once. The default budgets have the bench's fits-vram-ram ratios: 190 slots a bank
(of 512 experts a bank) and 440 RAM blocks (of 1024). Four conversations (prompt/new tokens 512/64,
512/64, 64/64, 512/64) with sampled tokens (seed 0: the same tokens under both policies), per policy.
"""
from __future__ import annotations

import dataclasses
import os
import random
import sys
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

KEYS = ("vram.hits", "vram.misses", "d2h.bytes", "ram_cache.hits", "disk.reads")
CONVERSATIONS = ((512, 64), (512, 64), (64, 64), (512, 64))


def _counters(eng) -> dict[str, float]:
    snap = eng.telemetry()
    return {key: snap[key.split(".")[0]][key.split(".")[1]] for key in KEYS}


def _load(model: Path, slots: int, ram_blocks: int):
    import engine
    from engine.runtime import runner
    real = runner.plan_budgets

    def plan(**budgets):
        return dataclasses.replace(real(**budgets), slots_per_bank=slots)

    probe = engine.load(model, device="cpu", dtype="float32", max_context=1024)
    block_bytes = probe.plan.block_bytes
    probe.close()
    with mock.patch.object(runner, "plan_budgets", plan):
        return engine.load(model, device="cpu", dtype="float32", max_context=1024, ram_cache=ram_blocks * block_bytes)


def run(model: Path, slots: int, ram_blocks: int) -> list[str]:
    from engine import GenerationParams
    eng = _load(model, slots, ram_blocks)
    block_bytes = eng.plan.block_bytes
    rng = random.Random(0)
    lines = []
    try:
        for prompt_tokens, new_tokens in CONVERSATIONS:
            prompt = [rng.randrange(eng.spec.vocab_size) for _ in range(prompt_tokens)]
            marks = [(_counters(eng), time.perf_counter())]
            params = GenerationParams(max_new_tokens=new_tokens, temperature=1.0, seed=0, ignore_eos=True)
            for i, _ in enumerate(eng.generate(prompt, params)):
                if i == 0:
                    marks.append((_counters(eng), time.perf_counter()))
            marks.append((_counters(eng), time.perf_counter()))
            for phase, (a, ta), (b, tb) in (("prefill", marks[0], marks[1]), ("decode", marks[1], marks[2])):
                d = {k: round((b[k] - a[k]) / (block_bytes if k.endswith("bytes") else 1)) for k in KEYS}
                lines.append(f"{phase:7s} {prompt_tokens:3d}/{new_tokens}: VRAM hits {d['vram.hits']:5d}, copies "
                             f"{d['vram.misses']:5d}, written back {d['d2h.bytes']:5d}, RAM hits "
                             f"{d['ram_cache.hits']:5d}, disk reads {d['disk.reads']:5d} ({tb - ta:.2f} s)")
    finally:
        eng.close()
    return lines


def main() -> None:
    import probe_threads
    work = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/sluice-probe-sweep")
    slots, ram_blocks = (int(a) for a in sys.argv[2:4]) if len(sys.argv) > 3 else (190, 440)
    model = probe_threads._model(work, 64, 32)
    for sweep in ("1", "0"):
        os.environ["SLUICE_SWEEP"] = sweep
        print(f"--- prefill misses {'through a rotating pool (default)' if sweep == '1' else 'by recency'}")
        print("\n".join(run(model, slots, ram_blocks)), flush=True)


if __name__ == "__main__":
    main()
