"""CPU device: decode and prefill speed with the dense weights as stored (float32 compute) against int8
(`dense_quant="int8"`), alternated, through Engine.generate.

    .venv/bin/python scripts/probe_dense_cpu.py [WORK_DIR]

Builds an 8-layer OLMoE (hidden 1024, 16 experts, top-4, vocab 32000, int8 experts) in WORK_DIR (default
/tmp/sluice-probe-dense) once; prints tok/s and the dense weights' size for each run.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import engine
    from engine import GenerationParams
    from engine.format.repack import repack
    from engine.tools.demo import build_hf_model
    work = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/sluice-probe-dense")
    model = work / "sluice-int8"
    if not (model / "sluice.json").exists():
        build_hf_model("olmoe", work / "hf", num_layers=8, with_tokenizer=False, seed=1, num_experts=16,
                       num_experts_per_tok=4, hidden_size=1024, intermediate_size=256, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=64, max_position_embeddings=1024, vocab_size=32000)
        repack(work / "hf", model, quant="int8")
    prompt = list(range(5, 133))
    for dense in (None, "int8", None, "int8"):
        eng = engine.load(model, device="cpu", dtype="float32", max_context=512, dense_quant=dense)

        def run(tokens: int) -> tuple[float, float]:
            start, first = time.perf_counter(), None
            for i, _ in enumerate(eng.generate(prompt, GenerationParams(max_new_tokens=tokens, temperature=0,
                                                                        ignore_eos=True))):
                if i == 0:
                    first = time.perf_counter()
            return (tokens - 1) / (time.perf_counter() - first), len(prompt) / (first - start)
        run(4)
        decode, prefill = run(32)
        print(f"dense {dense or 'as stored'}: decode {decode:.1f} tok/s, prefill {prefill:.0f} tok/s, "
              f"dense weights {eng.plan.dense_bytes / 2**20:.0f} MiB", flush=True)
        eng.close()


if __name__ == "__main__":
    main()
