"""The decode's host bookkeeping a layer, measured without a GPU: a tiny OLMoE-shaped model (8 layers, 64 experts,
top-8, bf16) on the CPU device with every expert resident and the prefetch deferred as on a GPU, so that
`Experts.run_deferred` (use counts, telemetry, speculation's score, the next layer's prefetch) and `Experts._find`
time their own Python, not copies or kernels. A change to experts.py, residency.py or telemetry.py is chosen by
these numbers, alternated with the tree before it (`--tree`), before a GPU measures the whole step.

    python -m bench profile --mode bookkeeping [--tree /tmp/old-tree]
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.common import ROOT, tree_env

TOKENS = 200            # decoded a generation, three generations timed
ROUNDS = 3


def run(args) -> int:
    model = args.work_dir / "bookkeeping-olmoe"
    if not (model / "bf16").is_dir():
        from engine.format.repack import repack
        from engine.tools.demo import build_hf_model
        build_hf_model("olmoe", model / "hf", num_layers=8, with_tokenizer=False, seed=3, num_experts=64,
                       num_experts_per_tok=8)
        repack(model / "hf", model / "bf16", quant="bf16")
    trees = [("this tree", ROOT)] + ([("tree " + str(args.tree), args.tree.resolve())] if args.tree else [])
    for round_ in range(1, ROUNDS + 1):
        for label, tree in trees:
            out = subprocess.run([sys.executable, "-c", _MEASURE, str(model / "bf16")], cwd=tree, env=tree_env(tree),
                                 capture_output=True, text=True)
            print(f"round {round_} [{label}]: {out.stdout.strip() or out.stderr.strip()[-800:]}", flush=True)
    return 0


_MEASURE = f"""
import random, sys, time
import engine
from engine.tools.bench import timed_generate
from bench.common import sampled
eng = engine.load(sys.argv[1], device="cpu", vram_budget="8GB", ram_cache="8GB", max_context=512)
eng.runner.defer_prefetch = True                  # a GPU's decode: the bookkeeping waits for run_deferred
rng = random.Random(0)
prompt = lambda n: [rng.randrange(eng.spec.vocab_size) for _ in range(n)]
timed_generate(eng, prompt(64), sampled(64))      # every expert brought in
experts, spent = eng.runner.experts, {{}}
def timed(name):
    fn = getattr(experts, name)
    def wrapper(*a, **k):
        start = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            entry = spent.setdefault(name, [0.0, 0]); entry[0] += time.perf_counter() - start; entry[1] += 1
    setattr(experts, name, wrapper)
timed("run_deferred"); timed("_find")
for _ in range(3):
    timed_generate(eng, prompt(16), sampled({TOKENS}))
print(", ".join(f"{{name}} {{t / n * 1e6:.1f}} us a call" for name, (t, n) in spent.items()))
"""
