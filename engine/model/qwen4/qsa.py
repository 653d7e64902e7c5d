"""QSA indexed attention: gated GQA (engine.model.families.hybrid.GatedAttention) where each query sees only
the tokens a small indexer selects.

The indexer keeps one raw key per token [Di]. Complete blocks of R consecutive keys are mean-pooled,
normalised (1 + w) and rotated at the block's first position; a query (its own Hi heads, normalised and
rotated) scores block b as sum_h relu(q_h . k_b) / sqrt(Di), keeps the best budget / R blocks, and sees their
tokens plus the tokens after the last complete block (its own included). Selection is per query, each query
ranking the blocks complete at its position, as the reference ranks them (torch.topk over that many scores).
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

    def state_specs(self) -> dict[str, StateSpec]:
        return {**super().state_specs(), "index_k": StateSpec((self.index_dim,))}

    def __call__(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        # T = tokens, Hq / Hkv = query / kv heads, D = head dim, S = positions held
        if step.start is None:
            raise RuntimeError("QSA selects keys on host-known positions (no CUDA graphs).")
        visible = self._select(x, step)                                                  # [T, S] bool
        q, gate = linear(x, *self.q).view(-1, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        k = linear(x, *self.k).view(-1, self.num_kv_heads, self.head_dim)
        v = linear(x, *self.v).view(-1, self.num_kv_heads, self.head_dim)
        q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = self.rope.cos_sin(step)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)                         # the first R dims rotate
        keys = step.state.append(self.layer, "k", step.positions, step.start, k)
        values = step.state.append(self.layer, "v", step.positions, step.start, v)
        out = masked_attention(q, keys, values, visible)                                 # [T, Hq * D]
        return linear(out * torch.sigmoid(gate.reshape(out.shape)), *self.o)

    def _select(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        """Which held positions each of the step's queries sees: [T, S] bool."""
        num_tokens, di, r = x.shape[0], self.index_dim, self.ratio
        q, raw_k = linear(x, self.index_qk).split([self.index_heads * di, di], dim=-1)
        q = self.index_q_norm(q.reshape(num_tokens, self.index_heads, di))
        q = apply_rope(q, *self.rope.cos_sin(step))                                    # [T, Hi, Di]
        keys = step.state.append(self.layer, "index_k", step.positions, step.start, raw_k)    # [S, Di]
        held = keys.shape[0]
        blocks = held // r
        pooled = keys[:blocks * r].view(blocks, r, di).float().mean(dim=1).to(keys.dtype)
        starts = torch.arange(0, blocks * r, r, device=x.device)
        cos, sin = rope_cos_sin(starts, self.rope.inv_freq, self.rope.scaling, self.rope.dtype)
        block_keys = apply_rope(self.index_k_norm(pooled)[:, None], cos, sin)[:, 0]
        scores = torch.matmul(q.float(), block_keys.float().T).transpose(-1, -2)          # [T, B, Hi]
        scores = torch.relu(scores).sum(dim=-1) / math.sqrt(di)                          # [T, B]
        visible = torch.zeros(num_tokens, held, dtype=torch.bool, device=x.device)
        for t in range(num_tokens):
            position = step.start + t
            complete = (position + 1) // r
            visible[t, complete * r:position + 1] = True                                 # the open block's tail
            if complete:
                chosen = scores[t, :complete].topk(min(self.max_blocks, complete)).indices
                token_ids = (chosen[:, None] * r + torch.arange(r, device=x.device)).flatten()
                visible[t, token_ids] = True
        return visible


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """q [T, Hq, D]; k, v [S, Hkv, D]; visible [T, S] -> [T, Hq * D] (grouped KV heads)."""
    num_tokens, num_heads, head_dim = q.shape
    group = num_heads // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)          # [S, Hq, D]
    if q.is_cuda:
        qt, kt, vt = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=visible)             # [1, Hq, T, D]
        return out[0].transpose(0, 1).reshape(num_tokens, num_heads * head_dim)
    scores = torch.einsum("thd,shd->hts", q, k) * head_dim ** -0.5                      # [Hq, T, S]
    scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.einsum("hts,shd->thd", probs, v).reshape(num_tokens, num_heads * head_dim)
