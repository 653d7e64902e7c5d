"""The routers in Triton: softmax top-k (OLMoE, Qwen3-MoE, Mixtral, Qwen2-MoE, Qwen3-Next / 3.5, Qwen3.8-Flash-Next)
and top-k softmax (gpt-oss: top k of the biased logits, a softmax over those k).

  T = tokens, E = experts, H = hidden, K = experts per token
  h [T, H] (compute dtype), router weight [E, H] (bias [E]) -> weights [T, K] float32, expert ids [T, K] int64

router_kernel: one program a token computes the E logits (float32 sums, the bias added, rounded to the compute
dtype as F.linear's output is), then either their softmax in float32 and its top K (with norm_topk_prob, their
renormalisation) or their top K and a softmax over those (rounded to the compute dtype, as gpt-oss's softmax in
the logits' dtype gives them); the top K by repeated arg-max, best first as torch.topk gives them. A decode
step's few tokens split the sums over programs instead, and a second launch adds them and picks the top K. The
references, softmax_topk.router_ref and topk_softmax_ref, are the torch paths the routers take without it. Why
a kernel for so little work: the torch path's F.linear, softmax and topk are five to six launches a route (two
routes a decode layer: its own and the next layer's guess), and each loads a CUDA module holding host memory
for the process's life (cuBLAS alone ~81 MiB, topk ~46); with the int8 prompt GEMM no cuBLAS module loads.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .softmax_topk import router_ref, topk_softmax_ref  # noqa: F401  (the kernel's references, beside it)

KERNEL_VERSION = 3     # bump on any change to the kernels below: cached self-check verdicts are keyed on it
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
def _choose(sums, bias_ptr, token, E, weights_ptr, ids_ptr, out_dtype: tl.constexpr, TOP_K: tl.constexpr,
            RENORM: tl.constexpr, TOPK_FIRST: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_E: tl.constexpr,
            BLOCK_K: tl.constexpr):
    """The logits' float32 sums [BLOCK_E] -> the token's top K weights and ids, stored."""
    experts = tl.arange(0, BLOCK_E)
    e_ok = experts < E
    if HAS_BIAS:
        sums += tl.load(bias_ptr + experts, mask=e_ok, other=0.0).to(tl.float32)
    logits = sums.to(out_dtype).to(tl.float32)                   # F.linear's output, then float32
    logits = tl.where(e_ok, logits, float("-inf"))
    if TOPK_FIRST:
        left = logits
    else:
        num = tl.exp(logits - tl.max(logits, axis=0))
        left = num / tl.sum(num, axis=0)
    slots = tl.arange(0, BLOCK_K)
    values = tl.zeros([BLOCK_K], dtype=tl.float32)
    chosen = tl.zeros([BLOCK_K], dtype=tl.int64)
    for k in tl.static_range(TOP_K):
        best = tl.max(left, axis=0)
        index = tl.argmax(left, axis=0)
        values = tl.where(slots == k, best, values)
        chosen = tl.where(slots == k, index.to(tl.int64), chosen)
        left = tl.where(experts == index, float("-inf"), left)
    if TOPK_FIRST:                     # the softmax over the k, rounded to the logits' dtype
        top = tl.max(tl.where(slots < TOP_K, values, float("-inf")), axis=0)
        num = tl.where(slots < TOP_K, tl.exp(values - top), 0.0)
        values = (num / tl.sum(num, axis=0)).to(out_dtype).to(tl.float32)
    elif RENORM:
        values = values / tl.sum(tl.where(slots < TOP_K, values, 0.0), axis=0)
    out = token.to(tl.int64) * TOP_K + slots
    tl.store(weights_ptr + out, values, mask=slots < TOP_K)
    tl.store(ids_ptr + out, chosen, mask=slots < TOP_K)


@triton.jit
def _router_kernel(h_ptr, w_ptr, bias_ptr, weights_ptr, ids_ptr, E, H, TOP_K: tl.constexpr, RENORM: tl.constexpr,
                   TOPK_FIRST: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    token = tl.program_id(0)
    sums = _partial_logits(h_ptr, w_ptr, token, E, H, 0, H, BLOCK_E, BLOCK_H)
    _choose(sums, bias_ptr, token, E, weights_ptr, ids_ptr, h_ptr.dtype.element_ty, TOP_K, RENORM, TOPK_FIRST,
            HAS_BIAS, BLOCK_E, BLOCK_K)


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
def _split_topk_kernel(part_ptr, bias_ptr, weights_ptr, ids_ptr, E, SPLITS, out_dtype: tl.constexpr,
                       TOP_K: tl.constexpr, RENORM: tl.constexpr, TOPK_FIRST: tl.constexpr, HAS_BIAS: tl.constexpr,
                       BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    """grid (T,): the token's split sums added in split order, then its top K."""
    token = tl.program_id(0)
    experts = tl.arange(0, BLOCK_E)
    sums = tl.zeros([BLOCK_E], dtype=tl.float32)
    for split in range(0, SPLITS):
        sums += tl.load(part_ptr + (token * SPLITS + split).to(tl.int64) * BLOCK_E + experts)
    _choose(sums, bias_ptr, token, E, weights_ptr, ids_ptr, out_dtype, TOP_K, RENORM, TOPK_FIRST, HAS_BIAS,
            BLOCK_E, BLOCK_K)


_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def router_kernel(h: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool,
                  bias: torch.Tensor | None = None, topk_first: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """router_ref's routing, or with topk_first topk_softmax_ref's (renormalize is then unused). A prompt: one
    program a token. A decode step's few tokens: one program reading 256 KB of router weight (OLMoE) took
    14.6 us on the H200, so the hidden axis is split over programs that each sum SPLIT_COLS columns, and a
    second launch adds their sums and picks the top k."""
    flat = h.reshape(-1, h.shape[-1]).contiguous()
    (num_tokens, hidden), num_experts = flat.shape, weight.shape[0]
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=h.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=h.device)
    block_e = triton.next_power_of_2(num_experts)
    block_h = max(16, min(256, 8192 // block_e))           # the partial sums stay in registers
    block_k = triton.next_power_of_2(top_k)
    warps = 4 if block_e <= 128 else 8
    splits = triton.cdiv(hidden, SPLIT_COLS)
    choice = dict(TOP_K=top_k, RENORM=renormalize and not topk_first, TOPK_FIRST=topk_first,
                  HAS_BIAS=bias is not None, BLOCK_E=block_e, BLOCK_K=block_k, num_warps=warps)
    bias = bias.contiguous() if bias is not None else weights            # any pointer where there is none
    if num_tokens > SPLIT_MAX_TOKENS or splits < 2:
        _router_kernel[(num_tokens,)](flat, weight.contiguous(), bias, weights, ids, num_experts, hidden,
                                      BLOCK_H=block_h, **choice)
        return weights, ids
    part = torch.empty(num_tokens, splits, block_e, dtype=torch.float32, device=h.device)
    _split_sums_kernel[(num_tokens, splits)](flat, weight.contiguous(), part, num_experts, hidden, COLS=SPLIT_COLS,
                                             BLOCK_E=block_e, BLOCK_H=min(block_h, SPLIT_COLS), num_warps=warps)
    _split_topk_kernel[(num_tokens,)](part, bias, weights, ids, num_experts, splits, out_dtype=_TL_DTYPES[flat.dtype],
                                      **choice)
    return weights, ids
