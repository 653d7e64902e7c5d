"""Routed experts computed by the CPU straight from their RAM-cache blocks (hybrid execution).

The block stays in its stored format: `Packed` weights go through kernels.cpu_linear (torch's packed
int8 kernel for the int8 format), so nothing is dequantised or copied first. The decode thread
itself computes them, after it has enqueued the GPU's whole share of the layer (kernels, copies,
the next layer's prefetch), so both devices work at once; `add_into` adds the CPU's partial sum into
the layer's output, the one place the two devices' results meet. (A worker thread measured 4-6x
slower per expert on the H200 box: it waits for the GIL while the decode thread launches work. A pool
of 2-8 workers sharing the cores measured 267-391 us an expert against 235 us for the decode thread
alone (scripts/probe_cpu_experts.py), and 687-823 us while decoding: torch's int8 kernel is the limit.)
On CUDA the layer's input and routing weights reach the host through pinned rows copied before the
layer's host sync, so they cost no extra wait.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from engine.format.layout import Layout
from engine.model.layers import Packed
from engine.runtime.placement import Placement
from engine.runtime.telemetry import Telemetry
from engine.runtime.token_groups import token_groups

MAX_TOKENS = 4      # the CPU takes a share only in steps this small (decode); larger ones are the GPU's
CPU_FAST_FORMATS = ("int8", "bf16")   # stored forms the CPU computes in place (kernels.cpu_linear); others dequantise


class CpuExperts:
    def __init__(self, layout: Layout, expert_mlp: Callable, dtype: torch.dtype, device: torch.device, top_k: int,
                 telemetry: Telemetry, placement: Placement):
        self.layout, self.expert_mlp, self.dtype, self.telemetry = layout, expert_mlp, dtype, telemetry
        self.placement = placement
        self.is_cuda = torch.device(device).type == "cuda"
        self._views: dict[int, dict] = {}
        if self.is_cuda:
            pinned = dict(pin_memory=True)
            self._x = torch.empty(MAX_TOKENS, layout.hidden, dtype=dtype, **pinned)
            self._w = torch.empty(MAX_TOKENS, top_k, dtype=torch.float32, **pinned)
            self._y = torch.empty(MAX_TOKENS, layout.hidden, dtype=torch.float32, **pinned)
            self._y_dev = torch.empty(MAX_TOKENS, layout.hidden, dtype=torch.float32, device=device)

    def weights(self, block: torch.Tensor) -> dict[str, torch.Tensor | Packed]:
        """One expert's weights as the family's expert function takes them, left in the block. The views
        are kept per block address (a RAM cache slot's memory never moves), so each is made once."""
        key = block.data_ptr()
        cached = self._views.get(key)
        if cached is None:
            cached = {}
            for proj, parts in self.layout.parts(block).items():
                cached[proj] = parts["b"].to(self.dtype) if "b" in parts else Packed(parts, self.layout.fmt)
            self._views[key] = cached
        return cached

    def stage(self, x: torch.Tensor, weights: torch.Tensor) -> None:
        """Before the layer's host sync: start copying its input [T, H] and routing weights [T, K]."""
        if self.is_cuda and x.shape[0] <= MAX_TOKENS:
            self._x[:x.shape[0]].copy_(x, non_blocking=True)
            self._w[:x.shape[0]].copy_(weights, non_blocking=True)

    def compute(self, blocks: dict[int, torch.Tensor], routed: list[int], top_k: int, x: torch.Tensor,
                weights: torch.Tensor) -> torch.Tensor:
        """The experts {expert: RAM block}'s weighted sum [T, H] float32, on the host (after the host sync)."""
        start = time.perf_counter()
        num_tokens = x.shape[0]
        if self.is_cuda:
            x, weights, y = self._x[:num_tokens], self._w[:num_tokens], self._y[:num_tokens]
        else:
            weights, y = weights.float(), torch.empty(x.shape, dtype=torch.float32)
        y.zero_()
        if num_tokens == 1:                        # decode: each expert has the one token once, a scalar weight
            row = weights[0].tolist()
            for expert, block in blocks.items():
                y.add_(self.expert_mlp(x, self.weights(block)), alpha=row[routed.index(expert)])
        else:
            groups = token_groups(routed, torch.tensor(routed), top_k)
            for expert, block in blocks.items():
                token_idx, k_idx = groups[expert]
                out = self.expert_mlp(x[token_idx], self.weights(block))
                y.index_add_(0, token_idx, out.float() * weights[token_idx, k_idx, None])
        busy = time.perf_counter() - start
        self.placement.observe(busy, len(blocks), num_tokens)
        self.telemetry.add(cpu_experts=len(blocks), cpu_expert_bytes=len(blocks) * self.layout.block_bytes,
                           cpu_busy_s=busy)
        return y

    def add_into(self, y: torch.Tensor, out: torch.Tensor) -> None:
        """out [T, H] += the CPU's share y (on the device: stream-ordered after the GPU's share)."""
        if self.is_cuda:
            out.add_(self._y_dev[:y.shape[0]].copy_(y, non_blocking=True))
        else:
            out.add_(y)
