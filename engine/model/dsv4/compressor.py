"""Compressed long-range KV entries of CSA / HCA layers, and the CSA Lightning Indexer.

A compressor turns every closed window of `rate` tokens into one entry of width D:
`rms_norm(sum_j softmax_j(gate_j + position_bias_j) * kv_j)`, rope'd at the window's first position.
HCA windows do not overlap. CSA ("overlap") projects to 2D: entry w pools the first half (Ca) of
window w-1 and the second half (Cb) of window w over 2 * rate slots (window 0: Cb only).
State carried between calls: the rows of the unfinished window, the last closed window's Ca rows
(CSA) and the entries so far, exactly what the reference keeps in its cache.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.model.dsv4.norms import rms_norm
from engine.model.dsv4.rope import apply_tail_rope, rope_cos_sin
from kernels.attention_ref import top_k_visible


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


@dataclass
class CompressorState:
    pending_kv: torch.Tensor | None = None     # [< rate, W] rows of the unfinished window
    pending_gate: torch.Tensor | None = None
    prior_kv: torch.Tensor | None = None       # [rate, D] Ca rows of the last closed window (CSA)
    prior_gate: torch.Tensor | None = None
    entries: torch.Tensor | None = None        # [N, D]
    num_entries: int = 0
    extra: dict = field(default_factory=dict)  # the indexer's own compressor state (CSA)


def compress(h: torch.Tensor, w: CompressorWeights, state: CompressorState, eps: float,
             inv_freq: torch.Tensor, rope_scaling: float) -> torch.Tensor:
    """Feed h [T, H] (the next T tokens); return all entries so far [N, D]."""
    kv, gate = F.linear(h, w.kv), F.linear(h, w.gate)                          # [T, W]
    if state.pending_kv is not None:
        kv, gate = torch.cat([state.pending_kv, kv]), torch.cat([state.pending_gate, gate])
    rate, dim = w.rate, w.dim
    usable = kv.shape[0] // rate * rate
    state.pending_kv, state.pending_gate = kv[usable:], gate[usable:]
    if state.entries is None:
        state.entries = kv.new_zeros((0, dim))
    if usable == 0:
        return state.entries
    num_windows = usable // rate
    win_kv = kv[:usable].view(num_windows, rate, -1)                            # [n, rate, W]
    win_gate = gate[:usable].view(num_windows, rate, -1) + w.position_bias
    if w.overlap:
        slots_kv = win_kv.new_zeros((num_windows, 2 * rate, dim))              # [n, 2 rate, D]
        slots_gate = win_gate.new_full((num_windows, 2 * rate, dim), float("-inf"))
        slots_kv[:, rate:], slots_gate[:, rate:] = win_kv[..., dim:], win_gate[..., dim:]
        slots_kv[1:, :rate], slots_gate[1:, :rate] = win_kv[:-1, :, :dim], win_gate[:-1, :, :dim]
        if state.prior_kv is not None:
            slots_kv[0, :rate], slots_gate[0, :rate] = state.prior_kv, state.prior_gate
        state.prior_kv, state.prior_gate = win_kv[-1, :, :dim].clone(), win_gate[-1, :, :dim].clone()
        win_kv, win_gate = slots_kv, slots_gate
    pooled = (win_kv * win_gate.softmax(dim=1, dtype=torch.float32).to(win_kv.dtype)).sum(dim=1)
    pooled = rms_norm(pooled, w.norm, eps)                                      # [n, D]
    positions = torch.arange(num_windows, device=h.device) * rate + state.num_entries * rate
    cos, sin = rope_cos_sin(positions, inv_freq, rope_scaling, pooled.dtype)
    state.entries = torch.cat([state.entries, apply_tail_rope(pooled, cos, sin)])
    state.num_entries += num_windows
    return state.entries


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
    num_tokens, index_dim = h.shape[0], w.compressor.dim
    num_heads = w.weights_proj.shape[0]
    q = apply_tail_rope(F.linear(q_residual, w.q_b).view(num_tokens, -1, index_dim), cos, sin)   # [T, h, Di]
    scores = F.relu(torch.matmul(q.float(), entries.float().T)) * index_dim ** -0.5               # [T, h, N]
    head_weights = F.linear(h, w.weights_proj).float() * num_heads ** -0.5                       # [T, h]
    scores = (scores * head_weights.unsqueeze(-1)).sum(dim=1)                                     # [T, N]
    return top_k_visible(scores, causal_entries(q_positions, entries.shape[0], rate), w.top_k)
