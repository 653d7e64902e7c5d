"""bf16 against float32 compute on the GPU (same model, same path): the logits of four decode steps, beside
transformers' own bf16-against-float32 difference on the same model and tokens as the yardstick.

    python -m bench logits [--families qwen3_moe,mixtral,olmoe,qwen2_moe]
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.common import save_json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--families", default="qwen3_moe,mixtral,olmoe,qwen2_moe", help="comma-separated model types")


def run(args) -> int:
    from engine.format.repack import repack
    from engine.tools.demo import build_hf_model
    rows = []
    for family in args.families.split(","):
        tmp = Path(tempfile.mkdtemp())
        build_hf_model(family, tmp / "hf", num_layers=3, with_tokenizer=False, seed=5)
        repack(tmp / "hf", tmp / "sl", quant="bf16")
        prompt = list(range(3, 40, 3))
        rel, tokens = sluice_error(tmp / "sl", prompt)
        hf = transformers_error(tmp / "hf", prompt + tokens)
        rows.append({"family": family, "rel_err_bf16_vs_fp32": rel, "transformers_bf16_vs_fp32": hf})
        print(f"logits {family:10s} bf16 vs fp32 rel err: sluice {rel:.2e}, transformers itself {hf:.2e}", flush=True)
    save_json(args.out, "logits", rows)
    return 0


def sluice_error(model_dir: Path, prompt: list[int]) -> tuple[float, list[int]]:
    """(relative error, the decode's tokens): float32's greedy tokens fed to both dtypes."""
    import torch

    import engine
    logits, tokens = {}, None
    for dtype in ("float32", "bfloat16"):
        eng = engine.load(model_dir, device="cuda", dtype=dtype, max_context=64)
        with torch.inference_mode():
            first = eng.runner.prefill(prompt)
            tokens = tokens or [int(first.argmax())] + [3, 11, 29]
            logits[dtype] = torch.stack([eng.runner.decode(tok, len(prompt) + i).clone()
                                         for i, tok in enumerate(tokens)])
        eng.close()
    a, b = logits["float32"].double(), logits["bfloat16"].double()
    return ((a - b).norm() / a.norm()).item(), tokens


def transformers_error(hf_dir: Path, ids: list[int]) -> float:
    """transformers' own bf16-against-float32 error on the same tokens (the last 4 positions)."""
    import torch
    from transformers import AutoModelForCausalLM
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype).cuda()
        with torch.inference_mode():
            out[dtype] = model(torch.tensor([ids], device="cuda")).logits[0, -4:].double()
    a, b = out[torch.float32], out[torch.bfloat16]
    return ((a - b).norm() / a.norm()).item()
