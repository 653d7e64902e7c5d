"""QSA indexed attention: gated GQA (engine.model.families.hybrid.GatedAttention) where each query sees only
the tokens a small indexer selects.

The indexer keeps one raw key per token [Di]. Complete blocks of R consecutive keys are mean-pooled,
normalised (1 + w) and rotated at the block's first position; a query (its own Hi heads, normalised and
rotated) scores block b as sum_h relu(q_h . k_b) / sqrt(Di), keeps the best budget / R blocks, and sees their
tokens plus the tokens after the last complete block (its own included). Selection is per query, each query
ranking the blocks complete at its position, as the reference ranks them (torch.topk over those scores).

A block's key depends on its R raw keys alone, so it is computed once, by the step holding the block's last
token, and kept in the state ("index_blocks", one row per R tokens). A prompt's queries see a mask over the
positions held. A CUDA graph's one-token step holds the whole static state, every position the context may
reach: it gathers the rows of the budget / R blocks it picks and of its open block (budget + R positions, from
device values only) and attends over those, so a token reads the keys it sees, not the whole context's.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.model.block import Rope, Step
from engine.model.families.hybrid import GatedAttention, OffsetRmsNorm
from engine.model.layers import apply_rope, linear, rope_cos_sin
from engine.model.spec import ModelSpec
from engine.model.state import StateSpec
from kernels.attention_ref import top_k_rows


def index_specs(head_dim: int, ratio: int) -> dict[str, StateSpec]:
    """The indexer's state: each token's raw key and each complete block's pooled key (normed, rotated)."""
    return {"index_k": StateSpec((head_dim,)), "index_blocks": StateSpec((head_dim,), tokens_per_row=ratio)}


