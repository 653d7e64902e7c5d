"""MLA's one decode token in the latent space, split over the keys (reference: attention_ref.mla_decode_ref).

  H = heads, r = kv_lora_rank, dr = rope dim, S = positions held
  q_latent [H, r], q_rope [H, dr], kv_latent [S, r], k_rope [S, dr], q_positions [1] (on the device) -> [H, r]
All heads attend over the one latent KV, so a program takes a block of BLOCK_H heads and a split of the keys
0..position: it loads each block of latent and rope rows once for all its heads, scores them with two dots
and keeps an online softmax in float32 per head, then leaves its running max, sum and weighted latents. A
second launch, one program a head block, merges the splits that hold visible keys, as decode_attention's
merge does. Neither launch reads the static buffer past the position or depends on it on the host: the grid
is the buffer's, so the step runs inside the decode's CUDA graph, and costs about the same deep in a long
context as near its start instead of softmaxing the whole buffer under a causal mask.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .tiles import interpreting, mma

KERNEL_VERSION = 2     # bump on any change to the kernels below: cached self-check verdicts are keyed on it
BLOCK_H = 16           # heads a program: tl.dot's least number of rows
BLOCK_S = 32           # keys a program loads at once: [BLOCK_S, r] latents, 32 KiB in bf16 at r = 512
SPLIT = 128            # keys a program walks at least (a multiple of BLOCK_S)
MAX_SPLITS = 128       # splits at most: their partial sums hold H x splits x r floats (32 MiB at H = 128, r = 512)


@triton.jit
def _split_kernel(ql_ptr, qr_ptr, kv_ptr, kr_ptr, pos_ptr, acc_ptr, stat_ptr, num_heads, rank, rope_dim,
                  kv_stride, kr_stride, scale, num_splits, FP32_DOT: tl.constexpr, SPLIT: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_DR: tl.constexpr):
    split = tl.program_id(1)
    lo = split.to(tl.int64) * SPLIT
    hi = tl.minimum(tl.load(pos_ptr).to(tl.int64) + 1, lo + SPLIT)
    if lo < hi:                                                     # a split past the position writes nothing
        heads = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
        h_ok = heads < num_heads
        dims, rope_dims = tl.arange(0, BLOCK_R), tl.arange(0, BLOCK_DR)
        r_ok, dr_ok = dims < rank, rope_dims < rope_dim
        kv_type = kv_ptr.dtype.element_ty
        q_latent = tl.load(ql_ptr + heads[:, None] * rank + dims[None, :], mask=h_ok[:, None] & r_ok[None, :],
                           other=0.0).to(kv_type)                                           # [BH, BR]
        q_rope = tl.load(qr_ptr + heads[:, None] * rope_dim + rope_dims[None, :],
                         mask=h_ok[:, None] & dr_ok[None, :], other=0.0).to(kr_ptr.dtype.element_ty)   # [BH, BDR]
        best = tl.full([BLOCK_H], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_R], dtype=tl.float32)
        for s0 in range(lo, hi, BLOCK_S):
            keys = s0 + tl.arange(0, BLOCK_S)
            s_ok = keys < hi
            kv = tl.load(kv_ptr + keys[:, None] * kv_stride + dims[None, :], mask=s_ok[:, None] & r_ok[None, :],
                         other=0.0)                                                         # [BS, BR]
            k_rope = tl.load(kr_ptr + keys[:, None] * kr_stride + rope_dims[None, :],
                             mask=s_ok[:, None] & dr_ok[None, :], other=0.0)                # [BS, BDR]
            scores = mma(q_rope, tl.trans(k_rope), mma(q_latent, tl.trans(kv), tl.zeros([BLOCK_H, BLOCK_S], tl.float32),
                                                        FP32_DOT), FP32_DOT)                # [BH, BS]
            scores = tl.where(s_ok[None, :], scores * scale, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=1))
            weights = tl.exp(scores - new_best[:, None])
            rescale = tl.exp(best - new_best)
            total = total * rescale + tl.sum(weights, axis=1)
            acc = mma(weights.to(kv_type), kv, acc * rescale[:, None], FP32_DOT)            # [BH, BR]
            best = new_best
        parts = heads * num_splits + split                                                  # [BH]
        tl.store(acc_ptr + parts[:, None] * BLOCK_R + dims[None, :], acc)
        tl.store(stat_ptr + parts * 2, best)
        tl.store(stat_ptr + parts * 2 + 1, total)


@triton.jit
def _merge_kernel(acc_ptr, stat_ptr, pos_ptr, out_ptr, num_heads, rank, num_splits, SPLIT: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr):
    heads = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_R)
    end = tl.load(pos_ptr).to(tl.int64) + 1
    best = tl.full([BLOCK_H], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_R], dtype=tl.float32)
    for split in range(0, (end - 1) // SPLIT + 1):                  # the splits with visible keys
        parts = heads * num_splits + split
        split_best = tl.load(stat_ptr + parts * 2)
        new_best = tl.maximum(best, split_best)
        rescale, weight = tl.exp(best - new_best), tl.exp(split_best - new_best)
        total = total * rescale + tl.load(stat_ptr + parts * 2 + 1) * weight
        acc = acc * rescale[:, None] + tl.load(acc_ptr + parts[:, None] * BLOCK_R + dims[None, :]) * weight[:, None]
        best = new_best
    tl.store(out_ptr + heads[:, None] * rank + dims[None, :], (acc / total[:, None]).to(out_ptr.dtype.element_ty),
             mask=(heads < num_heads)[:, None] & (dims < rank)[None, :])


def mla_decode(q_latent: torch.Tensor, q_rope: torch.Tensor, kv_latent: torch.Tensor, k_rope: torch.Tensor,
               q_positions: torch.Tensor, scale: float, split: int | None = None) -> torch.Tensor:
    """mla_decode_ref's signature. kv_latent and k_rope as the state holds them (rows of contiguous values, any
    row stride). `split`: keys a program walks (a multiple of BLOCK_S; default: SPLIT, or more where the buffer
    would need over MAX_SPLITS splits; the buffer's length or more walks every key in one program a head block)."""
    num_heads, rank = q_latent.shape
    held, rope_dim = k_rope.shape
    if kv_latent.stride(1) != 1 or k_rope.stride(1) != 1:
        raise ValueError("mla_decode reads rows of contiguous latents and rope keys")
    split = split or max(SPLIT, triton.cdiv(triton.cdiv(held, MAX_SPLITS), BLOCK_S) * BLOCK_S)
    block_r, block_dr = max(16, triton.next_power_of_2(rank)), max(16, triton.next_power_of_2(rope_dim))
    num_blocks, num_splits = triton.cdiv(num_heads, BLOCK_H), triton.cdiv(held, split)
    padded_heads = num_blocks * BLOCK_H                           # the partial sums of padding heads too: no masks
    acc = torch.empty(padded_heads * num_splits * block_r, dtype=torch.float32, device=q_latent.device)
    stats = torch.empty(padded_heads * num_splits * 2, dtype=torch.float32, device=q_latent.device)
    out = torch.empty(num_heads, rank, dtype=q_latent.dtype, device=q_latent.device)
    fp32_dot = kv_latent.dtype == torch.float32 or interpreting()
    _split_kernel[(num_blocks, num_splits)](q_latent.contiguous(), q_rope.contiguous(), kv_latent, k_rope,
                                            q_positions, acc, stats, num_heads, rank, rope_dim, kv_latent.stride(0),
                                            k_rope.stride(0), scale, num_splits, FP32_DOT=fp32_dot, SPLIT=split,
                                            BLOCK_H=BLOCK_H, BLOCK_S=BLOCK_S, BLOCK_R=block_r, BLOCK_DR=block_dr,
                                            num_warps=4)
    _merge_kernel[(num_blocks,)](acc, stats, q_positions, out, num_heads, rank, num_splits, SPLIT=split,
                                 BLOCK_H=BLOCK_H, BLOCK_R=block_r, num_warps=4)
    return out
