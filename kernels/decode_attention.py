"""One decode token's attention, split over the keys (its reference: kernels/attention_ref.attention_ref).

  Hq / Hkv = query / kv heads (a query head reads kv head h // (Hq / Hkv)), D = head dim, S = positions held
  q [1, Hq, D], k, v [S, Hkv, D], q_positions [1] (on the device) -> [1, Hq * D]
The keys a query head can see, 0..position (the last `window` of them with a sliding window), are cut into
splits of SPLIT keys: one program a (head, split) walks its split in blocks with an online softmax in float32
and leaves its running max, sum and weighted values; a second launch, one program a head, merges the splits
that hold visible keys, so a token's attention costs about the same deep in a long context as near its start.
With sinks [Hq] (gpt-oss), the merge then folds each head's sink logit in as a softmax column it drops. With
`visible` [1, S] (a sparse attention's chosen rows, gathered: qwen4_exp's QSA) the query sees the held rows the
mask keeps, not a causal range.
Neither launch reads the rest of a static KV buffer or depends on the position on the host: the grid is the
buffer's, so the step runs inside the decode's CUDA graph. Why a kernel: the torch path's masked
`scaled_dot_product_attention` loads a CUDA module that holds 70 MiB of host memory for the process's life.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attention_ref import attention_ref

KERNEL_VERSION = 4     # bump on any change to the kernels below: cached self-check verdicts are keyed on it
BLOCK_S = 64           # keys a program loads at once
SPLIT = 64             # keys a program walks (a multiple of BLOCK_S): the fastest of 64-256 measured


@triton.jit
def _visible(pos_ptr, window, held, HAS_WINDOW: tl.constexpr, HAS_VISIBLE: tl.constexpr):
    """[start, end) of the keys the step's query may see (with a mask: every row held, the mask decides)."""
    if HAS_VISIBLE:
        end = tl.full([], held, tl.int64)
    else:
        end = tl.load(pos_ptr).to(tl.int64) + 1
    if HAS_WINDOW:
        start = tl.maximum(end - window, 0)
    else:
        start = end * 0
    return start, end


