"""Which torch operators' first run costs the process host memory, on the real model (issue #10's memory diet).

CUDA loads a kernel's module lazily, at its first launch, and the module's host-side state stays for the
life of the process. `probe_first_use.py` measures operator kinds on stand-in shapes; this loads a real
Sluice model dir under a dispatch mode that notes the anonymous memory before and after each operator's
first call (by name and the dtypes and devices of its tensors), through `engine.load` (self-check, graph
capture), a 64-token prompt with 16 tokens, a 500-token prompt and a reply sampled with the app's
defaults (top-k, top-p, temperature: what sampling adds). It prints the operators that cost the
most, per operator name, and what grew outside any first call (Triton's kernels, the engine's own memory).
Kernel self-check verdicts and Triton's compiled kernels are cached per machine: run it twice, and read the
second run for what a user's every start pays (the first also pays the self-checks' torch references).
Usage: python3 scripts/probe_op_memory.py MODEL_DIR [device=cuda] [rows=30] [dense=int8|none]
"""
from __future__ import annotations

import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.runtime.memory import process_memory  # noqa: E402


def _anon() -> int:
    return process_memory()[1]


def _signature(func, args, kwargs) -> tuple:
    import torch
    from torch.utils._pytree import tree_leaves
    tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
    return (func.name(), tuple(sorted({f"{t.device.type}:{str(t.dtype).removeprefix('torch.')}" for t in tensors})))


def make_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    class FirstUse(TorchDispatchMode):
        """Runs every operator as it is; at an operator's first call, notes the anonymous memory it added."""

        def __init__(self):
            super().__init__()
            self.seen: set = set()
            self.rows: list[tuple[str, tuple, int, str]] = []
            self.phase = "load"

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            key = _signature(func, args, kwargs)
            if key in self.seen:
                return func(*args, **kwargs)
            self.seen.add(key)
            before = _anon()
            out = func(*args, **kwargs)
            self.rows.append((key[0], key[1], _anon() - before, self.phase))
            return out
    return FirstUse()


def main() -> None:
    path = sys.argv[1]
    device = sys.argv[2] if len(sys.argv) > 2 else "cuda"
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    dense = sys.argv[4] if len(sys.argv) > 4 else "int8"
    import torch  # noqa: F401
    import engine
    from engine.params import GenerationParams
    start = _anon()
    mode = make_mode()
    with mode:
        from engine.format.modeldir import open_model_dir
        limit = open_model_dir(path).spec.max_position_embeddings
        eng = engine.load(path, device=device, vram_budget="4GB", ram_cache="256MB", max_context=min(1024, limit),
                          dense_quant=None if dense == "none" else dense)
        cache = eng.telemetry()["ram_cache"]["used_bytes"]
        after_load = _anon() - cache
        # greedy prompts, then a reply sampled with the app's defaults (app/store.py: temperature 0.7, top-p
        # 0.95, top-k 40): what sampling itself adds
        greedy, app = GenerationParams(temperature=0.0), GenerationParams(temperature=0.7, top_p=0.95, top_k=40, seed=0)
        for phase, prompt, new, params in (("64-token prompt", list(range(1, 65)), 16, greedy),
                                           ("500-token prompt", [1 + i % 300 for i in range(500)], 4, greedy),
                                           ("sampled reply", list(range(7, 39)), 16, app)):
            mode.phase = phase
            params.max_new_tokens = new
            for _ in eng.generate(prompt, params):
                pass
    cache = eng.telemetry()["ram_cache"]["used_bytes"]
    end = _anon() - cache
    eng.close()
    firsts = sum(delta for *_, delta, _ in mode.rows)
    by_name: dict[str, int] = defaultdict(int)
    for name, _, delta, _ in mode.rows:
        by_name[name] += delta
    mib = 2 ** 20
    print(f"anonymous besides the RAM cache: {start / mib:.0f} MiB after import, {after_load / mib:.0f} after "
          f"engine.load, {end / mib:.0f} after the prompts; {len(mode.rows)} distinct first calls added "
          f"{firsts / mib:.0f} MiB, the rest {(end - start - firsts) / mib:.0f} MiB")
    by_phase: dict[str, int] = defaultdict(int)
    for *_, delta, phase in mode.rows:
        by_phase[phase] += delta
    print("first calls by phase, MiB: " + ", ".join(f"{phase} {delta / mib:.0f}" for phase, delta in by_phase.items()))
    print("| first call of | tensors | + anon MiB | during |")
    print("|---|---|---|---|")
    for name, kinds, delta, phase in sorted(mode.rows, key=lambda r: -r[2])[:top]:
        print(f"| {name} | {' '.join(kinds)} | {delta / mib:.1f} | {phase} |")
    print("| per operator name | + anon MiB |")
    print("|---|---|")
    for name, delta in sorted(by_name.items(), key=lambda kv: -kv[1])[:top]:
        print(f"| {name} | {delta / mib:.1f} |")


if __name__ == "__main__":
    main()
