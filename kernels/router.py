"""The routers in Triton: softmax top-k (OLMoE, Qwen3-MoE, Mixtral, Qwen2-MoE, Qwen3-Next / 3.5, Qwen3.8-Flash-Next),
top-k softmax (gpt-oss: top k of the biased logits, a softmax over those k) and group-limited routing
(DeepSeek-V2/V3, Kimi-K2, GLM-4.x, MiniMax-M2, dots1, ERNIE-4.5, Nemotron-H).

  T = tokens, E = experts, H = hidden, K = experts per token, G = groups
  h [T, H] (compute dtype), router weight [E, H] (bias [E]) -> weights [T, K] float32, expert ids [T, K] int64

Each token's E logits are float32 sums. A prompt: one program a token computes them and picks. A decode step's few
tokens: the hidden axis is split over programs (_split_sums_kernel), and a second launch adds their sums and picks.
The picks, all by repeated arg-max, so the ids come best first as torch.topk sorted gives them:
  _choose           the logits (bias added) rounded to the compute dtype as F.linear's output is, then either their
                    softmax in float32 and its top K (with norm_topk_prob, renormalised) or their top K and a
                    softmax over those (rounded to the compute dtype, as gpt-oss's softmax in the logits' dtype is)
  _choose_grouped   the float32 logits' softmax or sigmoid (the scores), plus the correction bias (the choice); the
                    groups' scores (max or top-2 sum of the choice), the best keep_groups groups kept, the others'
                    experts masked; the top K of the choice, best first; their unbiased scores renormalised, scaled
The references, softmax_topk.router_ref, topk_softmax_ref and GroupedRouting.route, are the torch paths the routers
take without them (GroupedRouting.route's ids unsorted). Why a kernel for so little work: the torch path's F.linear,
softmax and topk are five to six launches a route (the grouped one ~20), two routes a decode layer (its own and the
next layer's guess, which an unsorted router also argsorts), and each loads a CUDA module holding host memory for
the process's life (cuBLAS alone ~81 MiB, topk ~46); with the int8 prompt GEMM no cuBLAS module loads.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .softmax_topk import GroupedRouting, router_ref, topk_softmax_ref  # noqa: F401  (the references, beside them)

KERNEL_VERSION = 4     # bump on any change to the kernels below: cached self-check verdicts are keyed on it
SPLIT_MAX_TOKENS = 4   # up to this many tokens (a decode step) the hidden axis is split over programs
SPLIT_COLS = 256       # columns of the hidden axis a split program sums
SPLIT_TILE = 8         # split sums the pick loads at once (their loads in flight together)


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
def _added_splits(part_ptr, token, SPLITS, BLOCK_E: tl.constexpr, TILE: tl.constexpr):
    """The token's float32 logits [BLOCK_E]: its SPLITS split sums part[token, :, :] added, TILE at a time."""
    experts = tl.arange(0, BLOCK_E)
    rows = tl.arange(0, TILE)
    sums = tl.zeros([BLOCK_E], dtype=tl.float32)
    for s0 in range(0, SPLITS, TILE):
        split = s0 + rows
        at = (token * SPLITS + split).to(tl.int64)[:, None] * BLOCK_E + experts[None, :]
        sums += tl.sum(tl.load(part_ptr + at, mask=(split < SPLITS)[:, None], other=0.0), axis=0)
    return sums


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
def _choose_grouped(logits, bias_ptr, token, E, weights_ptr, ids_ptr, renorm_min, renorm_eps, scaling,
                    SOFTMAX: tl.constexpr, HAS_BIAS: tl.constexpr, NUM_GROUPS: tl.constexpr,
                    KEEP_GROUPS: tl.constexpr, TOP2_SUM: tl.constexpr, TOP_K: tl.constexpr, RENORM: tl.constexpr,
                    BLOCK_E: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_K: tl.constexpr):
    """The float32 logits [BLOCK_E] -> the token's top K weights and ids (best first by the choice), stored."""
    experts = tl.arange(0, BLOCK_E)
    e_ok = experts < E
    logits = tl.where(e_ok, logits, float("-inf"))
    if SOFTMAX:
        num = tl.exp(logits - tl.max(logits, axis=0))
        scores = num / tl.sum(num, axis=0)
    else:
        scores = tl.sigmoid(logits)
    choice = scores
    if HAS_BIAS:
        choice += tl.load(bias_ptr + experts, mask=e_ok, other=0.0).to(tl.float32)
    choice = tl.where(e_ok, choice, float("-inf"))
    if NUM_GROUPS > 1:
        groups = tl.arange(0, BLOCK_G)
        member = (experts[None, :] // (E // NUM_GROUPS) == groups[:, None]) & e_ok[None, :]         # [G, E]
        in_group = tl.where(member, choice[None, :], float("-inf"))
        group_scores = tl.max(in_group, axis=1)                                                      # [G]
        if TOP2_SUM:                   # plus the runner-up: the best again with the best's slot left out
            first = tl.argmax(in_group, axis=1)
            group_scores += tl.max(tl.where(experts[None, :] == first[:, None], float("-inf"), in_group), axis=1)
        group_scores = tl.where(groups < NUM_GROUPS, group_scores, float("-inf"))
        is_kept = groups < 0
        for _ in tl.static_range(KEEP_GROUPS):
            best = tl.argmax(group_scores, axis=0)
            is_kept = is_kept | (groups == best)
            group_scores = tl.where(groups == best, float("-inf"), group_scores)
        selectable = tl.max(tl.where(member & is_kept[:, None], 1, 0), axis=0) > 0                  # [E]
        # the reference's masks: 0 under softmax (its scores are positive), -inf under sigmoid
        choice = tl.where(selectable | ~e_ok, choice, 0.0 if SOFTMAX else float("-inf"))
    slots = tl.arange(0, BLOCK_K)
    values = tl.zeros([BLOCK_K], dtype=tl.float32)
    chosen = tl.zeros([BLOCK_K], dtype=tl.int64)
    for k in tl.static_range(TOP_K):
        index = tl.argmax(choice, axis=0)
        values = tl.where(slots == k, tl.sum(tl.where(experts == index, scores, 0.0), axis=0), values)
        chosen = tl.where(slots == k, index.to(tl.int64), chosen)
        choice = tl.where(experts == index, float("-inf"), choice)
    if RENORM:
        values = values / (tl.maximum(tl.sum(values, axis=0), renorm_min) + renorm_eps)
    out = token.to(tl.int64) * TOP_K + slots
    tl.store(weights_ptr + out, values * scaling, mask=slots < TOP_K)
    tl.store(ids_ptr + out, chosen, mask=slots < TOP_K)


# Two kernels a router: one program a token (a prompt), and the pick after a decode step's split sums. `_launch`
# calls both alike: (h, weight | part), weights, ids, E, (H | SPLITS), then the router's own arguments.

@triton.jit
def _router_kernel(h_ptr, w_ptr, weights_ptr, ids_ptr, E, H, bias_ptr, OUT_DTYPE: tl.constexpr,
                   TOP_K: tl.constexpr, RENORM: tl.constexpr, TOPK_FIRST: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr):
    token = tl.program_id(0)
    sums = _partial_logits(h_ptr, w_ptr, token, E, H, 0, H, BLOCK_E, BLOCK_H)
    _choose(sums, bias_ptr, token, E, weights_ptr, ids_ptr, OUT_DTYPE, TOP_K, RENORM, TOPK_FIRST, HAS_BIAS,
            BLOCK_E, BLOCK_K)


@triton.jit
def _split_router_kernel(part_ptr, weights_ptr, ids_ptr, E, SPLITS, bias_ptr, OUT_DTYPE: tl.constexpr,
                         TOP_K: tl.constexpr, RENORM: tl.constexpr, TOPK_FIRST: tl.constexpr,
                         HAS_BIAS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, TILE: tl.constexpr):
    token = tl.program_id(0)
    sums = _added_splits(part_ptr, token, SPLITS, BLOCK_E, TILE)
    _choose(sums, bias_ptr, token, E, weights_ptr, ids_ptr, OUT_DTYPE, TOP_K, RENORM, TOPK_FIRST, HAS_BIAS,
            BLOCK_E, BLOCK_K)


@triton.jit
def _grouped_kernel(h_ptr, w_ptr, weights_ptr, ids_ptr, E, H, bias_ptr, renorm_min, renorm_eps, scaling,
                    SOFTMAX: tl.constexpr, HAS_BIAS: tl.constexpr, NUM_GROUPS: tl.constexpr,
                    KEEP_GROUPS: tl.constexpr, TOP2_SUM: tl.constexpr, TOP_K: tl.constexpr, RENORM: tl.constexpr,
                    BLOCK_E: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr):
    token = tl.program_id(0)
    logits = _partial_logits(h_ptr, w_ptr, token, E, H, 0, H, BLOCK_E, BLOCK_H)
    _choose_grouped(logits, bias_ptr, token, E, weights_ptr, ids_ptr, renorm_min, renorm_eps, scaling, SOFTMAX,
                    HAS_BIAS, NUM_GROUPS, KEEP_GROUPS, TOP2_SUM, TOP_K, RENORM, BLOCK_E, BLOCK_G, BLOCK_K)


@triton.jit
def _split_grouped_kernel(part_ptr, weights_ptr, ids_ptr, E, SPLITS, bias_ptr, renorm_min, renorm_eps, scaling,
                          SOFTMAX: tl.constexpr, HAS_BIAS: tl.constexpr, NUM_GROUPS: tl.constexpr,
                          KEEP_GROUPS: tl.constexpr, TOP2_SUM: tl.constexpr, TOP_K: tl.constexpr,
                          RENORM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_K: tl.constexpr,
                          TILE: tl.constexpr):
    token = tl.program_id(0)
    logits = _added_splits(part_ptr, token, SPLITS, BLOCK_E, TILE)
    _choose_grouped(logits, bias_ptr, token, E, weights_ptr, ids_ptr, renorm_min, renorm_eps, scaling, SOFTMAX,
                    HAS_BIAS, NUM_GROUPS, KEEP_GROUPS, TOP2_SUM, TOP_K, RENORM, BLOCK_E, BLOCK_G, BLOCK_K)


_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def router_kernel(h: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool,
                  bias: torch.Tensor | None = None, topk_first: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """router_ref's routing, or with topk_first topk_softmax_ref's (renormalize is then unused)."""
    return _launch(_router_kernel, _split_router_kernel, h, weight, top_k, _bias_or_any(bias, h),
                   OUT_DTYPE=_TL_DTYPES[h.dtype], TOP_K=top_k, RENORM=renormalize and not topk_first,
                   TOPK_FIRST=topk_first, HAS_BIAS=bias is not None)


def grouped_router_kernel(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, routing: GroupedRouting
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """routing.route(h, weight, bias), its ids best first by the choice (E up to 512, K up to 32: one program holds
    a token's E scores in registers and takes its top K one arg-max at a time)."""
    num_experts = weight.shape[0]
    if num_experts > 512 or routing.top_k > 32 or num_experts % routing.num_groups:
        raise ValueError(f"the grouped router kernel takes up to 512 experts in equal groups and k up to 32, not "
                         f"{num_experts} experts in {routing.num_groups} groups and k {routing.top_k}")
    return _launch(_grouped_kernel, _split_grouped_kernel, h, weight, routing.top_k, _bias_or_any(bias, h),
                   float(routing.renorm_min), float(routing.renorm_eps), float(routing.scaling),
                   SOFTMAX=routing.scoring == "softmax", HAS_BIAS=bias is not None, NUM_GROUPS=routing.num_groups,
                   KEEP_GROUPS=routing.keep_groups, TOP2_SUM=routing.group_score == "top2_sum",
                   TOP_K=routing.top_k, RENORM=routing.renormalize,
                   BLOCK_G=triton.next_power_of_2(routing.num_groups))


def _bias_or_any(bias: torch.Tensor | None, h: torch.Tensor) -> torch.Tensor:
    return bias.contiguous() if bias is not None else h            # any pointer where there is none (unread)


def _launch(one_program, split_pick, h: torch.Tensor, weight: torch.Tensor, top_k: int, *args, **consts
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """A router's kernels on h [.., H] -> weights [T, K] float32, ids [T, K] int64. A prompt: one program a token.
    A decode step's few tokens: one program reading 256 KB of router weight (OLMoE) took 14.6 us on the H200, so
    the hidden axis is split over programs that each sum SPLIT_COLS columns, and a second launch adds their sums
    and picks the top k."""
    flat, weight = h.reshape(-1, h.shape[-1]).contiguous(), weight.contiguous()
    (num_tokens, hidden), num_experts = flat.shape, weight.shape[0]
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=h.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=h.device)
    block_e = triton.next_power_of_2(num_experts)
    block_h = max(16, min(256, 8192 // block_e))           # the partial sums stay in registers
    warps = 4 if block_e <= 128 else 8
    splits = triton.cdiv(hidden, SPLIT_COLS)
    consts.update(BLOCK_E=block_e, BLOCK_K=triton.next_power_of_2(top_k), num_warps=warps)
    if num_tokens > SPLIT_MAX_TOKENS or splits < 2:
        one_program[(num_tokens,)](flat, weight, weights, ids, num_experts, hidden, *args, BLOCK_H=block_h, **consts)
        return weights, ids
    part = torch.empty(num_tokens, splits, block_e, dtype=torch.float32, device=h.device)
    _split_sums_kernel[(num_tokens, splits)](flat, weight, part, num_experts, hidden, COLS=SPLIT_COLS,
                                             BLOCK_E=block_e, BLOCK_H=min(block_h, SPLIT_COLS), num_warps=warps)
    split_pick[(num_tokens,)](part, weights, ids, num_experts, splits, *args, TILE=SPLIT_TILE, **consts)
    return weights, ids
