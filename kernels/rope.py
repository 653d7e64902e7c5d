"""A step's queries and keys rotated in one Triton launch (reference: kernels/rope_ref.rope_pair_ref, the
models' torch path).

  q [T, Hq, D], k [T, Hkv, D], cos / sin [T, 1, R] -> (q', k'), each head row by one program
The torch path launches five kernels a tensor (the negation, the cat, two products, the sum), ten a layer
for a decode token's few hundred values. The kernel rounds as torch does: each product to x's dtype, then
their sum, and never fuses a product into the sum (`enable_fp_fusion=False`: an FMA would round once, not
twice).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .rope_ref import rope_pair_ref  # noqa: F401  (the kernel's reference, beside it)

KERNEL_VERSION = 1     # bump on any change to the kernel below: cached self-check verdicts are keyed on it


@triton.jit
def _rope_kernel(q_ptr, k_ptr, q_out, k_out, cos_ptr, sin_ptr, Hq, Hkv, D, R, HALF, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    heads = Hq + Hkv
    token = pid // heads
    head = pid % heads
    if head < Hq:
        src = q_ptr + (token * Hq + head).to(tl.int64) * D
        dst = q_out + (token * Hq + head).to(tl.int64) * D
    else:
        src = k_ptr + (token * Hkv + head - Hq).to(tl.int64) * D
        dst = k_out + (token * Hkv + head - Hq).to(tl.int64) * D
    d = tl.arange(0, BLOCK)
    in_row = d < D
    rotates = d < R
    x = tl.load(src + d, mask=in_row, other=0.0)
    partner = tl.where(d < HALF, d + HALF, d - HALF)
    other = tl.load(src + partner, mask=rotates, other=0.0).to(tl.float32)
    rotated = tl.where(d < HALF, -other, other)                       # the negation is exact in float32
    cos = tl.load(cos_ptr + token * R + d, mask=rotates, other=1.0)
    sin = tl.load(sin_ptr + token * R + d, mask=rotates, other=0.0)
    kind = dst.dtype.element_ty
    a = (x.to(tl.float32) * cos.to(tl.float32)).to(kind)
    b = (rotated * sin.to(tl.float32)).to(kind)
    out = (a.to(tl.float32) + b.to(tl.float32)).to(kind)
    tl.store(dst + d, tl.where(rotates, out, x), mask=in_row)


def rope_pair(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    tokens, num_q, head_dim = q.shape
    num_kv, rotary = k.shape[1], cos.shape[-1]
    q, k = q.contiguous(), k.contiguous()
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    cos, sin = cos.reshape(tokens, rotary).contiguous(), sin.reshape(tokens, rotary).contiguous()
    _rope_kernel[(tokens * (num_q + num_kv),)](q, k, q_out, k_out, cos, sin, num_q, num_kv, head_dim, rotary,
                                                rotary // 2, BLOCK=triton.next_power_of_2(head_dim), num_warps=1,
                                                enable_fp_fusion=False)
    return q_out, k_out
