"""A generic family's dense tensors (engine.model.generic) read as transformers' model holds them: renamed as the
family's loader renames them, and merged where its converters merge them (Kimi-Linear's q/k/v convolutions into
one), so the Sluice dir holds what the model loads by name."""
from __future__ import annotations

import torch

from engine.format.checkpoint import Checkpoint
from engine.model.generic.scan import dense_converters
from engine.model.spec import ModelSpec, canonical_dense_name


class GenericDense:
    """The checkpoint's dense tensors `names` (as stored) under the names transformers' model loads."""

    def __init__(self, spec: ModelSpec, names: list[str]):
        self.plain: dict[str, str] = {}                          # model name -> stored name
        self.merged: dict[str, tuple[object, dict[str, str]]] = {}   # model name -> (converter, {pattern: stored})
        converters = dense_converters(spec.family)
        for stored in names:
            name = canonical_dense_name(spec.family, stored)
            for converter in converters:
                target, pattern = converter.rename_source_key(name)
                if pattern is not None:
                    self.merged.setdefault(target, (converter, {}))[1][pattern] = stored
                    break
            else:
                self.plain[name] = stored

    def tensors(self, read) -> dict[str, torch.Tensor]:
        """name -> tensor; read(stored name) -> the stored tensor."""
        out = {name: read(stored) for name, stored in self.plain.items()}
        for name, (converter, sources) in self.merged.items():
            parts = {pattern: read(stored) for pattern, stored in sources.items()}
            for op in converter.operations:
                parts = op.convert(parts, source_patterns=converter.source_patterns,
                                   target_patterns=converter.target_patterns, full_layer_name=name)
            (out[name],) = parts.values()
        return out

    def shapes(self, ckpt: Checkpoint) -> dict[str, tuple[int, ...] | None]:
        """name -> shape (None for a merged tensor: known once merged)."""
        return {**{name: tuple(ckpt.logical_shape(stored)) for name, stored in self.plain.items()},
                **dict.fromkeys(self.merged)}
