"""CPU device decode speed against torch's intra-op threads, with and without another program busy on one
core: what engine.plan.hardware.compute_threads is based on.

    .venv/bin/python scripts/probe_threads.py [WORK_DIR] [HIDDEN INTERMEDIATE]

Builds a tiny 16-layer OLMoE (64 experts, top-8, int8; hidden 64 and expert intermediate 32 unless given) in
WORK_DIR (default /tmp/sluice-probe-threads) once,
then decodes 48 tokens through Engine.generate at each thread count from 1 to the cores this process may use,
alternated, idle and beside a busy loop. Prints tok/s per run.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _spin() -> None:
    while True:
        pass


def _model(work: Path, hidden: int, intermediate: int) -> Path:
    from engine.format.repack import repack
    from engine.tools.demo import build_hf_model
    model = work / f"sluice-int8-{hidden}-{intermediate}"
    if not (model / "sluice.json").exists():
        build_hf_model("olmoe", work / f"hf-{hidden}-{intermediate}", num_layers=16, with_tokenizer=False, seed=1,
                       num_experts=64, num_experts_per_tok=8, hidden_size=hidden, intermediate_size=intermediate,
                       num_attention_heads=max(4, hidden // 64), num_key_value_heads=max(2, hidden // 128),
                       head_dim=min(64, hidden // 4), max_position_embeddings=1024)
        repack(work / f"hf-{hidden}-{intermediate}", model, quant="int8")
    return model


def main() -> None:
    import torch

    import engine
    from engine import GenerationParams
    work = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/sluice-probe-threads")
    hidden, intermediate = (int(a) for a in sys.argv[2:4]) if len(sys.argv) > 3 else (64, 32)
    eng = engine.load(_model(work, hidden, intermediate), device="cpu", dtype="float32", max_context=1024)
    prompt = list(range(5, 69))

    def decode_tok_s(tokens: int = 48) -> float:
        first = None
        for i, _ in enumerate(eng.generate(prompt, GenerationParams(max_new_tokens=tokens, temperature=0,
                                                                    ignore_eos=True))):
            if i == 0:
                first = time.perf_counter()
        return (tokens - 1) / (time.perf_counter() - first)

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    decode_tok_s(8)
    for busy in (False, True):
        spinner = multiprocessing.Process(target=_spin, daemon=True) if busy else None
        if spinner:
            spinner.start()
        try:
            for rnd in (1, 2):
                for threads in range(1, cores + 1):
                    torch.set_num_threads(threads)
                    print(f"{'one core busy' if busy else 'idle':>13}  round {rnd}  threads {threads}: "
                          f"{decode_tok_s():.1f} tok/s", flush=True)
        finally:
            if spinner:
                spinner.terminate()
    eng.close()


if __name__ == "__main__":
    main()
