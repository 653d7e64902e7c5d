"""Gated DeltaNet math (Qwen3-Next, Qwen3.5-MoE linear-attention layers), plain torch.

A DeltaNet layer keeps two fixed-size states per conversation instead of a KV cache:
  conv state       [C, K-1]     the last K-1 inputs of the short causal depthwise convolution
  recurrent state  [Hv, Dk, Dv] float32: a fast-weight memory S, per value head
Per token t (k, q L2-normalised, q scaled by Dk^-1/2, decay a_t = exp(g_t) in (0, 1]):
  S <- a_t * S;   S <- S + k_t (beta_t * (v_t - S^T k_t))^T;   o_t = S^T q_t
Prefill computes the same recurrence a chunk of 64 tokens at a time (the UT transform turns the
chunk's delta updates into a triangular solve and a few matmuls); one-token decode runs the step
above in place, with static shapes and no host sync, so it can be captured in a CUDA graph. The
two forms are the ones the reference uses (its torch fallback), so they round the same way. The step
and the gated norm live in kernels/deltanet_ref.py, beside the Triton kernel that fuses them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.deltanet_ref import prepare_heads

CHUNK_TOKENS = 64


def causal_conv(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """Depthwise causal conv (+ bias) + SiLU over x [T, C] continuing from `state` [C, K-1] (updated in place).

    weight [C, K], bias [C] or None. The state holds the previous K-1 inputs (zeros at the start of a conversation).
    """
    window = torch.cat((state, x.transpose(0, 1).to(state.dtype)), dim=1)          # [C, K-1+T]
    state.copy_(window[:, window.shape[1] - state.shape[1]:])
    out = F.conv1d(window[None].to(weight.dtype), weight[:, None, :], bias, groups=weight.shape[0])   # [1, C, T]
    return F.silu(out[0]).transpose(0, 1).to(x.dtype)                                # [T, C]


def chunked_delta_rule(q, k, v, g, beta, state: torch.Tensor, chunk: int = CHUNK_TOKENS) -> torch.Tensor:
    """T tokens, a chunk at a time. Shapes as recurrent_delta_step with T tokens; state updated in
    place. Returns o [T, Hv, Dv] in v's dtype."""
    out_dtype, num_tokens = v.dtype, v.shape[0]
    q, k, v, g, beta = prepare_heads(q, k, v, g, beta)                        # [Hv, T, D*], [Hv, T]
    pad = (chunk - num_tokens % chunk) % chunk
    q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    heads, n = v.shape[0], (num_tokens + pad) // chunk
    # N = chunks, C = chunk tokens
    q, k, v = (t.reshape(heads, n, chunk, -1) for t in (q, k, v))            # [Hv, N, C, D*]
    beta, g = beta.reshape(heads, n, chunk), g.reshape(heads, n, chunk)
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    cum = g.cumsum(dim=-1)                                                    # log decay from chunk start
    future = torch.ones(chunk, chunk, dtype=torch.bool, device=v.device).triu(1)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(future, float("-inf")).exp()   # [Hv, N, C, C]
    # UT transform: (I + tril(diag(beta) K K^T * decay, -1)) is what the unit-triangular solve inverts.
    system = (k_beta @ k.transpose(-1, -2)) * decay
    values = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    k_cum = torch.linalg.solve_triangular(system, k_beta * cum.exp()[..., None], upper=False, unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * decay                                  # within-chunk q.k
    q = q * cum.exp()[..., None]
    k = k * (cum[..., -1:] - cum).exp()[..., None]
    chunk_decay = cum[..., -1].exp()[..., None, None]                         # [Hv, N, 1, 1]
    s = state.float()
    out = torch.empty_like(values)
    for i in range(n):
        v_new = values[:, i] - k_cum[:, i] @ s                                # what S does not predict yet
        out[:, i] = q[:, i] @ s + attn[:, i] @ v_new
        s = s * chunk_decay[:, i] + k[:, i].transpose(-1, -2) @ v_new
    state.copy_(s)
    return out.reshape(heads, -1, out.shape[-1])[:, :num_tokens].transpose(0, 1).to(out_dtype)
