"""Per-conversation model state: the KV cache and any other per-layer buffers a family declares.

Each block declares its buffers (`Block.state_specs()`): per-token ones (keys, values, an MLA
latent; or one row per block of tokens, QSA's pooled keys) grow with the conversation; fixed ones (a
recurrent state) have one shape. Static state
(`static=True`, the CUDA path) is allocated at full size up front and zeroed, so CUDA graphs keep
valid pointers and masked-out positions are never NaN garbage (0 * NaN = NaN); otherwise per-token
buffers start small and double as the conversation grows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StateSpec:
    shape: tuple[int, ...]       # per token (per_token=True) or of the whole buffer
    per_token: bool = True
    dtype: torch.dtype | None = None   # None: the compute dtype
    tokens_per_row: int = 1      # per-token buffers: one row per this many tokens (rows of the last one partial)

    def rows(self, tokens: int) -> int:
        return -(-tokens // self.tokens_per_row) if self.per_token else 1

    def nbytes(self, tokens: int, dtype: torch.dtype) -> int:
        count = torch.Size(self.shape).numel() * self.rows(tokens)
        return count * torch.empty((), dtype=self.dtype or dtype).element_size()


def state_bytes(specs: list[dict[str, StateSpec]], tokens: int, dtype: torch.dtype) -> int:
    """Bytes of the whole model state for a context of `tokens` (the budget's KV figure)."""
    return sum(s.nbytes(tokens, dtype) for layer in specs for s in layer.values())


class ModelState:
    def __init__(self, specs: list[dict[str, StateSpec]], max_tokens: int, dtype: torch.dtype,
                 device: torch.device, static: bool, initial_tokens: int = 256):
        self.specs, self.max_tokens, self.static = specs, max_tokens, static
        self._dtype, self._device = dtype, device
        first = max_tokens if static else min(initial_tokens, max_tokens)
        self.buffers = [{name: self._new(spec, spec.rows(first)) for name, spec in layer.items()} for layer in specs]

    def _new(self, spec: StateSpec, rows: int) -> torch.Tensor:
        shape = (rows, *spec.shape) if spec.per_token else spec.shape
        return torch.zeros(shape, dtype=spec.dtype or self._dtype, device=self._device)

    def reset(self) -> None:
        """A new conversation: fixed-size state starts from zero (per-token buffers are overwritten)."""
        for layer, specs in zip(self.buffers, self.specs):
            for name, spec in specs.items():
                if not spec.per_token:
                    layer[name].zero_()

    def append(self, layer: int, name: str, positions: torch.Tensor, start: int | None,
               values: torch.Tensor) -> torch.Tensor:
        """Write values [T, ...] at `positions` [T] (rows: positions // tokens_per_row where that is not 1); return
        the buffer up to the last one written (`start` known on the host), or the whole static buffer (inside a CUDA
        graph, start=None: attention masks what lies past the position)."""
        buf = self.buffers[layer][name]
        if start is None:
            buf.index_copy_(0, positions, values)
            return buf
        end = start + values.shape[0]
        if end > buf.shape[0]:
            spec = self.specs[layer][name]
            grown = self._new(spec, min(max(end, 2 * buf.shape[0]), spec.rows(self.max_tokens)))
            grown[:start] = buf[:start]
            self.buffers[layer][name] = buf = grown
        buf[start:end] = values
        return buf[:end]

    def fixed(self, layer: int, name: str) -> torch.Tensor:
        """A fixed-size buffer, read and updated in place by its block."""
        return self.buffers[layer][name]
