"""Plain-torch building blocks shared by the model families (tensor in, tensor out)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.runtime.switches import env_int
from kernels.cpu_linear import dequantized, packed_linear
from kernels.norms import rms_norm_ref


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    kernel = _norm_kernel(x, weight) if x.is_cuda else None
    return (kernel or rms_norm_ref)(x, weight, eps)


_NORM_KERNELS: dict[tuple, object] = {}


def _norm_kernel(x: torch.Tensor, weight: torch.Tensor):
    """kernels/rms_norm.py for this row width and these dtypes on this GPU (SLUICE_NORM_KERNEL=1), checked at
    its first use outside a CUDA graph's capture (the graphs' warm-up runs each piece first); None: torch's."""
    if env_int("SLUICE_NORM_KERNEL") != 1:
        return None
    key = (x.shape[-1], x.dtype, weight.dtype, x.device)
    if key not in _NORM_KERNELS:
        from kernels.rms_norm import MAX_N
        if x.shape[-1] > MAX_N or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
            return None
        from kernels.selfcheck import select_rms_norm
        _NORM_KERNELS[key] = select_rms_norm(*key)[0]
    return _NORM_KERNELS[key]


class Packed:
    """A quantised [out, in] weight left in its block's format: `linear` multiplies by it without a
    dequantised copy (the CPU computing experts where they sit in the RAM cache; int8 dense weights).
    `kernel`: a GPU kernel verified on this weight's shape (kernels.int8_linear)."""

    def __init__(self, parts: dict[str, torch.Tensor], fmt: str, dtype: torch.dtype | None = None):
        self.parts, self.fmt = parts, fmt
        self.dtype = dtype          # the compute dtype it was quantised from (rows gathered come back in it)
        self.kernel = None
        self.views: list[Packed] = []   # row blocks multiplied on their own (row_groups): kernels chosen for them too

    @property
    def shape(self) -> torch.Size:
        return self.parts["w"].shape

    def to(self, device) -> "Packed":
        return Packed({k: t.to(device) for k, t in self.parts.items()}, self.fmt, self.dtype)

    def row_groups(self, groups: int) -> list["Packed"]:
        """`groups` equal blocks of rows, as views (each row keeps its scale): a grouped projection
        multiplies each group's input by its block."""
        rows = self.shape[0] // groups
        self.views = [Packed({k: t[g * rows:(g + 1) * rows] for k, t in self.parts.items()}, self.fmt, self.dtype)
                      for g in range(groups)]
        return self.views


def linear(x: torch.Tensor, weight: torch.Tensor | Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    if isinstance(weight, Packed):
        if weight.kernel is not None:
            y = weight.kernel(x, weight.parts["w"], weight.parts["scale"])
        else:
            y = packed_linear(x, weight.parts, weight.fmt)
        return y if bias is None else y + bias
    return F.linear(x, weight, bias)


def embedding(token_ids: torch.Tensor, table: torch.Tensor | Packed) -> torch.Tensor:
    """Rows of an embedding table; an int8 table's rows dequantised as its whole would be."""
    if isinstance(table, Packed):
        rows = F.embedding(token_ids.reshape(-1), table.parts["w"])                   # [T, H] codes
        return dequantized(rows, table.parts["scale"][token_ids.reshape(-1)], table.dtype).reshape(*token_ids.shape, -1)
    return F.embedding(token_ids, table)


def swiglu_mlp(x: torch.Tensor, gate, up, down) -> torch.Tensor:
    return linear(F.silu(linear(x, gate)) * linear(x, up), down)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype):
    # positions [T] -> cos, sin [T, 1, D] (broadcast over heads)
    freqs = positions[:, None].float() * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(dtype)[:, None, :], (emb.sin() * scaling).to(dtype)[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [T, heads, D]; cos, sin [T, 1, R]: the first R dims rotate in halves, the rest pass through
    # (partial rotary: GLM-4.5, MiniMax-M2)
    rotary = cos.shape[-1]
    if rotary < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rotary], cos, sin), x[..., rotary:]), dim=-1)
    half = rotary // 2
    rotated = torch.cat((x[..., half:] * -1, x[..., :half]), dim=-1)       # * -1 is neg's value without its module
    return x * cos + rotated * sin


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor,
              window: int | None) -> torch.Tensor:
    """Causal (optionally sliding-window) attention with grouped KV heads.

    q [T, Hq, D]; k, v [S, Hkv, D] hold positions 0..S-1; q_positions [T]. Returns [T, Hq * D].
    """
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    if q.is_cuda:
        # Fused attention: never materialises the [Hq, T, S] scores. Prompts (T > 1) expand grouped KV
        # heads first (SDPA with enable_gqa may take the math kernel); one decode token (T = 1, the
        # CUDA-graphed step) keeps enable_gqa: its scores are one row.
        group = num_q_heads // k.shape[1]
        if q.shape[0] > 1 and group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        # 4-D [1, heads, tokens, D]: with 3-D inputs SDPA silently takes the math kernel, which
        # materialises the scores (measured: +0.37 GB at 2048 tokens on OLMoE, +1 GB on Qwen3-30B).
        qt, kt, vt = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        gqa = k.shape[1] != num_q_heads
        if q.shape[0] == k.shape[0] and not window:
            # A prompt from position 0: plain causal (flash kernel, no mask tensor at all).
            out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=gqa)
        else:
            key_positions = torch.arange(k.shape[0], device=q.device)
            visible = key_positions[None, :] <= q_positions[:, None]        # [T, S]
            if window:
                visible &= key_positions[None, :] > q_positions[:, None] - window
            out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=visible, enable_gqa=gqa)   # [Hq, T, D]
        return out[0].transpose(0, 1).reshape(q.shape[0], num_q_heads * head_dim)
    group = num_q_heads // k.shape[1]
    k = k.repeat_interleave(group, dim=1)                           # [S, Hq, D]
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) * head_dim ** -0.5  # [Hq, T, S]
    key_positions = torch.arange(k.shape[0], device=q.device)
    visible = key_positions[None, :] <= q_positions[:, None]        # [T, S]
    if window:
        visible &= key_positions[None, :] > q_positions[:, None] - window
    scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.einsum("hts,shd->thd", probs, v).reshape(q.shape[0], num_q_heads * head_dim)
