"""Compressed long-range KV entries of CSA / HCA layers, and the CSA Lightning Indexer.

A compressor turns every closed window of `rate` tokens into one entry of width D:
`rms_norm(sum_j softmax_j(gate_j + position_bias_j) * kv_j)`, rope'd at the window's first position.
HCA windows do not overlap. CSA ("overlap") projects to 2D: entry w pools the first half (Ca) of
window w-1 and the second half (Cb) of window w over 2 * rate slots (window 0: Cb only).

State between calls, in fixed shapes (so a decode step is a CUDA graph): a ring of the last `span`
projected rows (span = rate, or 2 * rate with overlap: the previous window's Ca too), row of position p
at p % span, and the entries, entry w at row w. A call pools each window its tokens touch, closed or
not, and writes them all: a window still open is rewritten when it closes, and no query sees an entry
before its window closed (causal_entries). Nothing depends on the position on the host (where it is
known and no window closes, the pooling is skipped), and a new conversation needs no reset: rows of
positions below 0 are masked, and stale rows are never read.

  T = tokens, W = projected width (D, or 2D with overlap), n = windows touched, N = entries held
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from engine.model.dsv4.norms import rms_norm
from engine.model.dsv4.rope import apply_tail_rope, rope_cos_sin
from kernels.attention_ref import top_k_rows, top_k_visible


@dataclass(frozen=True)
class CompressorWeights:
    kv: torch.Tensor              # [W, H], W = D (HCA) or 2D (CSA)
    gate: torch.Tensor            # [W, H]
    position_bias: torch.Tensor   # [rate, W] float32
    norm: torch.Tensor            # [D] float32
    overlap: bool                 # CSA's two overlapping series

    @property
    def rate(self) -> int:
        return self.position_bias.shape[0]

    @property
    def dim(self) -> int:
        return self.norm.shape[0]

    @property
    def span(self) -> int:
        """Positions one entry pools: its window, and with overlap the window before."""
        return 2 * self.rate if self.overlap else self.rate


@dataclass(frozen=True)
class CompressorBuffers:
    """One compressor's state: the ring of projected rows and the entries, with how to write the entries."""
    ring_kv: torch.Tensor         # [span, W]
    ring_gate: torch.Tensor       # [span, W]
    # (window ids [n], the first one on the host or None, entries [n, D]) -> every entry held [N, D]
    store: Callable[[torch.Tensor, int | None, torch.Tensor], torch.Tensor]


