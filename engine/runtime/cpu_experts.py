"""Routed experts computed by the CPU straight from their RAM-cache blocks (hybrid execution).

The block stays in its stored format: `Packed` weights go through kernels.cpu_linear (torch's packed
int8 kernel for the int8 format), so nothing is dequantised or copied first. One worker thread runs
the experts (torch's intra-op threads do the matmuls) while the calling thread launches the GPU's
share of the layer; `finish` adds the CPU's partial sum into the layer's output, the one place the
two devices' results meet. On CUDA the layer's input and routing weights reach the host through
pinned rows copied before the layer's host sync, so they cost no extra wait.
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import torch

from engine.format.layout import Layout
from engine.model.layers import Packed
from engine.runtime.placement import Placement
from engine.runtime.telemetry import Telemetry

MAX_TOKENS = 4      # the CPU takes a share only in steps this small (decode); larger ones are the GPU's


def group_parts(views: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """{"gate.w": t, "gate.scale": s, ...} -> {"gate": {"w": t, "scale": s}, ...}."""
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for name, view in views.items():
        proj, part = name.split(".")
        parts.setdefault(proj, {})[part] = view
    return parts


class CpuExperts:
    def __init__(self, layout: Layout, expert_mlp: Callable, dtype: torch.dtype, device: torch.device, top_k: int,
                 telemetry: Telemetry, placement: Placement):
        self.layout, self.expert_mlp, self.dtype, self.telemetry = layout, expert_mlp, dtype, telemetry
        self.placement = placement
        self.is_cuda = torch.device(device).type == "cuda"
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="sluice-cpu-experts")
        if self.is_cuda:
            pinned = dict(pin_memory=True)
            self._x = torch.empty(MAX_TOKENS, layout.hidden, dtype=dtype, **pinned)
            self._w = torch.empty(MAX_TOKENS, top_k, dtype=torch.float32, **pinned)
            self._y = torch.empty(MAX_TOKENS, layout.hidden, dtype=torch.float32, **pinned)
            self._y_dev = torch.empty(MAX_TOKENS, layout.hidden, dtype=torch.float32, device=device)

    def weights(self, block: torch.Tensor) -> dict[str, torch.Tensor | Packed]:
        """One expert's weights as the family's expert function takes them, left in the block."""
        out: dict[str, torch.Tensor | Packed] = {}
        for proj, parts in group_parts(self.layout.views(block)).items():
            out[proj] = parts["b"].to(self.dtype) if "b" in parts else Packed(parts, self.layout.fmt)
        return out

    def stage(self, x: torch.Tensor, weights: torch.Tensor) -> None:
        """Before the layer's host sync: start copying its input [T, H] and routing weights [T, K]."""
        if self.is_cuda and x.shape[0] <= MAX_TOKENS:
            self._x[:x.shape[0]].copy_(x, non_blocking=True)
            self._w[:x.shape[0]].copy_(weights, non_blocking=True)

    def submit(self, blocks: dict[int, torch.Tensor], routed: list[int], top_k: int, x: torch.Tensor,
               weights: torch.Tensor) -> tuple[Future, int]:
        """Start the experts {expert: RAM block} on the worker (after the host sync)."""
        num_tokens = x.shape[0]
        if self.is_cuda:
            x, weights, y = self._x[:num_tokens], self._w[:num_tokens], self._y[:num_tokens]
        else:
            weights, y = weights.float(), torch.empty(x.shape, dtype=torch.float32)
        work = []
        for expert, block in blocks.items():
            flat = torch.tensor([i for i, e in enumerate(routed) if e == expert])
            work.append((self.weights(block), flat // top_k, flat % top_k))
        return self._pool.submit(self._compute, work, x, weights, y), len(blocks)

    def _compute(self, work, x: torch.Tensor, weights: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, float]:
        start = time.perf_counter()
        with torch.inference_mode():                      # thread-local: the worker sets its own
            y.zero_()
            for expert_weights, token_idx, k_idx in work:
                out = self.expert_mlp(x[token_idx], expert_weights)
                y.index_add_(0, token_idx, out.float() * weights[token_idx, k_idx, None])
        return y, time.perf_counter() - start

    def finish(self, job: tuple[Future, int], out: torch.Tensor) -> None:
        """Wait for the CPU's share and add it into `out` [T, H] (on the device, stream-ordered)."""
        future, count = job
        waited = time.perf_counter()
        y, busy = future.result()
        waited = time.perf_counter() - waited
        num_tokens = y.shape[0]
        if self.is_cuda:
            out.add_(self._y_dev[:num_tokens].copy_(y, non_blocking=True))
        else:
            out.add_(y)
        self.placement.observe(busy, count, num_tokens)
        self.telemetry.add(cpu_experts=count, cpu_expert_bytes=count * self.layout.block_bytes, cpu_busy_s=busy,
                           cpu_wait_s=waited)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
