"""Gated DeltaNet's one decode token in one Triton launch (reference: kernels/deltanet_ref.deltanet_decode_ref, the
models' torch path).

  Hk / Hv = key / value heads, Dk / Dv = their dims (up to deltanet_ref.MAX_HEAD_DIM)
  q, k [1, Hk, Dk], v [1, Hv, Dv], a, b [1, Hv] (compute dtype), a_log, dt_bias [Hv], state [Hv, Dk, Dv] float32 (in
  place), optionally gate [1, Hv, Dv] and norm weight [Dv] -> [1, Hv, Dv] in v's dtype
One program a value head h: it forms its decay and write strength from a and b (deltanet_ref.decay_and_beta; softplus
as torch's, log1p(e) as log(1 + e) * e / ((1 + e) - 1)), reads key head h // (Hv / Hk), normalises q and k in
float32, keeps its [Dk, Dv] state tile in registers for the decay, the delta update and S^T q, writes the tile back
once, rounds o to the compute dtype as the torch path does, and with a gate RMS-norms o over Dv, times the weight and
the gate's activation (each rounding where torch rounds). One launch where the torch path runs ~40-50 small ops.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .deltanet_ref import MAX_HEAD_DIM, deltanet_decode_ref  # noqa: F401  (the kernel's reference, beside it)

KERNEL_VERSION = 2     # bump on any change to the kernel below: cached self-check verdicts are keyed on it


@triton.jit
def _softplus(x):
    """torch's softplus: x past 20, else log1p(exp(x)), log1p taken exactly enough where exp(x) is tiny."""
    e = tl.exp(x)
    u = 1.0 + e
    log1p = tl.where(u == 1.0, e, tl.log(u) * (e / (u - 1.0)))
    return tl.where(x > 20.0, x, log1p)


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, state_ptr, gate_ptr, w_ptr, out_ptr,
                   group, k_dim, v_dim, q_scale, inv_v_dim, eps, GATED: tl.constexpr, SIGMOID: tl.constexpr,
                   ROUND_PRODUCT: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    head = tl.program_id(0)
    key_head = head // group
    ks, vs = tl.arange(0, BLOCK_K), tl.arange(0, BLOCK_V)
    k_ok, v_ok = ks < k_dim, vs < v_dim
    out_type = out_ptr.dtype.element_ty
    q = tl.load(q_ptr + key_head * k_dim + ks, mask=k_ok, other=0.0).to(tl.float32)               # [BK]
    k = tl.load(k_ptr + key_head * k_dim + ks, mask=k_ok, other=0.0).to(tl.float32)
    q = q * tl.math.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * q_scale
    k = k * tl.math.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    v = tl.load(v_ptr + head * v_dim + vs, mask=v_ok, other=0.0).to(tl.float32)                   # [BV]
    a = tl.load(a_ptr + head).to(tl.float32) + tl.load(dt_bias_ptr + head).to(tl.float32)
    g = -tl.exp(tl.load(a_log_ptr + head).to(tl.float32)) * _softplus(a)
    b = tl.load(b_ptr + head)
    beta = (1.0 / (1.0 + tl.exp(-b.to(tl.float32)))).to(b.dtype).to(tl.float32)       # sigmoid in b's dtype
    tile = head.to(tl.int64) * k_dim * v_dim + ks[:, None] * v_dim + vs[None, :]
    tile_ok = k_ok[:, None] & v_ok[None, :]
    s = tl.load(state_ptr + tile, mask=tile_ok, other=0.0) * tl.exp(g)                           # [BK, BV]
    remembered = tl.sum(s * k[:, None], axis=0)                                                   # S^T k  [BV]
    delta = (v - remembered) * beta
    s = s + k[:, None] * delta[None, :]
    tl.store(state_ptr + tile, s, mask=tile_ok)
    o = tl.sum(s * q[:, None], axis=0).to(out_type).to(tl.float32)                               # S^T q  [BV]
    if GATED:
        o = (o * tl.math.rsqrt(tl.sum(o * o, axis=0) * inv_v_dim + eps)).to(out_type).to(tl.float32)
        o = o * tl.load(w_ptr + vs, mask=v_ok, other=0.0).to(tl.float32)
        if ROUND_PRODUCT:                    # weight and normed o both in the compute dtype: torch rounds their product
            o = o.to(out_type).to(tl.float32)
        z = tl.load(gate_ptr + head * v_dim + vs, mask=v_ok, other=0.0).to(tl.float32)
        if SIGMOID:
            o = o * (1.0 / (1.0 + tl.exp(-z)))
        else:
            o = o * (z / (1.0 + tl.exp(-z)))
    tl.store(out_ptr + head * v_dim + vs, o.to(out_type), mask=v_ok)


def deltanet_decode(q, k, v, a, b, a_log, dt_bias, state: torch.Tensor, gate: torch.Tensor | None = None,
                    weight: torch.Tensor | None = None, eps: float = 1e-6, activation: str = "silu") -> torch.Tensor:
    """deltanet_decode_ref's signature and values (state updated in place)."""
    (_, num_k_heads, k_dim), (_, num_v_heads, v_dim) = q.shape, v.shape
    assert state.dtype == torch.float32 and state.is_contiguous() and state.shape == (num_v_heads, k_dim, v_dim)
    assert k_dim <= MAX_HEAD_DIM and v_dim <= MAX_HEAD_DIM and activation in ("silu", "sigmoid")
    q, k, v, a, b, a_log, dt_bias = (t.contiguous() for t in (q, k, v, a, b, a_log, dt_bias))   # views already are
    out = torch.empty_like(v)
    gated = gate is not None
    if gated:
        gate, weight = gate.contiguous(), weight.contiguous()
    block_k, block_v = triton.next_power_of_2(k_dim), triton.next_power_of_2(v_dim)
    # ~32 state floats a thread: at 128 x 128, 16 warps of ~100 registers and no spills (sm_90 ptxas)
    _decode_kernel[(num_v_heads,)](
        q, k, v, a, b, a_log, dt_bias, state, gate if gated else v, weight if gated else v, out,
        num_v_heads // num_k_heads, k_dim, v_dim, k_dim ** -0.5, 1.0 / v_dim, eps, GATED=gated,
        SIGMOID=activation == "sigmoid", ROUND_PRODUCT=gated and torch.promote_types(weight.dtype, v.dtype) == v.dtype,
        BLOCK_K=block_k, BLOCK_V=block_v, num_warps=min(16, max(4, block_k * block_v // 1024)))
    return out
