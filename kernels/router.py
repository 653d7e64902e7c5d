"""The softmax top-k router (OLMoE, Qwen3-MoE, Mixtral, Qwen2-MoE, Qwen3-Next / 3.5) in Triton.

  T = tokens, E = experts, H = hidden, K = experts per token
  h [T, H] (compute dtype), router weight [E, H] -> weights [T, K] float32, expert ids [T, K] int64

router_kernel: one program a token computes the E logits (float32 sums, rounded to the compute dtype as
F.linear's output is), their softmax in float32, the top K by repeated arg-max (best first, as torch.topk
gives them) and, for norm_topk_prob, their renormalisation. A decode step's few tokens split the sums over
programs instead, and a second launch adds them and picks the top K. Its reference, softmax_topk.router_ref,
is the torch path engine.model.block.Router takes. Why a kernel for so little work: the torch path's
F.linear, softmax and topk each load a CUDA module holding host memory for the process's life (cuBLAS alone
~81 MiB, topk ~46); with the int8 prompt GEMM (int8_linear.py) no cuBLAS module loads.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .softmax_topk import router_ref  # noqa: F401  (the kernel's reference, beside it)

KERNEL_VERSION = 2     # bump on any change to the kernels below: cached self-check verdicts are keyed on it
SPLIT_MAX_TOKENS = 4   # up to this many tokens (a decode step) the hidden axis is split over programs
SPLIT_COLS = 256       # columns of the hidden axis a split program sums


@triton.jit
def _partial_logits(h_ptr, w_ptr, token, E, H, h_lo, h_hi, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
    """float32 sums of the E logits over the hidden columns [h_lo, h_hi) -> [BLOCK_E]."""
    experts = tl.arange(0, BLOCK_E)
    e_ok = experts < E
    acc = tl.zeros([BLOCK_E, BLOCK_H], dtype=tl.float32)
    for h0 in range(h_lo, h_hi, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        c_ok = cols < h_hi
        w = tl.load(w_ptr + experts[:, None] * H + cols[None, :], mask=e_ok[:, None] & c_ok[None, :], other=0.0)
        x = tl.load(h_ptr + token.to(tl.int64) * H + cols, mask=c_ok, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    return tl.sum(acc, axis=1)


@triton.jit
def _softmax_topk(sums, token, E, weights_ptr, ids_ptr, out_dtype: tl.constexpr, TOP_K: tl.constexpr,
                  RENORM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    """The logits' float32 sums [BLOCK_E] -> the token's top K weights and ids, stored."""
    experts = tl.arange(0, BLOCK_E)
    e_ok = experts < E
    logits = sums.to(out_dtype).to(tl.float32)                   # F.linear's output, then float32
    logits = tl.where(e_ok, logits, float("-inf"))
    num = tl.exp(logits - tl.max(logits, axis=0))
    probs = num / tl.sum(num, axis=0)
    left = tl.where(e_ok, probs, -1.0)
    slots = tl.arange(0, BLOCK_K)
    values = tl.zeros([BLOCK_K], dtype=tl.float32)
    chosen = tl.zeros([BLOCK_K], dtype=tl.int64)
    for k in tl.static_range(TOP_K):
        best = tl.max(left, axis=0)
        index = tl.argmax(left, axis=0)
        values = tl.where(slots == k, best, values)
        chosen = tl.where(slots == k, index.to(tl.int64), chosen)
        left = tl.where(experts == index, -1.0, left)
    if RENORM:
        values = values / tl.sum(tl.where(slots < TOP_K, values, 0.0), axis=0)
    out = token.to(tl.int64) * TOP_K + slots
    tl.store(weights_ptr + out, values, mask=slots < TOP_K)
    tl.store(ids_ptr + out, chosen, mask=slots < TOP_K)


@triton.jit
def _router_kernel(h_ptr, w_ptr, weights_ptr, ids_ptr, E, H, TOP_K: tl.constexpr, RENORM: tl.constexpr,
                   BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    token = tl.program_id(0)
    sums = _partial_logits(h_ptr, w_ptr, token, E, H, 0, H, BLOCK_E, BLOCK_H)
    _softmax_topk(sums, token, E, weights_ptr, ids_ptr, h_ptr.dtype.element_ty, TOP_K, RENORM, BLOCK_E, BLOCK_K)


@triton.jit
def _split_sums_kernel(h_ptr, w_ptr, part_ptr, E, H, COLS: tl.constexpr, BLOCK_E: tl.constexpr,
                       BLOCK_H: tl.constexpr):
    """grid (T, S): program (t, s) sums the logits over its COLS columns into part[t, s, :]."""
    token, split = tl.program_id(0), tl.program_id(1)
    h_lo = split * COLS
    sums = _partial_logits(h_ptr, w_ptr, token, E, H, h_lo, tl.minimum(h_lo + COLS, H), BLOCK_E, BLOCK_H)
    experts = tl.arange(0, BLOCK_E)
    row = (token * tl.num_programs(1) + split).to(tl.int64) * BLOCK_E
    tl.store(part_ptr + row + experts, sums)


@triton.jit
def _split_topk_kernel(part_ptr, weights_ptr, ids_ptr, E, SPLITS, out_dtype: tl.constexpr, TOP_K: tl.constexpr,
                       RENORM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    """grid (T,): the token's split sums added in split order, then its softmax top K."""
    token = tl.program_id(0)
    experts = tl.arange(0, BLOCK_E)
    sums = tl.zeros([BLOCK_E], dtype=tl.float32)
    for split in range(0, SPLITS):
        sums += tl.load(part_ptr + (token * SPLITS + split).to(tl.int64) * BLOCK_E + experts)
    _softmax_topk(sums, token, E, weights_ptr, ids_ptr, out_dtype, TOP_K, RENORM, BLOCK_E, BLOCK_K)


_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def router_kernel(h: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """A prompt: one program a token. A decode step's few tokens: one program reading 256 KB of router
    weight (OLMoE) took 14.6 us on the H200, so the hidden axis is split over programs that each sum
    SPLIT_COLS columns, and a second launch adds their sums and picks the top k."""
    flat = h.reshape(-1, h.shape[-1]).contiguous()
    (num_tokens, hidden), num_experts = flat.shape, weight.shape[0]
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=h.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=h.device)
    block_e = triton.next_power_of_2(num_experts)
    block_h = max(16, min(256, 8192 // block_e))           # the partial sums stay in registers
    block_k = triton.next_power_of_2(top_k)
    warps = 4 if block_e <= 128 else 8
    splits = triton.cdiv(hidden, SPLIT_COLS)
    if num_tokens > SPLIT_MAX_TOKENS or splits < 2:
        _router_kernel[(num_tokens,)](flat, weight.contiguous(), weights, ids, num_experts, hidden, TOP_K=top_k,
                                      RENORM=renormalize, BLOCK_E=block_e, BLOCK_H=block_h, BLOCK_K=block_k,
                                      num_warps=warps)
        return weights, ids
    part = torch.empty(num_tokens, splits, block_e, dtype=torch.float32, device=h.device)
    _split_sums_kernel[(num_tokens, splits)](flat, weight.contiguous(), part, num_experts, hidden, COLS=SPLIT_COLS,
                                             BLOCK_E=block_e, BLOCK_H=min(block_h, SPLIT_COLS), num_warps=warps)
    _split_topk_kernel[(num_tokens,)](part, weights, ids, num_experts, splits, out_dtype=_TL_DTYPES[flat.dtype],
                                      TOP_K=top_k, RENORM=renormalize, BLOCK_E=block_e, BLOCK_K=block_k,
                                      num_warps=warps)
    return weights, ids
