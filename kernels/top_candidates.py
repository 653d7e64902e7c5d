"""Top-k sampling's candidates in one Triton launch: each chunk of the vocabulary's logits gives its k
largest, best first (a tie: the lower id first); the host finds the survivors among them and finishes
the draw (kernels/vocab_chunks.py, engine.runtime.sampling). Why: torch's `topk`, `masked_fill`, `sort`,
`softmax`, `cumsum` and `scatter` on the GPU each load a CUDA module that holds host memory for the
process's life (174 MiB for a reply sampled with the app's defaults), for a few
dozen values a token. Layout and reference (numpy, so its self-check loads no CUDA operator): vocab_chunks.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .vocab_chunks import CHUNK, MAX_K, top_candidates_ref  # noqa: F401  (the kernel's reference, beside it)

KERNEL_VERSION = 1     # bump on any change to the kernel below: cached self-check verdicts are keyed on it


@triton.jit
def _top_candidates_kernel(logits_ptr, out_ptr, V, k, total, CHUNK: tl.constexpr, BLOCK_K: tl.constexpr):
    chunk = tl.program_id(0)
    lanes = tl.arange(0, CHUNK)
    offs = chunk * CHUNK + lanes
    x = tl.load(logits_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    slots = tl.arange(0, BLOCK_K)
    values = tl.full([BLOCK_K], float("-inf"), tl.float32)
    ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    for i in range(k):
        best, at = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
        values = tl.where(slots == i, best, values)
        ids = tl.where(slots == i, chunk * CHUNK + at, ids)
        x = tl.where(lanes == at, float("-inf"), x)
    out = chunk * k + slots
    tl.store(out_ptr + out, values, mask=slots < k)
    tl.store(out_ptr + total + out, ids.to(tl.float32), mask=slots < k)


def top_candidates(logits: torch.Tensor, k: int) -> torch.Tensor:
    vocab = logits.shape[-1]
    chunks = triton.cdiv(vocab, CHUNK)
    out = torch.empty(2, chunks * k, dtype=torch.float32, device=logits.device)
    _top_candidates_kernel[(chunks,)](logits.reshape(-1).contiguous(), out, vocab, k, chunks * k, CHUNK=CHUNK,
                                      BLOCK_K=triton.next_power_of_2(k), num_warps=4)
    return out