def _windows_touched(num_tokens: int, start: int | None, rate: int) -> int:
    """Windows that T consecutive tokens touch: exactly where the start is on the host, else at most (a decode
    step's one token touches one)."""
    if start is None:
        return -(-(num_tokens - 1) // rate) + 1
    return (start + num_tokens - 1) // rate - start // rate + 1


def _pooled_rows(kv: torch.Tensor, gate: torch.Tensor, positions: torch.Tensor, start: int | None,
                 w: CompressorWeights, b: CompressorBuffers) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rows each touched window pools -> window ids [n], kv [n, span, W], gate [n, span, W] (from the ring
    below the first position, from this call's rows above; rows past the last position are placeholders)."""
    num_tokens, rate, span = kv.shape[0], w.rate, w.span
    first = positions[0]
    window_ids = first // rate + torch.arange(_windows_touched(num_tokens, start, rate), device=kv.device)   # [n]
    pooled_positions = (window_ids[:, None] + 1) * rate - span + torch.arange(span, device=kv.device)   # [n, span]
    offset = pooled_positions - first
    source = torch.where(offset >= 0, span + offset.clamp(max=num_tokens - 1), pooled_positions.remainder(span))
    rows_kv = torch.cat([b.ring_kv, kv]).index_select(0, source.flatten()).view(*source.shape, -1)
    rows_gate = torch.cat([b.ring_gate, gate]).index_select(0, source.flatten()).view(*source.shape, -1)
    rows_gate = rows_gate.masked_fill((pooled_positions < 0)[..., None], float("-inf"))      # before position 0
    return window_ids, rows_kv, rows_gate


def _pool(kv_rows: torch.Tensor, gate_rows: torch.Tensor, w: CompressorWeights, eps: float) -> torch.Tensor:
    """kv, gate [n, span, W] -> the windows' normed pools [n, D]."""
    rate, dim, bias = w.rate, w.dim, w.position_bias
    if w.overlap:                                  # slots: the window before's Ca, then the window's Cb
        kv_rows = torch.cat([kv_rows[:, :rate, :dim], kv_rows[:, rate:, dim:]], dim=1)             # [n, 2 rate, D]
        gate_rows = torch.cat([gate_rows[:, :rate, :dim], gate_rows[:, rate:, dim:]], dim=1)
        bias = torch.cat([bias[:, :dim], bias[:, dim:]])                                           # [2 rate, D]
    weights = (gate_rows + bias).softmax(dim=1, dtype=torch.float32).to(kv_rows.dtype)
    return rms_norm((kv_rows * weights).sum(dim=1), w.norm, eps)


def _write_ring(kv: torch.Tensor, gate: torch.Tensor, positions: torch.Tensor, w: CompressorWeights,
                b: CompressorBuffers) -> None:
    keep = min(kv.shape[0], w.span)                                       # the last span rows (or fewer)
    ring_rows = positions[-keep:].remainder(w.span)
    b.ring_kv.index_copy_(0, ring_rows, kv[-keep:])
    b.ring_gate.index_copy_(0, ring_rows, gate[-keep:])


def compress(h: torch.Tensor, positions: torch.Tensor, start: int | None, w: CompressorWeights,
             b: CompressorBuffers, eps: float, inv_freq: torch.Tensor, rope_scaling: float) -> torch.Tensor:
    """Feed h [T, H] at positions [T] (consecutive; `start`, the first, on the host or None); return every
    entry held [N, D] (entry w valid once position (w + 1) * rate - 1 has been fed)."""
    kv, gate = F.linear(h, w.kv), F.linear(h, w.gate)                                  # [T, W]
    first_window = None if start is None else start // w.rate
    if first_window is not None and (start + kv.shape[0]) // w.rate == first_window:  # host position, none closes
        _write_ring(kv, gate, positions, w, b)                                         # (an eager step): no pooling
        return b.store(positions[:0], first_window, kv.new_empty((0, w.dim)))
    window_ids, kv_rows, gate_rows = _pooled_rows(kv, gate, positions, start, w, b)         # [n], [n, span, W] x2
    _write_ring(kv, gate, positions, w, b)                                             # after reading the ring
    pooled = _pool(kv_rows, gate_rows, w, eps)                                                     # [n, D]
    cos, sin = rope_cos_sin(window_ids * w.rate, inv_freq, rope_scaling, pooled.dtype)
    return b.store(window_ids, first_window, apply_tail_rope(pooled, cos, sin))


def causal_entries(q_positions: torch.Tensor, num_entries: int, rate: int) -> torch.Tensor:
    """[T, N] bool: query at position p may see entry w when its window closed, (w + 1) * rate <= p + 1."""
    entry_ids = torch.arange(num_entries, device=q_positions.device)
    return entry_ids[None, :] < ((q_positions + 1) // rate)[:, None]


@dataclass(frozen=True)
class IndexerWeights:
    compressor: CompressorWeights  # at index_head_dim, overlapping (CSA) windows
    q_b: torch.Tensor              # [index_heads * index_dim, q_lora_rank]
    weights_proj: torch.Tensor     # [index_heads, H]
    top_k: int


def indexer_visible(q_residual: torch.Tensor, h: torch.Tensor, q_positions: torch.Tensor, entries: torch.Tensor,
                    w: IndexerWeights, rate: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """[T, N] bool: the top_k causally valid entries per query by the indexer's score
    sum_h w_h * relu(q_h . k) (entries [N, Di] are the indexer's own compressed keys)."""
    scores = _indexer_scores(q_residual, h, entries, w, cos, sin)
    return top_k_visible(scores, causal_entries(q_positions, entries.shape[0], rate), w.top_k)


def indexer_rows(q_residual: torch.Tensor, h: torch.Tensor, q_position: torch.Tensor, entries: torch.Tensor,
                 w: IndexerWeights, rate: int, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A CUDA graph's one query over every entry row the static state holds: the rows of its top_k causally valid
    entries and which of them count (attention_ref.top_k_rows), so it reads top_k of them, not every row."""
    return top_k_rows(_indexer_scores(q_residual, h, entries, w, cos, sin),
                      causal_entries(q_position, entries.shape[0], rate), w.top_k)


def _indexer_scores(q_residual: torch.Tensor, h: torch.Tensor, entries: torch.Tensor, w: IndexerWeights,
                    cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """[T, N]: sum_h w_h * relu(q_h . k) of each query and entry."""
    num_tokens, index_dim = h.shape[0], w.compressor.dim
    num_heads = w.weights_proj.shape[0]
    q = apply_tail_rope(F.linear(q_residual, w.q_b).view(num_tokens, -1, index_dim), cos, sin)   # [T, h, Di]
    scores = F.relu(torch.matmul(q.float(), entries.float().T)) * index_dim ** -0.5               # [T, h, N]
    head_weights = F.linear(h, w.weights_proj).float() * num_heads ** -0.5                       # [T, h]
    return (scores * head_weights.unsqueeze(-1)).sum(dim=1)
