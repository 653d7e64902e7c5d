"""Routed experts computed by the CPU straight from their RAM-cache blocks (hybrid execution).

The block stays in its stored format, nothing is dequantised or copied first: int8 blocks go through
the fused kernel (kernels.cpu_moe: the expert's three projections, activation and weighted add in one
call) where it matches the float32 reference and is faster than the family's torch expert at load
(`choose_kernel`); otherwise, and for a prompt's larger token groups, `Packed` weights go through
kernels.cpu_gemm (float32 tokens: the int8 codes through MKL's GEMM) or kernels.cpu_linear (bf16). The
decode thread itself computes them, after it has enqueued the GPU's whole share of the layer (kernels, copies,
the next layer's prefetch), so both devices work at once; `add_into` adds the CPU's partial sum into the
layer's output, the one place the two devices' results meet. (Not a worker thread: it waits for the GIL while
the decode thread launches work, and a pool sharing the cores gained nothing, torch's int8 kernel being the
limit.)
On CUDA the layer's input and routing weights reach the host through pinned rows copied before the
layer's host sync, so they cost no extra wait.
"""
from __future__ import annotations

import functools
import time
import warnings
from typing import Callable

import torch

from kernels import cpu_gemm
from kernels.activation import Activation

from engine.format.layout import Layout
from engine.model.layers import Packed
from engine.runtime.placement import Placement, measure_cpu_s
from engine.runtime.telemetry import Telemetry
from engine.runtime.token_groups import token_groups

MAX_TOKENS = 4      # on a GPU the CPU takes a share only in steps this small (decode); larger ones are the GPU's
# An expert's tokens up to which the fused kernel beats kernels.cpu_gemm's GEMM (which takes about as long for 1
# to 16 tokens); a prompt's larger groups take the family's torch expert over it.
FUSED_MAX_GROUP = 10
FUSED_RTOL = 1e-4   # the fused kernel's largest error against the float32 reference, relative to its largest value
CPU_FAST_FORMATS = ("int8", "bf16")   # stored forms the CPU computes in place (kernels.cpu_linear); others dequantise


