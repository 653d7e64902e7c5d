"""Gated DeltaNet's one-token step and its gated RMS norm in plain torch (no Triton: the CPU app imports it): the
models' path (engine.model.deltanet, whose prompt form shares `prepare_heads`) and the reference of the fused decode
kernel (kernels/deltanet_decode.py).

  Hk / Hv = key / value heads (Hv a multiple of Hk), Dk / Dv = their dims, state S [Hv, Dk, Dv] float32
Per token (k, q L2-normalised, q scaled by Dk^-1/2, decay exp(g) in (0, 1], g and beta from the token's a and b:
decay_and_beta):
  S <- a * S;   S <- S + k (beta * (v - S^T k))^T;   o = S^T q
then o, rounded to the compute dtype, is RMS-normed over each head's Dv, times the norm weight and the gate's
activation (silu: Qwen3-Next / 3.5; silu or sigmoid: qwen4_exp).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .norms import rms_normalized

MAX_HEAD_DIM = 128          # the decode kernel keeps a head's [Dk, Dv] state in registers; wider heads keep torch
GATE_ACTIVATIONS = {"silu": F.silu, "sigmoid": torch.sigmoid}


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def decay_and_beta(a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """Per token and value head: log-decay g = -exp(A_log) * softplus(a + dt_bias) (<= 0, float32) and
    the write strength beta = sigmoid(b). a, b [T, Hv]."""
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias)
    return g, b.sigmoid()


def prepare_heads(q, k, v, g, beta):
    """[T, H*, D*] inputs -> float32 [Hv, T, D*] with k/q heads repeated per value head, q, k
    normalised and q scaled; g, beta [Hv, T]."""
    group = v.shape[1] // k.shape[1]
    if group > 1:
        q, k = q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)
    q, k, v = (t.transpose(0, 1).float().contiguous() for t in (q, k, v))
    q = l2norm(q) * q.shape[-1] ** -0.5
    k = l2norm(k)
    return q, k, v, g.transpose(0, 1).float(), beta.transpose(0, 1).float()


def recurrent_delta_step(q, k, v, g, beta, state: torch.Tensor) -> torch.Tensor:
    """One token. q, k [1, Hk, Dk]; v [1, Hv, Dv]; g, beta [1, Hv]; state [Hv, Dk, Dv] (in place).
    Returns o [1, Hv, Dv] in v's dtype."""
    out_dtype = v.dtype
    q, k, v, g, beta = prepare_heads(q, k, v, g, beta)
    q, k, v, g, beta = q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0]       # [Hv, D*], [Hv]
    state.mul_(g.exp()[:, None, None])
    remembered = (state * k[:, :, None]).sum(dim=1)                           # S^T k  [Hv, Dv]
    delta = (v - remembered) * beta[:, None]
    state.add_(k[:, :, None] * delta[:, None, :])
    out = (state * q[:, :, None]).sum(dim=1)                                  # S^T q  [Hv, Dv]
    return out[None].to(out_dtype)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                   activation: str = "silu") -> torch.Tensor:
    """RMSNorm over the last dim (plain weight, not 1 + w), then times the gate's activation (float32), rounded
    to x's dtype: the normed x rounded first, then times the weight in their common dtype."""
    return (weight * rms_normalized(x, eps).to(x.dtype) * GATE_ACTIVATIONS[activation](gate.float())).to(x.dtype)


def deltanet_decode_ref(q, k, v, a, b, a_log, dt_bias, state: torch.Tensor, gate: torch.Tensor | None = None,
                        weight: torch.Tensor | None = None, eps: float = 1e-6, activation: str = "silu") -> torch.Tensor:
    """One token's decay and write strength (a, b [1, Hv]; a_log, dt_bias [Hv]), its step (state in place), then
    with `gate` [1, Hv, Dv] and `weight` [Dv] the gated norm. Returns [1, Hv, Dv] in v's dtype."""
    g, beta = decay_and_beta(a, b, a_log, dt_bias)
    out = recurrent_delta_step(q, k, v, g, beta, state)
    return out if gate is None else gated_rms_norm(out, gate, weight, eps, activation)
