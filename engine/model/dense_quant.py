"""Dense weights as int8 (`dense_quant="int8"`, off by default): the attention and dense-MLP projections,
the head and the embedding table kept as int8 codes with one bf16 scale per output row, the int8
expert format's quantisation (engine.format.quant) of each weight in the compute dtype.

Why: a GPU's dense weights sit in VRAM for the whole run; as int8 they take half of it, and the slot
banks get the rest (OLMoE-1B-7B: ~0.45 GB, ~70 more expert slots at a 3.7 GiB budget), and a decode
step reads half the bytes from them. llama.cpp's Q8_0 quantises them too.

Quantised at load time, so every repacked model can use it and nothing on disk changes. Only the
weights a family multiplies through `layers.linear` (or gathers by row: the embedding) are quantised;
each family names them with a DENSE_INT8 pattern, and a family without one keeps its dense weights in
the compute dtype. The reference the tests compare with holds the same dequantised weights.
This module says which weights and how many bytes; the runner quantises them as it loads (runner.to_int8).
"""
from __future__ import annotations

import math
import re

import torch

from engine.errors import SluiceError
from engine.model.layers import Packed
from engine.model.model import EMBED_TABLE, table_in_file

DENSE_QUANTS = ("int8",)


def check(dense_quant: str | None, family: str) -> str | None:
    """The dense format asked for, or a SluiceError that says what to choose instead."""
    if dense_quant in (None, "", "none", "bf16"):
        return None
    if dense_quant not in DENSE_QUANTS:
        raise SluiceError(f"Unknown dense weight format '{dense_quant}': choose int8, or leave it out to keep "
                          f"the dense weights in the compute dtype.")
    if not available(family):
        raise SluiceError(f"int8 dense weights are not available for {family} models yet: leave the dense "
                          f"format out (they stay in the compute dtype).")
    return dense_quant


def available(family: str) -> bool:
    """Whether the family names weights int8 dense weights may quantise (its DENSE_INT8 pattern)."""
    return pattern(family) is not None


def pattern(family: str) -> re.Pattern | None:
    from engine.model.families import family_module
    regex = getattr(family_module(family), "DENSE_INT8", None)
    return re.compile(regex) if regex else None


def quantized_names(family: str, names) -> set[str]:
    """The dense tensors the family lets `dense_quant` turn into int8."""
    regex = pattern(family)
    return {n for n in names if regex is not None and regex.search(n)}


def take_rows(weight: torch.Tensor | Packed, rows: torch.Tensor) -> torch.Tensor | Packed:
    """Rows `rows` [n] of a dense weight [out, in] (a checkpoint's fused projection split at build time).
    An int8 weight's codes and row scales move together: each row is quantised on its own, so the rows
    taken are exactly what quantising them apart would give."""
    if isinstance(weight, Packed):
        return Packed({k: t.index_select(0, rows.to(t.device)) for k, t in weight.parts.items()}, weight.fmt, weight.dtype)
    return weight.index_select(0, rows.to(weight.device))


def nbytes(weight: torch.Tensor | Packed) -> int:
    if isinstance(weight, Packed):
        return sum(t.numel() * t.element_size() for t in weight.parts.values())
    return weight.numel() * weight.element_size()


_INTEGER_BYTES = {"I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}   # loaded as stored (DeepSeek-V4's tid2eid)


def planned_bytes(shapes: dict[str, list[int]], dtype: torch.dtype, family: str, dense_quant: str | None,
                  stored: dict[str, str] | None = None) -> int:
    """What the dense weights of these shapes take once loaded (the planner asks before loading): floats in
    the compute dtype (or int8 codes and row scales), integer tables as `stored` says they are stored; an
    embedding table read from the file takes nothing."""
    elem = torch.empty((), dtype=dtype).element_size()
    int8 = quantized_names(family, shapes) if dense_quant else set()
    in_file = {EMBED_TABLE} if table_in_file(family, tied="lm_head.weight" not in shapes) else set()
    stored = stored or {}
    return sum(math.prod(s) + 2 * s[0] if n in int8 else math.prod(s) * _INTEGER_BYTES.get(stored.get(n), elem)
               for n, s in shapes.items() if n not in in_file)
