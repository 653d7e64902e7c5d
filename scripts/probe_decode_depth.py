"""How a decode token's time grows with the context, on a GPU: the one-token attention kernel alone, split over
the keys (kernels/decode_attention.py) against one program a head walking every key, and a whole decode through
Engine.generate after prompts of several lengths (OLMoE-dims int8 model, int8 dense weights, RAM free).

    python3 scripts/probe_decode_depth.py [VRAM_BUDGET ...]     (default: 40GB, every expert resident)

Prints a table a part; the kernel's outputs are compared with the torch reference at every size it times.
"""
from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WORK = Path("/tmp/sb")
ONE_PROGRAM = 1 << 30             # a split longer than any buffer: one program a head walks every key


def kernel_table() -> None:
    from kernels import decode_attention as da
    heads, dim, dtype = 16, 128, torch.bfloat16          # OLMoE's attention
    print("| keys held | position | one program a head (us) | split 64 | split 128 | split 256 | max error vs torch |")
    print("|---|---|---|---|---|---|---|")
    for held in (640, 4096, 32768):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(*shape, generator=g).to("cuda", dtype) for shape in
                   ((1, heads, dim), (held, heads, dim), (held, heads, dim)))
        for position in (8, 300, 600, 2000, 4000, 16000, 32000):
            if position >= held:
                continue
            where = torch.tensor([position], device="cuda")
            ref = da.attention_ref(q, k, v, where, None).float()
            cells, worst = [], 0.0
            for split in (ONE_PROGRAM, 64, 128, 256):
                out = da.decode_attention(q, k, v, where, None, split=split)
                worst = max(worst, (out.float() - ref).abs().max().item())
                graph = torch.cuda.CUDAGraph()                # as the decode runs it: inside a graph
                with torch.cuda.graph(graph):
                    for _ in range(20):
                        da.decode_attention(q, k, v, where, None, split=split)
                graph.replay()
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(10):
                    graph.replay()
                end.record()
                end.synchronize()
                cells.append(f"{start.elapsed_time(end) * 1e3 / 200:.1f}")
            print(f"| {held} | {position} | " + " | ".join(cells) + f" | {worst:.2e} |")


def decode_table(budgets: list[str]) -> None:
    import engine
    from engine import GenerationParams
    from engine.tools.bench import _timed_generate
    from engine.tools.presets import write_sluice_dir
    from kernels import decode_attention as da
    path = write_sluice_dir("olmoe-1b-7b", WORK / "olmoe-1b-7b-int8", "int8")
    depths = (8, 512, 2048)
    print("\n| VRAM budget | attention | " + " | ".join(f"decode after {d} tokens (ms/token)" for d in depths) + " |")
    print("|---|---|" + "---|" * len(depths))
    default = da.SPLIT
    for budget in budgets:
        for name, split in (("one program a head", ONE_PROGRAM), (f"split {default}", default)):
            da.SPLIT = split
            eng = engine.load(path, device="cuda", vram_budget=budget, ram_cache="16GB", max_context=2200,
                              dense_quant="int8")
            rng = random.Random(0)
            prompt = lambda n: [rng.randrange(eng.spec.vocab_size) for _ in range(n)]     # noqa: E731
            params = GenerationParams(max_new_tokens=64, temperature=1.0, seed=0, ignore_eos=True)
            _timed_generate(eng, prompt(512), params)                     # warm: RAM cache, banks, graphs
            cells = []
            for depth in depths:
                t = _timed_generate(eng, prompt(depth), params)
                cells.append(f"{t.decode_s / (t.new_tokens - 1) * 1e3:.2f}")
            eng.close()
            print(f"| {budget} | {name} | " + " | ".join(cells) + " |", flush=True)
    da.SPLIT = default


if __name__ == "__main__":
    start = time.perf_counter()
    kernel_table()
    decode_table(sys.argv[1:] or ["40GB"])
    print(f"\n({time.perf_counter() - start:.0f} s)")
