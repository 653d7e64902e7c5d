"""Plain-torch building blocks shared by the model families (tensor in, tensor out). Nothing here chooses a
kernel: the pieces that hold one (a norm, a packed weight, a router, an attention) call it where it was attached
at load (engine/runtime/attach.py), else these."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.attention_ref import attention_ref as attention
from kernels.cpu_linear import dequantized, packed_linear
from kernels.norms import rms_norm_ref as rms_norm
from kernels.rope_ref import apply_rope_ref as apply_rope, rope_pair_ref as rope_pair

__all__ = ["Packed", "RmsNorm", "apply_rope", "attention", "embedding", "linear", "rms_norm", "rope_cos_sin",
           "rope_pair", "swiglu_mlp"]


class RmsNorm:
    """A norm's weight [N] and eps: x [..., N] -> rms_norm(x). `kernel`: a GPU kernel of rms_norm's signature,
    attached at load (engine/runtime/attach.py)."""

    def __init__(self, weight: torch.Tensor, eps: float):
        self.weight, self.eps = weight, eps
        self.kernel = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (self.kernel or rms_norm)(x, self.weight, self.eps)


class Packed:
    """A quantised [out, in] weight left in its block's format: `linear` multiplies by it without a
    dequantised copy (the CPU computing experts where they sit in the RAM cache; int8 dense weights).
    `kernel`: a GPU kernel checked on this weight's shape (kernels.int8_linear), attached at load."""

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
