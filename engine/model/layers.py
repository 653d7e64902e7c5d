"""Plain-torch building blocks shared by the model families (tensor in, tensor out)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.runtime.switches import ATTN_KERNEL, NORM_KERNEL, ROPE_KERNEL, piece_on
from kernels.cpu_linear import dequantized, packed_linear
from kernels.attention_ref import attention_ref
from kernels.norms import MAX_N as MAX_NORM_WIDTH, rms_norm_ref
from kernels.rope_ref import apply_rope_ref as apply_rope, rope_pair_ref  # noqa: F401  (apply_rope: the MLA and hybrid mixers)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    kernel = None
    if x.is_cuda and x.shape[-1] <= MAX_NORM_WIDTH:
        key = ("rms_norm", x.shape[-1], x.dtype, weight.dtype, x.device)
        kernel = checked_kernel(NORM_KERNEL, key, lambda: _select("select_rms_norm", *key[1:]))
    return (kernel or rms_norm_ref)(x, weight, eps)


_CHECKED: dict[tuple, object] = {}


def checked_kernel(switch: str, key: tuple, select):
    """A model piece's GPU kernel for `key` (its shapes, dtypes, device) unless its switch is 0: chosen by
    `select` (a kernels.selfcheck check, its verdict cached per machine) at its first use outside a CUDA
    graph's capture (the graphs' warm-up runs each piece first); None: the torch path."""
    if not piece_on(switch):
        return None
    if key not in _CHECKED:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return None
        _CHECKED[key] = select()
    return _CHECKED[key]


def _select(name: str, *args):
    from kernels import selfcheck
    return getattr(selfcheck, name)(*args)[0]


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


def rope_pair(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """A step's queries [T, Hq, D] and keys [T, Hkv, D] rotated (kernels/rope_ref.py): on a GPU in one launch
    (kernels/rope.py) where it passed its check (SLUICE_ROPE_KERNEL=0: never)."""
    if q.is_cuda:
        key = ("rope", q.shape[1], k.shape[1], q.shape[2], cos.shape[-1], q.dtype, q.device)
        kernel = checked_kernel(ROPE_KERNEL, key, lambda: _select("select_rope", *key[1:]))
        if kernel is not None and cos.dtype == q.dtype == k.dtype:
            return kernel(q, k, cos, sin)
    return rope_pair_ref(q, k, cos, sin)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor,
              window: int | None) -> torch.Tensor:
    """Causal (optionally sliding-window) attention with grouped KV heads (kernels/attention_ref.py).
    One query token on a GPU: kernels/decode_attention.py where it passed its check (SLUICE_ATTN_KERNEL=0: never)."""
    if q.is_cuda and q.shape[0] == 1 and k.is_contiguous() and v.is_contiguous():
        key = ("decode_attention", q.shape[1], k.shape[1], q.shape[2], q.dtype, window, q.device)
        kernel = checked_kernel(ATTN_KERNEL, key, lambda: _select("select_decode_attention", *key[1:]))
        if kernel is not None:
            return kernel(q, k, v, q_positions, window)
    return attention_ref(q, k, v, q_positions, window)
