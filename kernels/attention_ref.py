"""Attention in plain torch (no Triton: the CPU app imports it): every family's attention and the references of
the one-token decode kernels (kernels/decode_attention.py, kernels/mla_decode.py). One core, `attend`: grouped KV
heads, a visibility mask (causal, sliding window, chunked, or the caller's own), a scale, and optionally a sink
logit per head; MLA's absorbed decode token has its own, `latent_attention`.

  T = query tokens, S = keys held (position s at row s), Hq / Hkv = query / kv heads, Dk / Dv = key / value width
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

QUERY_CHUNK = 256      # query rows a call: bounds the [Hq, rows, S] scores a long prompt materialises


def visible_keys(q_positions: torch.Tensor, num_keys: int, window: int | None = None,
                 chunk: int | None = None) -> torch.Tensor:
    """[T, S] bool: the query at position p sees key s when s <= p (and s > p - window with a sliding window; and
    s // chunk == p // chunk with chunked attention, Llama 4's: positions split into chunks that see only their own)."""
    key_positions = torch.arange(num_keys, device=q_positions.device)
    visible = key_positions[None, :] <= q_positions[:, None]
    if window:
        visible &= key_positions[None, :] > q_positions[:, None] - window
    if chunk:
        visible &= key_positions[None, :] // chunk == q_positions[:, None] // chunk
    return visible


def top_k_visible(scores: torch.Tensor, causal: torch.Tensor, top_k: int) -> torch.Tensor:
    """[T, S] bool: each query's top_k keys by scores [T, S] among those causal [T, S] lets it see (all of them
    where it sees fewer): a sparse attention's selection (DeepSeek's indexers). Static shapes, no host sync."""
    visible = torch.zeros_like(causal)
    if scores.shape[-1] == 0:
        return visible
    picked = scores.masked_fill(~causal, float("-inf")).topk(min(top_k, scores.shape[-1]), dim=-1).indices
    return visible.scatter_(-1, picked, True) & causal


def top_k_rows(scores: torch.Tensor, causal: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One query's top_k_visible as rows to gather: scores and causal [1, S] -> the rows of its top_k visible keys
    [K] (K = min(top_k, S)) and which of them count [1, K] (where it sees fewer than top_k the topk picks masked
    rows too). A CUDA graph's step over a static state gathers these, reading K rows, not S."""
    rows = scores.masked_fill(~causal, float("-inf")).topk(min(top_k, scores.shape[-1]), dim=-1).indices[0]
    return rows, causal[:, rows]


def masked_softmax(scores: torch.Tensor, visible: torch.Tensor, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """scores [H, T, S], visible [T, S] -> probabilities [H, T, S]. Without sinks in float32; with a sink logit
    per head (sinks [H]: one more column, dropped after the softmax, so a row may sum to less than one) in the
    scores' dtype, after subtracting the row's max, as gpt-oss and DeepSeek-V4 compute it."""
    scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
    if sinks is None:
        return torch.softmax(scores, dim=-1, dtype=torch.float32)
    sink = sinks.to(scores.dtype).view(-1, 1, 1).expand(-1, scores.shape[1], 1)            # [H, T, 1]
    logits = torch.cat([scores, sink], dim=-1)
    logits = logits - logits.amax(dim=-1, keepdim=True)
    return torch.softmax(logits, dim=-1, dtype=logits.dtype)[..., :-1]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float,
           sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, Hq, Dk], k [S, Hkv, Dk], v [S, Hkv, Dv], visible [T, S] -> [T, Hq * Dv] (a query head reads kv
    head h // (Hq / Hkv))."""
    shared = k.shape[1] == 1 < q.shape[1]       # one K/V head for all (DeepSeek-V4): plain matmuls, no copies
    if shared:
        scores = torch.matmul(q.transpose(0, 1), k[:, 0].T)                              # [Hq, T, S]
    else:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)       # [S, Hq, D]
        scores = torch.einsum("thd,shd->hts", q, k)
    probs = masked_softmax(scores * scale, visible, sinks).to(v.dtype)
    out = torch.matmul(probs, v[:, 0]).transpose(0, 1) if shared else torch.einsum("hts,shd->thd", probs, v)
    return out.reshape(q.shape[0], -1)


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor,
                  window: int | None = None, *, scale: float | None = None,
                  sinks: torch.Tensor | None = None, chunk: int | None = None,
                  visible: torch.Tensor | None = None) -> torch.Tensor:
    """Causal (optionally sliding-window or chunked) attention of the queries at q_positions [T] -> [T, Hq * Dv].
    `scale` defaults to Dk^-0.5; `sinks` [Hq]: a sink logit per head (masked_softmax); `visible` [T, S]: the keys
    each query sees, where the caller chose them (a sparse attention's selection), instead of the causal mask."""
    if q.is_cuda and sinks is None:
        return _fused_attention(q, k, v, q_positions, window, scale, chunk, visible)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    outs = [attend(q[rows], k, v, visible_keys(q_positions[rows], k.shape[0], window, chunk) if visible is None
                   else visible[rows], scale, sinks)
            for rows in (slice(r, r + QUERY_CHUNK) for r in range(0, q.shape[0], QUERY_CHUNK))]
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def latent_attention(q_latent: torch.Tensor, q_rope: torch.Tensor, kv_latent: torch.Tensor, k_rope: torch.Tensor,
                     visible: torch.Tensor, scale: float) -> torch.Tensor:
    """MLA's one decode token in the latent space (engine/model/mla.py folds kv_b_proj into the query before and
    applies its value half after): every head attends over the one shared latent KV.
    q_latent [H, r], q_rope [H, dr], kv_latent [S, r], k_rope [S, dr], visible [1, S] -> [H, r] in q's dtype."""
    scores = (q_latent @ kv_latent.T + q_rope @ k_rope.T).float() * scale                # [H, S]
    probs = masked_softmax(scores[:, None, :], visible)[:, 0].to(q_latent.dtype)
    return probs @ kv_latent


def mla_decode_ref(q_latent: torch.Tensor, q_rope: torch.Tensor, kv_latent: torch.Tensor, k_rope: torch.Tensor,
                   q_positions: torch.Tensor, scale: float) -> torch.Tensor:
    """kernels/mla_decode.py's reference: latent_attention over the keys 0..position (q_positions [1])."""
    return latent_attention(q_latent, q_rope, kv_latent, k_rope, visible_keys(q_positions, kv_latent.shape[0]), scale)


def _fused_attention(q, k, v, q_positions, window, scale, chunk=None, visible=None) -> torch.Tensor:
    """The CUDA path: SDPA never materialises the [Hq, T, S] scores (scale None: its own Dk^-0.5)."""
    num_tokens, num_q_heads = q.shape[0], q.shape[1]
    group = num_q_heads // k.shape[1]
    # Prompts expand grouped KV heads first (SDPA with enable_gqa may take the math kernel); one decode token
    # (the CUDA-graphed step) keeps enable_gqa: its scores are one row.
    if num_tokens > 1 and group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    # 4-D [1, heads, tokens, D]: with 3-D inputs SDPA silently takes the math kernel, which materialises the scores
    qt, kt, vt = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    gqa = k.shape[1] != num_q_heads
    if num_tokens == k.shape[0] and not window and not chunk and visible is None:   # a prompt from 0: flash, no mask
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        mask = visible_keys(q_positions, k.shape[0], window, chunk) if visible is None else visible
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale, enable_gqa=gqa)  # [1, Hq, T, Dv]
    return out[0].transpose(0, 1).reshape(num_tokens, -1)