class IndexedAttention(GatedAttention):
    takes_kernels = False            # its own rope and masked attention over the selected keys (attach skips it)

    def __init__(self, layer: int, w: dict, prefix: str, spec: ModelSpec, rope: Rope, *, heads: int, head_dim: int,
                 budget: int, ratio: int):
        super().__init__(layer, w, prefix, spec, rope)
        self.index_heads, self.index_dim, self.ratio = heads, head_dim, ratio
        self.max_blocks = budget // ratio
        self.index_qk = w[prefix + "indexer.index_qk_proj.weight"]
        self.index_q_norm, self.index_k_norm = (OffsetRmsNorm(w[prefix + f"indexer.{n}_layernorm.weight"], spec.rms_eps)
                                                for n in "qk")
        self.masked_kernel = None    # kernels.decode_attention.masked_attention for a graph's step, attached at load

    def state_specs(self) -> dict[str, StateSpec]:
        return {**super().state_specs(), **index_specs(self.index_dim, self.ratio)}

    def __call__(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        # T = tokens, Hq / Hkv = query / kv heads, D = head dim, S = positions held, P = positions a graph's step sees
        scores = self._block_scores(x, step)                                             # [T, B]
        q, gate = linear(x, *self.q).view(-1, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        k = linear(x, *self.k).view(-1, self.num_kv_heads, self.head_dim)
        v = linear(x, *self.v).view(-1, self.num_kv_heads, self.head_dim)
        q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = self.rope.cos_sin(step)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)                         # the first R dims rotate
        keys = step.state.append(self.layer, "k", step.positions, step.start, k)
        values = step.state.append(self.layer, "v", step.positions, step.start, v)
        if step.start is None:                     # a graph's one-token step: the picked rows, gathered
            rows, visible = picked_rows(scores, step.positions, keys.shape[0], self.ratio, self.max_blocks)
            keys, values = keys[rows], values[rows]                                       # [P, Hkv, D]
        else:
            visible = selection(scores, step.positions, step.start, keys.shape[0], self.ratio, self.max_blocks)
        one_token = self.masked_kernel is not None and q.shape[0] == 1
        out = (self.masked_kernel if one_token else masked_attention)(q, keys, values, visible)   # [T, Hq * D]
        return linear(out * torch.sigmoid(gate.reshape(out.shape)), *self.o)

    def _block_scores(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        """The step's queries' scores of the blocks held: [T, B] (B = S // R; blocks not yet complete included)."""
        num_tokens, di = x.shape[0], self.index_dim
        q, raw_k = linear(x, self.index_qk).split([self.index_heads * di, di], dim=-1)
        q = self.index_q_norm(q.reshape(num_tokens, self.index_heads, di))
        q = apply_rope(q, *self.rope.cos_sin(step))                                    # [T, Hi, Di]
        keys = step.state.append(self.layer, "index_k", step.positions, step.start, raw_k)    # [S, Di]
        block_keys = self._commit_blocks(keys, step)[:keys.shape[0] // self.ratio]         # [B, Di]
        scores = torch.matmul(q.float(), block_keys.float().T).transpose(-1, -2)          # [T, B, Hi]
        return torch.relu(scores).sum(dim=-1) / math.sqrt(di)                            # [T, B]

    def _commit_blocks(self, keys: torch.Tensor, step: Step) -> torch.Tensor:
        """The keys of the blocks this step completes, pooled from keys [S, Di] into the state -> the block keys
        held [B, Di]. In a CUDA graph (start unknown) the step's own block is written every step: its row is
        masked until the block's last token writes it whole."""
        r = self.ratio
        if step.start is None:
            ends, first_row = step.positions, None
        else:
            first = (r - 1 - step.start) % r                      # the step's first token that ends a block
            ends, first_row = step.positions[first::r], (step.start + first) // r
        window = (ends[:, None] - r + 1 + torch.arange(r, device=ends.device)).clamp_min(0)     # [N, R]
        pooled = keys[window].float().mean(dim=1).to(keys.dtype)                          # [N, Di]
        cos, sin = rope_cos_sin(window[:, 0], self.rope.inv_freq, self.rope.scaling, self.rope.dtype)
        rotated = apply_rope(self.index_k_norm(pooled)[:, None], cos, sin)[:, 0]
        return step.state.append(self.layer, "index_blocks", ends // r, first_row, rotated)


def selection(scores: torch.Tensor, positions: torch.Tensor, start: int, held: int, ratio: int,
              max_blocks: int) -> torch.Tensor:
    """scores [T, B] of the blocks held, query positions [T] (from `start`) -> [T, S] bool (S = held): each
    query's best max_blocks blocks among those complete at its position, and its open block's tokens up to
    itself. The blocks are ranked by a topk over exactly those complete, per run of queries alike, as the
    reference ranks them (equal scores, e.g. every head's product negative, then fall alike)."""
    num_tokens, num_blocks = scores.shape
    complete = (positions + 1) // ratio                                                   # [T]
    chosen = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    for n in range(max((start + 1) // ratio, 1), (start + num_tokens) // ratio + 1):
        rows = slice(max(n * ratio - start - 1, 0), min((n + 1) * ratio - start - 1, num_tokens))   # complete == n
        picked = scores[rows, :n].topk(min(max_blocks, n), dim=-1).indices
        chosen[rows].scatter_(-1, picked, True)
    chosen = chosen[:, :, None].expand(num_tokens, num_blocks, ratio).reshape(num_tokens, num_blocks * ratio)
    key_positions = torch.arange(held, device=scores.device)
    tail = (key_positions[None, :] >= complete[:, None] * ratio) & (key_positions[None, :] <= positions[:, None])
    return tail | F.pad(chosen, (0, held - num_blocks * ratio))


def picked_rows(scores: torch.Tensor, position: torch.Tensor, held: int, ratio: int, max_blocks: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """A graph's one query: scores [1, B] of every block row held (those not complete masked; static shapes, no
    host sync), position [1] -> the rows it sees [P] (P = min(max_blocks, B) * R + R: its best blocks' tokens,
    then its open block's) and which of them count [1, P]. A block past those complete, picked where fewer are
    complete than max_blocks, and the open block's rows past the position do not count. One topk over every
    row: equal scores may fall otherwise than in the reference's topk over the complete ones alone."""
    complete = (position + 1) // ratio                                                    # [1]
    blocks = torch.arange(scores.shape[1], device=scores.device)
    picked, chosen = top_k_rows(scores, blocks[None, :] < complete, max_blocks)          # [M], [1, M]
    offsets = torch.arange(ratio, device=scores.device)
    rows = torch.cat([(picked[:, None] * ratio + offsets).flatten(), complete * ratio + offsets])      # [P]
    counts = torch.cat([chosen[0].repeat_interleave(ratio), complete * ratio + offsets <= position])
    return rows.clamp_max(held - 1), counts[None, :]


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """q [T, Hq, D]; k, v [S, Hkv, D]; visible [T, S] -> [T, Hq * D] (grouped KV heads)."""
    num_tokens, num_heads, head_dim = q.shape
    group = num_heads // k.shape[1]
    if q.is_cuda and num_tokens == 1:
        return _one_query_attention(q, k, v, visible)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)          # [S, Hq, D]
    if q.is_cuda:
        qt, kt, vt = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=visible)             # [1, Hq, T, D]
        return out[0].transpose(0, 1).reshape(num_tokens, num_heads * head_dim)
    scores = torch.einsum("thd,shd->hts", q, k) * head_dim ** -0.5                      # [Hq, T, S]
    scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.einsum("hts,shd->thd", probs, v).reshape(num_tokens, num_heads * head_dim)


def _one_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """A decode step's: each KV head's query heads as its query rows, so K and V (a graph's: every position
    held) are read in place, never repeated per query head. q [1, Hq, D]; k, v [S, Hkv, D]; visible [1, S]."""
    num_heads, head_dim, kv_heads = q.shape[1], q.shape[2], k.shape[1]
    group = num_heads // kv_heads
    qt = q.view(1, kv_heads, group, head_dim)                                             # [1, Hkv, G, D]
    kt, vt = (t.transpose(0, 1).unsqueeze(0) for t in (k, v))                              # [1, Hkv, S, D]
    mask = visible.expand(group, visible.shape[1])                                         # [G, S]
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)                     # [1, Hkv, G, D]
    return out.reshape(1, num_heads * head_dim)