class CpuExperts:
    def __init__(self, layout: Layout, expert_mlp: Callable, dtype: torch.dtype, device: torch.device, top_k: int,
                 telemetry: Telemetry, placement: Placement, activation: Activation | None = None,
                 cpu_kernel: str = "auto"):
        """cpu_kernel (Options.cpu_kernel): "auto" takes the fused kernel where it matches the reference and is
        faster (`choose_kernel`), "fused" wherever it matches, "torch" never."""
        self.layout, self.expert_mlp, self.dtype, self.telemetry = layout, expert_mlp, dtype, telemetry
        self.placement = placement
        self.is_cuda = torch.device(device).type == "cuda"
        self._views: dict[int, dict] = {}
        self._tile = cpu_gemm.scratch() if layout.fmt == "int8" else None   # kernels.cpu_gemm's, touched on first use
        self._parts: dict[int, dict] = {}
        # the fused kernel (kernels.cpu_moe) serves int8 blocks of the activations it knows; `choose_kernel`
        # turns it on where it matches the reference and is faster
        self.activation = activation
        self.cpu_kernel = cpu_kernel
        self.fusable = layout.fmt == "int8" and activation is not None and cpu_kernel != "torch"
        if self.fusable:         # numba is imported here, not with the engine: it holds ~35-130 MiB once loaded
            from kernels import cpu_moe
            self.fusable, self._cpu_moe = cpu_moe.available(), cpu_moe
        self.fused = False
        self.kernel = (self._cpu_moe.FusedExperts({f.name: f.offset for f in layout.fields}, layout.intermediate,
                                            layout.hidden, activation) if self.fusable else None)
        if self.is_cuda:
            pinned = dict(pin_memory=True)
            self._x = torch.empty(MAX_TOKENS, layout.hidden, dtype=dtype, **pinned)
            self._w = torch.empty(MAX_TOKENS, top_k, dtype=torch.float32, **pinned)
            self._y = torch.empty(MAX_TOKENS, layout.hidden, dtype=torch.float32, **pinned)
            self._y_dev = torch.empty(MAX_TOKENS, layout.hidden, dtype=torch.float32, device=device)

    def weights(self, block: torch.Tensor, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor | Packed]:
        """One expert's weights as the family's expert function takes them, left in the block. The views
        are kept per block address (a RAM cache slot's memory never moves), so each is made once; biases
        (float32 in the block) are converted to `dtype` (the compute dtype) at each call, since a kept copy
        would go stale when the slot takes another expert."""
        key = block.data_ptr()
        cached = self._views.get(key)
        if cached is None:
            cached = {proj: parts["b"] if "b" in parts else self._packed(parts)
                      for proj, parts in self.parts(block).items()}
            self._views[key] = cached
        dtype = dtype or self.dtype
        return {proj: w.to(dtype) if isinstance(w, torch.Tensor) else w for proj, w in cached.items()}

    def _packed(self, parts: dict[str, torch.Tensor]) -> Packed:
        """A projection left in the block; an int8 one multiplied by kernels.cpu_gemm."""
        packed = Packed(parts, self.layout.fmt)
        if self.layout.fmt == "int8":
            packed.kernel = functools.partial(cpu_gemm.int8_linear, tile=self._tile)
        return packed

    def reference_weights(self, block: torch.Tensor) -> dict[str, torch.Tensor | Packed]:
        """The block's weights in float32 as the reference multiplies them (kernels.cpu_linear.int8_linear_ref)."""
        return {proj: parts["b"].float() if "b" in parts else Packed(parts, self.layout.fmt)
                for proj, parts in self.parts(block).items()}

    def parts(self, block: torch.Tensor) -> dict[str, dict[str, torch.Tensor]]:
        """The block's typed views by projection (kept per block address, as `weights`)."""
        key = block.data_ptr()
        parts = self._parts.get(key)
        if parts is None:
            parts = self._parts[key] = self.layout.parts(block)
        return parts

    def choose_kernel(self, block: torch.Tensor, x: torch.Tensor) -> dict:
        """Time one expert (this block, one token x [1, H]) through the family's torch expert and, where it
        applies, the fused kernel (kernels.cpu_moe); the fused one is used when it matches the float32
        reference and is faster, here, now. Returns what was measured (seconds an expert, the choice)."""
        torch_s = measure_cpu_s(lambda: self.expert_mlp(x, self.weights(block)))
        found = {"torch_expert_s": torch_s, "cpu_kernel": "torch"}
        if not self.fusable:
            return {**found, "cpu_expert_s": torch_s}
        x32, y, one, w = x.float().contiguous(), torch.zeros(1, self.layout.hidden), torch.zeros(1, dtype=torch.long), torch.ones(1)
        self._cpu_moe.set_threads(torch.get_num_threads())
        self.kernel.into(y, x32, [block], [one], [w])
        ref = self.expert_mlp(x32, self.reference_weights(block)).float()
        error = float((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
        fused_s = measure_cpu_s(lambda: self.kernel.into(y, x32, [block], [one], [w]))
        found.update(fused_expert_s=fused_s, fused_error=error)
        if error > FUSED_RTOL:
            warnings.warn(f"The fused CPU expert kernel is not used on this machine: its error {error:.2e} exceeds "
                          f"{FUSED_RTOL:.0e}. Sluice computes the CPU's experts in torch instead.", RuntimeWarning)
        self.fused = error <= FUSED_RTOL and (fused_s < torch_s or self.cpu_kernel == "fused")
        found["cpu_kernel"] = "fused" if self.fused else "torch"
        return {**found, "cpu_expert_s": fused_s if self.fused else torch_s}

    def takes(self, num_tokens: int) -> bool:
        """Whether the CPU takes a share of a step this size: on a GPU only small ones (decode), and not while the
        placement's trial has the share off; on the CPU device any (its RAM-resident experts are computed in
        place, not copied into a slot first)."""
        return not self.is_cuda or (num_tokens <= MAX_TOKENS and not self.placement.share_paused())

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
        if self.fused:
            self._fused(blocks, routed, top_k, x, weights, y)
        elif num_tokens == 1:                      # decode: each expert has the one token once, a scalar weight
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

    def fused_into(self, y: torch.Tensor, x: torch.Tensor, block: torch.Tensor, tokens: torch.Tensor,
                   weight: torch.Tensor) -> None:
        """y[tokens] += weight[:, None] * the expert in `block`(x[tokens]), through the fused kernel
        (y and x float32 on the host: the CPU device's slot experts)."""
        self.kernel.into(y, x.contiguous(), [block], [tokens], [weight.float().contiguous()])

    def _fused(self, blocks, routed, top_k, x, weights, y) -> None:
        """The fused kernel, one call for the layer's experts (kernels.cpu_moe.MAX_BLOCKS a call), each adding
        its weighted rows into y (float32); an expert with more than FUSED_MAX_GROUP of a prompt's tokens goes
        through torch's expert instead."""
        x32, weights = x.float().contiguous(), weights.float().contiguous()
        if x.shape[0] == 1:
            token = torch.zeros(1, dtype=torch.long)
            row = weights[0]
            ks = [routed.index(expert) for expert in blocks]
            self.kernel.into(y, x32, list(blocks.values()), [token] * len(ks), [row[k:k + 1] for k in ks])
            return
        groups = token_groups(routed, torch.tensor(routed), top_k)
        fused = [expert for expert in blocks if len(groups[expert][0]) <= FUSED_MAX_GROUP]
        self.kernel.into(y, x32, [blocks[e] for e in fused], [groups[e][0] for e in fused],
                         [weights[groups[e][0], groups[e][1]] for e in fused])
        for expert, block in blocks.items():
            token_idx, k_idx = groups[expert]
            if len(token_idx) > FUSED_MAX_GROUP:
                out = self.expert_mlp(x[token_idx], self.weights(block))
                y.index_add_(0, token_idx, out.float() * weights[token_idx, k_idx, None])

    def add_into(self, y: torch.Tensor, out: torch.Tensor) -> None:
        """out [T, H] += the CPU's share y (on the device: stream-ordered after the GPU's share)."""
        if self.is_cuda:
            out.add_(self._y_dev[:y.shape[0]].copy_(y, non_blocking=True))
        else:
            out.add_(y)
