"""Mamba-2 math (Nemotron-H's mixer layers), plain torch.

A Mamba-2 layer keeps two fixed-size states per conversation instead of a KV cache:
  conv state  [C, K-1]     the last K-1 inputs of its short causal depthwise convolution (C: x, B and C together)
  ssm state   [Hs, P, N]   float32: per head a P x N memory
Per token t and head h, with dt = softplus(dt_raw + dt_bias) > 0 and A = -exp(A_log) < 0 (B_t, C_t [N] shared by
the heads of a group):
  S <- exp(dt A) S + dt x_t B_t^T;   y_t = S C_t + D x_t
Prefill computes this a chunk of tokens at a time (SSD: an attention-like masked product within a chunk, the states
carried across chunks); one-token decode runs the step above in place, with static shapes and no host sync, so it
can be captured in a CUDA graph. Both forms are the ones transformers' torch path uses, so they round alike; as
there, prefill clamps dt to at least time_step_min and decode does not.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.norms import rms_normalized


def time_steps(dt: torch.Tensor, dt_bias: torch.Tensor, floor: float | None = None) -> torch.Tensor:
    """dt [T, Hs] -> softplus(dt + dt_bias), at least `floor` where given (prefill)."""
    dt = F.softplus(dt + dt_bias.to(dt.dtype))
    return dt if floor is None else dt.clamp(min=floor)


def segment_sums(a: torch.Tensor) -> torch.Tensor:
    """a [..., L] -> [..., L, L]: out[i, j] = a[j+1] + ... + a[i] for j <= i (0 on the diagonal), -inf above.
    Masked cumulative sums rather than differences of one cumulative sum: no cancellation."""
    length = a.shape[-1]
    ones = torch.ones(length, length, dtype=torch.bool, device=a.device)
    sums = a[..., None].expand(*a.shape, length).masked_fill(~ones.tril(-1), 0).cumsum(dim=-2)   # [i, j]: a[i] summed
    return sums.masked_fill(~ones.tril(), float("-inf"))


def _per_head(t: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
    """B or C with its groups repeated for the heads that share them (along `dim`), float32."""
    return t.float().repeat_interleave(heads // t.shape[dim], dim=dim)


def chunked_scan(x, dt, a, b, c, d, state: torch.Tensor, chunk: int) -> torch.Tensor:
    """T tokens. x [T, Hs, P]; dt [T, Hs] (time_steps, clamped); a [Hs] (A); b, c [T, G, N]; d [Hs];
    state [Hs, P, N] float32, updated in place. Returns y [T, Hs, P] float32."""
    # T = tokens, Hs = heads, P = head dim, N = state size; Q = chunks, L = chunk tokens
    num_tokens, heads, head_dim = x.shape
    x = x.float()
    b, c = _per_head(b, heads, 1), _per_head(c, heads, 1)                 # [T, Hs, N]
    skip = d[:, None] * x                                                  # D x
    x = x * dt[..., None].float()
    da = a.float() * dt.float()                                            # [T, Hs]: log decay per token
    pad = (chunk - num_tokens % chunk) % chunk
    x, b, c, da = (F.pad(t, (0, 0) * (t.dim() - 1) + (0, pad)).reshape(-1, chunk, *t.shape[1:]) for t in (x, b, c, da))
    da = da.permute(2, 0, 1)                                               # [Hs, Q, L]
    cum = da.cumsum(dim=-1)                                                # log decay from the chunk's start
    # within a chunk: y_l = sum over s <= l of (C_l . B_s) exp(cum_l - cum_s) dt_s x_s
    weights = torch.einsum("qlhn,qshn->qlsh", c, b) * segment_sums(da).exp().permute(1, 2, 3, 0)
    y_diag = torch.einsum("qlsh,qshp->qlhp", weights, x)                  # [Q, L, Hs, P]
    # each chunk's own contribution to the state at its end
    to_end = (cum[..., -1:] - cum).exp().permute(1, 2, 0)                  # [Q, L, Hs]
    states = torch.einsum("qlhn,qlhp->qhpn", b * to_end[..., None], x)    # [Q, Hs, P, N]
    # across chunks: the state at each chunk's start (the carried one first), then at the end
    states = torch.cat([state[None].float(), states])                      # [Q+1, Hs, P, N]
    carry = segment_sums(F.pad(cum[..., -1], (1, 0))).exp()                # [Hs, Q+1, Q+1]: to chunk i from j
    states = torch.einsum("hiz,zhpn->ihpn", carry, states)
    state.copy_(states[-1])
    y_off = torch.einsum("qlhn,qhpn->qlhp", c, states[:-1]) * cum.exp().permute(1, 2, 0)[..., None]
    return (y_diag + y_off).reshape(-1, heads, head_dim)[:num_tokens] + skip


def recurrent_step(x, dt, a, b, c, d, state: torch.Tensor) -> torch.Tensor:
    """One token. x [1, Hs, P]; dt [1, Hs] (time_steps); a [Hs]; b, c [1, G, N]; d [Hs]; state [Hs, P, N] float32,
    updated in place. Returns y [1, Hs, P] in x's dtype."""
    x1, dt1 = x[0], dt[0]                                                  # [Hs, P], [Hs]
    heads = x1.shape[0]
    b1, c1 = b[0].repeat_interleave(heads // b.shape[1], dim=0), c[0].repeat_interleave(heads // c.shape[1], dim=0)
    state.mul_(torch.exp(dt1.float() * a.float())[:, None, None])
    state.add_((dt1[:, None, None] * b1[:, None, :] * x1[..., None]).to(state.dtype))    # dt B x^T  [Hs, P, N]
    y = torch.bmm(state.to(c1.dtype), c1[:, :, None])[..., 0]                            # S C  [Hs, P]
    return (y + x1 * d[:, None]).to(x.dtype)[None]


def gated_group_rms_norm(y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, groups: int,
                         eps: float) -> torch.Tensor:
    """y * silu(z) [T, W] normalised within each of `groups` equal slices (float32), rounded to y's dtype, times
    weight [W]: the gate applied before the norm."""
    gated = y.float() * F.silu(z.float())
    normed = rms_normalized(gated.view(*gated.shape[:-1], groups, -1), eps).view(gated.shape)
    return weight * normed.to(y.dtype)
