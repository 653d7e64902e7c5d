"""Which GPU kernels' first run costs the process host memory (issue #10's memory diet).

Run 35 found ~0.5 GiB of anonymous memory appearing at the first prompt, with or without CUDA graphs:
the first run of the model's GPU kernels. This runs each kind of operation a prompt and a decode step
use, at OLMoE-1B-7B's shapes, once, in a fresh process, and prints the anonymous memory each first
run added, and the libraries' file pages it touched (a cgroup cap counts those too). Run it with
CUDA_MODULE_LOADING=LAZY (torch's default) and EAGER to see what lazy loading saves.
Usage: python3 scripts/probe_first_use.py [hidden=2048] [vocab=50304]
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    hidden = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    vocab = int(sys.argv[2]) if len(sys.argv) > 2 else 50304
    from engine.runtime.memory import process_memory
    rows, last = [], list(process_memory())

    def note(what: str) -> None:
        torch.cuda.synchronize()
        rss, anon = process_memory()
        rows.append((what, (anon - last[1]) / 2**20, anon / 2**20, (rss - anon - last[0] + last[1]) / 2**20))
        last[:] = [rss, anon]

    import torch
    import torch.nn.functional as F
    note("import torch")
    dev, bf16 = "cuda", torch.bfloat16
    x1 = torch.zeros(1, hidden, device=dev, dtype=bf16)
    note("CUDA context + a fill")
    x = torch.randn(512, hidden, device=dev, dtype=bf16)
    note("randn (curand)")
    y = x + x
    (x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(bf16))
    note("elementwise + reductions (rms norm)")
    w = torch.randn(hidden, hidden, device=dev, dtype=bf16)
    F.linear(x1, w)
    note("linear, one token (cuBLAS GEMV)")
    F.linear(x, w)
    note("linear, 512 tokens (cuBLAS GEMM)")
    probs = torch.softmax(F.linear(x1, torch.randn(64, hidden, device=dev, dtype=bf16)), -1, dtype=torch.float32)
    torch.topk(probs, 8, dim=-1)
    note("router: softmax + topk")
    q = torch.randn(1, 16, 512, 128, device=dev, dtype=bf16)
    F.scaled_dot_product_attention(q, q, q, is_causal=True)
    note("SDPA causal prompt (flash)")
    mask = torch.ones(1, 512, device=dev, dtype=torch.bool)
    F.scaled_dot_product_attention(q[:, :, :1], q, q, attn_mask=mask)
    note("SDPA one token with a mask")
    table = torch.randn(vocab, hidden, device=dev, dtype=bf16)
    F.embedding(torch.tensor([1, 2], device=dev), table)
    note("embedding")
    cache = torch.zeros(1024, 16, 128, device=dev, dtype=bf16)
    cache.index_copy_(0, torch.tensor([3], device=dev), q[0, :, :1].transpose(0, 1))
    note("KV append (index_copy)")
    torch.cat([y[:, :64], -y[:, 64:]], dim=-1)
    note("cat (rope)")
    try:
        from kernels.int8_linear import int8_linear_kernel
        codes = torch.randint(-127, 128, (hidden, hidden), device=dev, dtype=torch.int8)
        int8_linear_kernel(x1, codes, torch.ones(hidden, device=dev, dtype=bf16))
        note("Triton int8 linear (import + compile or cache)")
    except ImportError:
        pass
    print(f"CUDA_MODULE_LOADING={os.environ.get('CUDA_MODULE_LOADING', '(unset: torch sets LAZY)')}, "
          f"arch list {torch.cuda.get_arch_list()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"{'first run of':<48} {'+anon MiB':>10} {'anon MiB':>9} {'+file MiB':>10}")
    for what, delta, total, files in rows:
        print(f"{what:<48} {delta:>10.0f} {total:>9.0f} {files:>10.0f}")


if __name__ == "__main__":
    main()
