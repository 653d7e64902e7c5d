"""The peer: the same Hugging Face checkpoint in transformers with accelerate offloading, under
the same GPU and CPU memory limits (the rest offloaded to disk)."""
from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

import torch

from engine.sizes import parse_size


def run_accelerate(hf_dir: Path, vram_budget, ram_cache, prompt_tokens: int, new_tokens: int,
                   offload_dir: Path, log=print) -> dict:
    from transformers import AutoModelForCausalLM
    gpu_bytes, cpu_bytes = parse_size(vram_budget), parse_size(ram_cache)
    max_memory = {0: gpu_bytes or torch.cuda.mem_get_info()[0], "cpu": cpu_bytes or 8 << 30}
    shutil.rmtree(offload_dir, ignore_errors=True)
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16, device_map="auto",
                                                 max_memory=max_memory, offload_folder=str(offload_dir))
    load_s = time.perf_counter() - start
    log(f"accelerate: loaded in {load_s:.1f} s with max_memory={max_memory}")
    vocab = model.config.vocab_size
    ids = torch.tensor([[random.Random(0).randrange(vocab) for _ in range(prompt_tokens)]], device="cuda")
    with torch.inference_mode():
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False)
        torch.cuda.synchronize()
        ttft = time.perf_counter() - start
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        torch.cuda.synchronize()
        total = time.perf_counter() - start
    generated = out.shape[1] - prompt_tokens
    decode_s = max(total - ttft, 1e-9)       # the second generate repeats the prefill
    result = {"load_s": load_s, "ttft_s": ttft, "prompt_tokens": prompt_tokens, "new_tokens": generated,
              "decode_tok_s": (generated - 1) / decode_s, "max_memory": {str(k): v for k, v in max_memory.items()},
              "vram_peak_bytes": torch.cuda.max_memory_allocated()}
    del model
    torch.cuda.empty_cache()
    shutil.rmtree(offload_dir, ignore_errors=True)
    return result
