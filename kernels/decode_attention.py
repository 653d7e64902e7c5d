"""One decode token's attention in one Triton launch (its reference: kernels/attention_ref.attention_ref).

  Hq / Hkv = query / kv heads (a query head reads kv head h // (Hq / Hkv)), D = head dim, S = positions held
  q [1, Hq, D], k, v [S, Hkv, D], q_positions [1] (on the device) -> [1, Hq * D]
One program a query head walks the keys it can see, 0..position (the last `window` of them with a sliding
window), in blocks, with an online softmax in float32, and never reads the rest of a static KV buffer: the
position is read on the device, so the kernel runs inside the decode step's CUDA graph. Why a kernel: the
torch path's masked `scaled_dot_product_attention` loads a CUDA module that holds 70 MiB of host memory for
the process's life (BENCHMARKS.md run 57). On by default since run 60 (SLUICE_ATTN_KERNEL=0: the torch path).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attention_ref import attention_ref  # noqa: F401  (the kernel's reference, beside it)

KERNEL_VERSION = 1     # bump on any change to the kernel below: cached self-check verdicts are keyed on it


@triton.jit
def _decode_attention_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, out_ptr, num_kv_heads, group, head_dim, scale, window,
                             HAS_WINDOW: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    head = tl.program_id(0)
    kv_head = head // group
    end = tl.load(pos_ptr).to(tl.int64) + 1                       # keys 0..position are visible
    if HAS_WINDOW:
        start = tl.maximum(end - window, 0)
    else:
        start = end * 0
    dims = tl.arange(0, BLOCK_D)
    d_ok = dims < head_dim
    q = tl.load(q_ptr + head * head_dim + dims, mask=d_ok, other=0.0).to(tl.float32)
    best = tl.max(tl.full([BLOCK_S], float("-inf"), tl.float32), axis=0)
    total = tl.sum(tl.zeros([BLOCK_S], dtype=tl.float32), axis=0)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s0 in range((start // BLOCK_S) * BLOCK_S, end, BLOCK_S):
        keys = s0 + tl.arange(0, BLOCK_S)
        s_ok = (keys >= start) & (keys < end)
        rows = (keys[:, None] * num_kv_heads + kv_head) * head_dim + dims[None, :]
        k = tl.load(k_ptr + rows, mask=s_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        scores = tl.where(s_ok, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))
        new_best = tl.maximum(best, tl.max(scores, axis=0))
        weights = tl.exp(scores - new_best)
        rescale = tl.exp(best - new_best)
        v = tl.load(v_ptr + rows, mask=s_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        total = total * rescale + tl.sum(weights, axis=0)
        acc = acc * rescale + tl.sum(weights[:, None] * v, axis=0)
        best = new_best
    tl.store(out_ptr + head * head_dim + dims, (acc / total).to(out_ptr.dtype.element_ty), mask=d_ok)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor,
                     window: int | None) -> torch.Tensor:
    """k and v as the state holds them (contiguous [S, Hkv, D]): the kernel indexes them by row."""
    _, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    out = torch.empty(1, num_q_heads * head_dim, dtype=q.dtype, device=q.device)
    _decode_attention_kernel[(num_q_heads,)](q.contiguous(), k, v, q_positions, out, num_kv_heads,
                                             num_q_heads // num_kv_heads, head_dim, head_dim ** -0.5,
                                             window or 0, HAS_WINDOW=bool(window), BLOCK_S=64,
                                             BLOCK_D=triton.next_power_of_2(head_dim), num_warps=4)
    return out