@triton.jit
def _shift(best):
    """The max an online softmax subtracts: 0 while every score so far is masked (-inf - -inf is NaN)."""
    return tl.where(best == float("-inf"), 0.0, best)


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, vis_ptr, acc_ptr, stat_ptr, num_kv_heads, group, head_dim, scale,
                  window, held, num_splits, HAS_WINDOW: tl.constexpr, HAS_VISIBLE: tl.constexpr, SPLIT: tl.constexpr,
                  BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    head = tl.program_id(0)
    split = tl.program_id(1)
    kv_head = head // group
    start, end = _visible(pos_ptr, window, held, HAS_WINDOW, HAS_VISIBLE)
    lo = tl.maximum(start, split * SPLIT)
    hi = tl.minimum(end, split * SPLIT + SPLIT)
    if lo < hi:                                                     # a split with no visible key writes nothing
        dims = tl.arange(0, BLOCK_D)
        d_ok = dims < head_dim
        q = tl.load(q_ptr + head * head_dim + dims, mask=d_ok, other=0.0).to(tl.float32)
        best = tl.max(tl.full([BLOCK_S], float("-inf"), tl.float32), axis=0)
        total = tl.sum(tl.zeros([BLOCK_S], dtype=tl.float32), axis=0)
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        for s0 in range((lo // BLOCK_S) * BLOCK_S, hi, BLOCK_S):
            keys = s0 + tl.arange(0, BLOCK_S)
            s_ok = (keys >= lo) & (keys < hi)
            if HAS_VISIBLE:
                s_ok = s_ok & (tl.load(vis_ptr + keys, mask=s_ok, other=0) != 0)
            rows = (keys[:, None] * num_kv_heads + kv_head) * head_dim + dims[None, :]
            k = tl.load(k_ptr + rows, mask=s_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
            scores = tl.where(s_ok, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=0))
            weights = tl.exp(scores - _shift(new_best))
            rescale = tl.exp(best - _shift(new_best))
            v = tl.load(v_ptr + rows, mask=s_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
            total = total * rescale + tl.sum(weights, axis=0)
            acc = acc * rescale + tl.sum(weights[:, None] * v, axis=0)
            best = new_best
        part = head * num_splits + split
        tl.store(acc_ptr + part * BLOCK_D + dims, acc)
        tl.store(stat_ptr + part * 2, best)
        tl.store(stat_ptr + part * 2 + 1, total)


@triton.jit
def _merge_kernel(acc_ptr, stat_ptr, pos_ptr, sinks_ptr, out_ptr, head_dim, window, held, num_splits,
                  HAS_WINDOW: tl.constexpr, HAS_VISIBLE: tl.constexpr, HAS_SINKS: tl.constexpr, SPLIT: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    head = tl.program_id(0)
    start, end = _visible(pos_ptr, window, held, HAS_WINDOW, HAS_VISIBLE)
    dims = tl.arange(0, BLOCK_D)
    best = tl.max(tl.full([2], float("-inf"), tl.float32), axis=0)
    total = tl.sum(tl.zeros([2], dtype=tl.float32), axis=0)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for split in range(start // SPLIT, (end - 1) // SPLIT + 1):     # the splits with visible keys
        part = head * num_splits + split
        split_best = tl.load(stat_ptr + part * 2)
        new_best = tl.maximum(best, split_best)              # a split whose rows the mask dropped: -inf
        rescale, weight = tl.exp(best - _shift(new_best)), tl.exp(split_best - _shift(new_best))
        total = total * rescale + tl.load(stat_ptr + part * 2 + 1) * weight
        acc = acc * rescale + tl.load(acc_ptr + part * BLOCK_D + dims) * weight
        best = new_best
    if HAS_SINKS:       # a column of the softmax with no value; the logit as the checkpoint holds it (not scaled)
        sink = tl.load(sinks_ptr + head).to(tl.float32)
        new_best = tl.maximum(best, sink)
        rescale = tl.exp(best - new_best)
        total = total * rescale + tl.exp(sink - new_best)
        acc = acc * rescale
    tl.store(out_ptr + head * head_dim + dims, (acc / total).to(out_ptr.dtype.element_ty), mask=dims < head_dim)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor | None,
                     window: int | None, sinks: torch.Tensor | None = None, split: int | None = None,
                     visible: torch.Tensor | None = None) -> torch.Tensor:
    """k and v as the state holds them (contiguous [S, Hkv, D]): the kernels index them by row. `sinks` [Hq]: a
    sink logit per head, in any float dtype (attention_ref's). `split`: keys a program walks (a multiple of BLOCK_S;
    default SPLIT, read at the call; the buffer's length or more walks every key in one program a head).
    `visible` [1, S] bool: the rows the query sees (q_positions then unused; at least one row must be visible)."""
    split = split or SPLIT
    _, num_q_heads, head_dim = q.shape
    held, num_kv_heads = k.shape[0], k.shape[1]
    block_d = triton.next_power_of_2(head_dim)
    num_splits = triton.cdiv(held, split)
    acc = torch.empty(num_q_heads * num_splits * block_d, dtype=torch.float32, device=q.device)
    stats = torch.empty(num_q_heads * num_splits * 2, dtype=torch.float32, device=q.device)
    out = torch.empty(1, num_q_heads * head_dim, dtype=q.dtype, device=q.device)
    has_window, has_visible = bool(window), visible is not None
    positions = stats if q_positions is None else q_positions          # any pointer where it is not read
    mask = visible.reshape(-1).contiguous().view(torch.uint8) if has_visible else stats     # bytes, as bool holds them
    _split_kernel[(num_q_heads, num_splits)](q.contiguous(), k, v, positions, mask, acc, stats, num_kv_heads,
                                             num_q_heads // num_kv_heads, head_dim, head_dim ** -0.5, window or 0,
                                             held, num_splits, HAS_WINDOW=has_window, HAS_VISIBLE=has_visible,
                                             SPLIT=split, BLOCK_S=BLOCK_S, BLOCK_D=block_d, num_warps=4)
    _merge_kernel[(num_q_heads,)](acc, stats, positions, stats if sinks is None else sinks, out, head_dim,
                                  window or 0, held, num_splits, HAS_WINDOW=has_window, HAS_VISIBLE=has_visible,
                                  HAS_SINKS=sinks is not None, SPLIT=split, BLOCK_D=block_d, num_warps=1)
    return out


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor,
              window: int | None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """attention_ref's signature: one token through decode_attention (KV contiguous, as the state holds it),
    a prompt through the reference."""
    if q.shape[0] == 1 and k.is_contiguous() and v.is_contiguous():
        return decode_attention(q, k, v, q_positions, window, sinks=sinks)
    return attention_ref(q, k, v, q_positions, window, sinks=sinks)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """One query over the rows `visible` [1, S] keeps of k, v [S, Hkv, D] (a sparse attention's gathered picks)."""
    return decode_attention(q, k.contiguous(), v.contiguous(), None, None, visible=visible)


def masked_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    return attention_ref(q, k, v, torch.tensor([k.shape[0] - 1], device=q.device), visible=visible)
