"""Byte layout of one expert block in experts.bin: gate, up and down (each in its quant format; no gate
for ungated experts, Nemotron-H's), then the expert biases for families that have them (gpt-oss), every
field 256-byte aligned, the block padded to 4096 bytes so one O_DIRECT read fetches it. The offsets come
from kernels/formats.py."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.formats import block_fields, is_gated

from engine.format.quant import part_specs

from engine.model.families import FAMILIES

# their blocks carry gate/up/down bias fields (the family descriptors' has_expert_bias)
FAMILIES_WITH_EXPERT_BIAS = tuple(name for name, family in FAMILIES.items() if family.has_expert_bias)
BLOCK_ALIGN = 4096
FIELD_ALIGN = 256


def round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


@dataclass(frozen=True)
class Field:
    name: str            # e.g. "gate.w", "down.scale"
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int          # bytes from the block start
    nbytes: int


@dataclass(frozen=True)
class Layout:
    fmt: str
    intermediate: int
    hidden: int
    fields: tuple[Field, ...]
    block_bytes: int

    @property
    def has_bias(self) -> bool:
        return any(f.name.endswith("_bias.b") for f in self.fields)

    @property
    def is_gated(self) -> bool:
        """Whether the block holds a gate projection (ungated experts: up and down alone)."""
        return is_gated(f.name for f in self.fields)

    def field(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)

    def views(self, block: torch.Tensor) -> dict[str, torch.Tensor]:
        """Typed zero-copy views into one block (a uint8 tensor of block_bytes)."""
        return {f.name: block[f.offset:f.offset + f.nbytes].view(f.dtype).view(f.shape) for f in self.fields}

    def parts(self, block: torch.Tensor) -> dict[str, dict[str, torch.Tensor]]:
        """The views grouped by projection: {"gate": {"w": ..., "scale": ...}, ..., "gate_bias": {"b": ...}}."""
        grouped: dict[str, dict[str, torch.Tensor]] = {}
        for name, view in self.views(block).items():
            proj, part = name.split(".")
            grouped.setdefault(proj, {})[part] = view
        return grouped

    def pack(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        """Named parts ("gate.w", ...) -> one zero-padded uint8 block."""
        block = torch.zeros(self.block_bytes, dtype=torch.uint8)
        for f in self.fields:
            src = parts[f.name].contiguous().view(-1).view(torch.uint8)
            block[f.offset:f.offset + f.nbytes] = src
        return block


def block_layout(intermediate: int, hidden: int, fmt: str, bias: bool = False, gated: bool = True) -> Layout:
    part_specs(fmt, intermediate, hidden)          # a clear sentence for an unknown format or width
    part_specs(fmt, hidden, intermediate)
    fields = tuple(Field(name, dtype, shape, offset, torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size())
                   for name, dtype, shape, offset in block_fields(fmt, intermediate, hidden, bias, FIELD_ALIGN, gated))
    end = fields[-1].offset + fields[-1].nbytes
    return Layout(fmt, intermediate, hidden, fields, round_up(end, BLOCK_ALIGN))
