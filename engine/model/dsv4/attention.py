"""DeepSeek-V4 attention: one shared K = V head of a large dim, sinks, a sliding window plus compressed
long-range entries (HCA: all closed windows; CSA: the indexer's top-k), grouped low-rank output.

T = tokens, h = query heads, D = head_dim, N = compressed entries, S = sliding keys.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from engine.model.dsv4.compressor import (CompressorBuffers, CompressorWeights, IndexerWeights, causal_entries,
                                          compress, indexer_rows, indexer_visible)
from engine.model.dsv4.norms import rms_norm, unweighted_rms_norm
from engine.model.dsv4.rope import apply_tail_rope
from engine.model.layers import Packed, linear
from kernels.attention_ref import attend

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"


@dataclass(frozen=True)
class AttentionWeights:
    q_a: torch.Tensor          # [q_lora, H]
    q_a_norm: torch.Tensor     # [q_lora] float32
    q_b: torch.Tensor          # [h * D, q_lora]
    kv: torch.Tensor           # [D, H]
    kv_norm: torch.Tensor      # [D] float32
    o_a: torch.Tensor          # [groups * o_lora, h * D / groups]
    o_b: torch.Tensor          # [H, groups * o_lora]
    sinks: torch.Tensor        # [h] float32
    o_groups: int
    compressor: CompressorWeights | None = None   # CSA / HCA layers
    indexer: IndexerWeights | None = None         # CSA layers
    o_a_groups: tuple[Packed, ...] | None = None   # int8 o_a: each group's rows (layers.Packed.row_groups)

    @property
    def head_dim(self) -> int:
        return self.kv.shape[0]


def project_query(h: torch.Tensor, w: AttentionWeights, eps: float, cos: torch.Tensor, sin: torch.Tensor):
    """h [T, H] -> q [T, h, D] (per-head unweighted norm, rope) and q_residual [T, q_lora] (the indexer's input)."""
    q_residual = rms_norm(linear(h, w.q_a), w.q_a_norm, eps)
    q = linear(q_residual, w.q_b).view(h.shape[0], -1, w.head_dim)
    return apply_tail_rope(unweighted_rms_norm(q, eps), cos, sin), q_residual


def project_kv(h: torch.Tensor, w: AttentionWeights, eps: float, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """h [T, H] -> the shared key/value [T, D]."""
    return apply_tail_rope(rms_norm(linear(h, w.kv), w.kv_norm, eps), cos, sin)


def project_output(o: torch.Tensor, w: AttentionWeights, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """o [T, h, D]: undo V's rope at the query position, then the grouped output projection -> [T, H]."""
    o = apply_tail_rope(o, cos, -sin)
    num_tokens, groups = o.shape[0], w.o_groups
    grouped = o.reshape(num_tokens, groups, -1).transpose(0, 1)                                # [g, T, hD/g]
    if w.o_a_groups is not None:           # int8: each group's input by its own rows
        mixed = torch.cat([linear(grouped[g], rows) for g, rows in enumerate(w.o_a_groups)], dim=-1)
        return linear(mixed, w.o_b)
    per_group = w.o_a.view(groups, -1, grouped.shape[-1]).transpose(1, 2)                     # [g, hD/g, o_lora]
    mixed = torch.bmm(grouped, per_group).transpose(0, 1).reshape(num_tokens, -1)             # [T, g * o_lora]
    return linear(mixed, w.o_b)


def sliding_visible(q_positions: torch.Tensor, key_positions: torch.Tensor, window: int) -> torch.Tensor:
    """[T, S]: causal and within the last `window` positions (the query's own included), none below 0."""
    q, k = q_positions[:, None], key_positions[None, :]
    return (k <= q) & (k > q - window) & (k >= 0)


@dataclass(frozen=True)
class LayerBuffers:
    """One layer's state for a step: where its shared keys go, and its compressors' buffers (CSA / HCA)."""
    # kv [T, D] -> the keys of every position so far [S, D] (position i at row i; static: the whole buffer)
    store_keys: Callable[[torch.Tensor], torch.Tensor]
    compressor: CompressorBuffers | None = None
    indexer: CompressorBuffers | None = None


QUERY_CHUNK = 256      # queries per attention call: scores stay [h, 256, window + 256 + entries]


def _compressed(h: torch.Tensor, q_residual: torch.Tensor, positions: torch.Tensor, start: int | None,
                w: AttentionWeights, kind: str, eps: float, rope: dict, b: LayerBuffers):
    """The compressed entries [N, D] and which of them each query sees [T, N] (HCA: all closed; CSA: top-k; in a
    graph's step CSA's top-k entries alone, gathered)."""
    inv_freq, scaling = rope["compress_tables"]
    entries = compress(h, positions, start, w.compressor, b.compressor, eps, inv_freq, scaling)
    if kind == HCA:
        return entries, causal_entries(positions, entries.shape[0], w.compressor.rate)
    index_keys = compress(h, positions, start, w.indexer.compressor, b.indexer, eps, inv_freq, scaling)
    if start is None:          # a graph's one token over every entry row the state holds: its top_k, gathered
        rows, visible = indexer_rows(q_residual, h, positions, index_keys, w.indexer, w.compressor.rate,
                                     *rope["compress"])
        return entries[rows], visible
    return entries, indexer_visible(q_residual, h, positions, index_keys, w.indexer, w.compressor.rate,
                                    *rope["compress"])


def attention(h: torch.Tensor, positions: torch.Tensor, start: int | None, w: AttentionWeights, b: LayerBuffers,
              kind: str, window: int, eps: float, rope: dict) -> torch.Tensor:
    """One layer's attention for the next T tokens h [T, H] at consecutive positions [T] (device; `start`, the
    first, on the host, or None inside a CUDA graph).

    Each chunk of queries gathers only its window's keys (by device positions: the same shapes at any
    position), so a decode step costs O(window + N) and a prompt O(T * (window + N)), not O(T^2).
    rope: {"main" | "compress": (cos, sin) [T, R/2]} at the tokens' positions, and "compress_tables":
    (inv_freq, scaling) for the compressed entries' own positions.
    """
    num_tokens = h.shape[0]
    cos, sin = rope["main"] if kind == SLIDING else rope["compress"]
    q, q_residual = project_query(h, w, eps, cos, sin)
    keys = b.store_keys(project_kv(h, w, eps, cos, sin))                                       # [S, D]
    entries = entry_visible = None
    if kind != SLIDING:
        entries, entry_visible = _compressed(h, q_residual, positions, start, w, kind, eps, rope, b)   # [N, D], [T, N]
    outs = []
    for first in range(0, num_tokens, QUERY_CHUNK):
        last = min(first + QUERY_CHUNK, num_tokens)
        key_positions = positions[first] - window + 1 + torch.arange(window - 1 + last - first, device=h.device)
        visible = sliding_visible(positions[first:last], key_positions, window)
        chunk_keys = keys.index_select(0, key_positions.clamp(min=0))                          # the chunk's keys
        if entries is not None:
            chunk_keys = torch.cat([chunk_keys, entries])
            visible = torch.cat([visible, entry_visible[first:last]], dim=1)
        shared = chunk_keys[:, None, :]                                                        # one K = V head
        outs.append(attend(q[first:last], shared, shared, visible, w.head_dim ** -0.5, w.sinks))   # [t, h * D]
    return project_output(torch.cat(outs).view(num_tokens, -1, w.head_dim), w, cos, sin)
