"""A MoE layer's routed experts computed on the slot banks: the kernels attached at load, or torch.

  few tokens, a decode kernel attached  -> the self-checked Triton kernel straight on the bank, in one or two
                                           launches (replayed from CUDA graphs at decode: `capture`);
  a prompt, a prefill kernel attached   -> the grouped-GEMM kernel, one call for the resident experts, then
                                           one per batch brought in;
  otherwise                             -> each expert in torch on the tokens routed to it (on the CPU device
                                           a slot's int8 block through the fused CPU kernel where it is faster).
The CPU's share of a hybrid step (`CpuShare`) is computed from RAM blocks where they sit (cpu_experts.py).
Shapes: T = tokens, K = experts a token, H = hidden.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from engine.format.layout import Layout
from engine.format.quant import dequantize
from engine.model.graph_capture import capturing
from engine.runtime.budget import prefill_expert_bytes
from engine.runtime.cache import RamCache
from engine.runtime.cpu_experts import CpuExperts
from engine.runtime.movers import Mover
from engine.runtime.residency import Key
from engine.runtime.slots import SlotBanks
from engine.runtime.token_groups import token_groups

KERNEL_MAX_TOKENS = 4       # above this many tokens the torch path (one matmul per expert) is faster
# A slot's expert on the CPU device goes through the fused kernel for up to this many tokens: there it beat
# decoding the block's float copy and multiplying, even with the copy kept in its slot.
FUSED_MAX_TOKENS = 16
# ... and up to this many where the slot keeps no float copy of it (torch would dequantise the block first).
FUSED_MAX_UNDECODED = 32

BringIn = Callable[..., dict[int, int]]      # Experts._bring_in(layer, experts, protected, each=False)


@dataclass
class LayerCall:
    """One layer's inputs: x [T, H], weights [T, K], the routed ids flat [T*K] on the host (`routed`) and
    first in `ids` on the device, and `out` [T, H] that receives the weighted sum."""
    layer: int
    x: torch.Tensor
    weights: torch.Tensor
    routed: list[int]
    ids: torch.Tensor
    out: torch.Tensor

    @property
    def top_k(self) -> int:
        return self.weights.shape[1]

    @property
    def routed_dev(self) -> torch.Tensor:
        """The routed ids on the device (a view: made only where a path needs it, not on the decode kernel's)."""
        return self.ids[:len(self.routed)]


class LayerCompute:
    def __init__(self, banks: SlotBanks, mover: Mover, layout: Layout, expert_mlp: Callable, dtype: torch.dtype,
                 batch_size: int, kernel: Callable | None = None, prefill_kernel=None,
                 fused_slots: CpuExperts | None = None):
        self.banks, self.mover, self.layout, self.expert_mlp, self.dtype = banks, mover, layout, expert_mlp, dtype
        self.batch_size = batch_size
        self.kernel = kernel                      # kernels.moe_decode (few tokens), or None
        self.prefill_kernel = prefill_kernel      # kernels.moe_prefill.PrefillKernel, or None (torch loop)
        self.fused_slots = fused_slots            # the CPU device's fused int8 kernel for slot experts, or None
        self.offsets = {f.name: f.offset for f in layout.fields}
        self._graphs: dict[int, tuple[list[torch.cuda.CUDAGraph], list[torch.Tensor]]] = {}   # see capture
        self._graph_pool = None

    def uses_kernel(self, num_tokens: int, num_wanted: int) -> bool:
        return self.kernel is not None and num_tokens <= KERNEL_MAX_TOKENS and num_wanted <= self.batch_size

    def run_slots(self, call: LayerCall, resident: dict[int, int], late: list[int], bring_in: BringIn) -> None:
        """A prompt's (or a kernel-less step's) experts: the resident ones, then the others in batches."""
        grouped = self.prefill_kernel is not None and call.x.shape[0] > KERNEL_MAX_TOKENS
        (self._grouped_layer if grouped else self._torch_layer)(call, resident, late, bring_in)

    def set_ready(self, layer: int, slot_of: dict[int, int]) -> None:
        for expert, slot in slot_of.items():
            self.banks.set_state((layer, expert), slot, "ready")

    # ------------------------------------------------------------------ torch, expert by expert
    def _torch_layer(self, call: LayerCall, resident: dict[int, int], late: list[int], bring_in: BringIn) -> None:
        groups = token_groups(call.routed, call.routed_dev, call.top_k)
        call.out.zero_()
        self._torch_experts(call, groups, resident)
        for start in range(0, len(late), self.batch_size):
            batch = late[start:start + self.batch_size]
            placed = bring_in(call.layer, batch, protected={(call.layer, e) for e in batch}, each=True)
            self._torch_experts(call, groups, placed)

    def _torch_experts(self, call: LayerCall, groups: dict, slot_of: dict[int, int]) -> None:
        if not slot_of:
            return
        layer, x, weights, out = call.layer, call.x, call.weights, call.out
        bank = self.banks.bank_of(layer)
        fuses = self.fused_slots is not None and x.dtype == out.dtype == torch.float32
        for expert, slot in slot_of.items():
            self.mover.wait_slots(bank, [slot])
            self.banks.set_state((layer, expert), slot, "computing")
            token_idx, k_idx = groups[expert]
            if fuses and self._fused_beats((layer, expert), bank, slot, len(token_idx)):   # the int8 block as it is
                self.fused_slots.fused_into(out, x, self.banks.banks[bank][slot], token_idx, weights[token_idx, k_idx])
                continue
            y = self.expert_mlp(x[token_idx], self._expert_weights((layer, expert), bank, slot))
            out.index_add_(0, token_idx, (y * weights[token_idx, k_idx, None]).to(out.dtype))
        self.mover.mark_bank_free(bank)
        self.set_ready(layer, slot_of)

    def _fused_beats(self, key: Key, bank: int, slot: int, num_tokens: int) -> bool:
        """Whether the fused kernel computes this slot's expert for num_tokens faster than torch: always up to
        FUSED_MAX_TOKENS; up to FUSED_MAX_UNDECODED where the slot keeps no float copy of it (a prompt's sweep
        rotates the slots, so torch would dequantise the block first). In bfloat16 torch's path is kept: its
        products round as the reference's do."""
        if num_tokens <= FUSED_MAX_TOKENS:
            return True
        return num_tokens <= FUSED_MAX_UNDECODED and not self.mover.keeps_decoded(key, bank, slot)

    def _expert_weights(self, key: Key, bank: int, slot: int) -> dict[str, torch.Tensor]:
        """The expert in this slot, dequantised to the compute dtype (parts named gate, up, down, and
        e.g. gate_bias where the family has them)."""
        def decode() -> dict[str, torch.Tensor]:
            parts = self.layout.parts(self.banks.banks[bank][slot])
            return {proj: dequantize(p, self.layout.fmt, self.dtype) for proj, p in parts.items()}
        return self.mover.expert_weights(key, bank, slot, decode)

    # ------------------------------------------------------------------ grouped GEMM (prompts)
    def _grouped_layer(self, call: LayerCall, resident: dict[int, int], late: list[int], bring_in: BringIn) -> None:
        """The prefill kernel, one call for the resident experts, then one per batch brought in (after its
        copies); the pairs are sorted once, in that order."""
        layer = call.layer
        routing = self.prefill_kernel.route(call.routed, call.routed_dev, list(resident) + late, call.top_k)
        workspace = prefill_expert_bytes(self.layout.intermediate, self.layout.hidden, call.x.shape[0])
        x, weights, bank = call.x.contiguous(), call.weights.float().contiguous(), self.banks.bank_of(layer)
        call.out.zero_()
        batches = [late[start:start + self.batch_size] for start in range(0, len(late), self.batch_size)]
        for batch in [None, *batches]:                                          # None: the resident experts
            slot_of = resident if batch is None else bring_in(layer, batch, protected={(layer, e) for e in batch})
            if not slot_of:
                continue
            self.mover.wait_slots(bank, list(slot_of.values()))
            for expert, slot in slot_of.items():
                self.banks.set_state((layer, expert), slot, "computing")
            self.prefill_kernel(x, self.banks.banks[bank], routing, slot_of, weights, self.layout.fmt, self.offsets,
                                self.layout.intermediate, call.out, workspace_bytes=workspace)
            self.mover.mark_bank_free(bank)
            self.set_ready(layer, slot_of)

    # ------------------------------------------------------------------ decode kernel (few tokens)
    def launch(self, call: LayerCall, slot_of: dict[int, int], early: list[int], late: list[int],
               static_inputs: bool) -> None:
        """Fused-kernel launches into `out`: for one token the resident experts first (the others' slots are
        -1: the kernel reads nothing for them), then, after their copy events, the late ones added on top.
        Several tokens run in one launch once everything is in. static_inputs: x, weights and out are the
        decode step's buffers, so a captured graph replays the launch."""
        layer, num_tokens = call.layer, call.x.shape[0]
        bank = self.banks.bank_of(layer)
        one_step = num_tokens == 1 or static_inputs         # a decode step (Llama 4's: one row per choice)
        groups = [early, late] if one_step and early and late else [early + late]
        rows = _slot_rows(call.routed, slot_of, groups)
        replay = static_inputs and layer in self._graphs
        if replay:                                   # both groups' slot rows in one upload
            graphs, flat_rows = self._graphs[layer]
            self.mover.upload([s for row in rows for s in row], flat_rows[len(rows) - 1])
        for i, group in enumerate(groups):
            self.mover.wait_slots(bank, [slot_of[e] for e in group])
            if replay:
                graphs[i > 0].replay()
                continue
            index = self.mover.upload(rows[i]).view(num_tokens, call.top_k)
            self.kernel(call.x, self.banks.banks[bank], index, call.weights.float(), self.layout.fmt, self.offsets,
                        self.layout.intermediate, out=call.out, accumulate=i > 0)
        self.mover.mark_bank_free(bank)

    def capture(self, layers: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]], device: torch.device) -> None:
        """Capture the one-token kernel launches of each layer in CUDA graphs, two per layer (write `out`, add
        into `out`), over static inputs {layer: (x [1, H], weights [1, K], out [1, H])} (the decode step's
        buffers; x [R, H], weights [R, K / R], out [R, H] where a token's choices are rows of their own, as Llama 4's).
        The expert slots are a static int32 row per layer, uploaded before each replay. Done once at
        load, so no capture happens while tokens are timed."""
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        for layer, (x, weights, out) in layers.items():
            bank = self.banks.bank_of(layer)
            index = torch.zeros(2, *weights.shape, dtype=torch.int32, device=device)   # slot 0: valid bytes
            graphs = []
            for accumulate in (False, True):
                launch = lambda: self.kernel(x, self.banks.banks[bank], index[int(accumulate)],  # noqa: E731
                                             weights.float(), self.layout.fmt, self.offsets,
                                             self.layout.intermediate, out=out, accumulate=accumulate)
                launch()                                          # compile / warm up outside the capture
                graph = torch.cuda.CUDAGraph()
                with capturing(graph, self._graph_pool):
                    launch()
                graphs.append(graph)
            self._graphs[layer] = (graphs, [index[:1].view(-1), index.view(-1)])  # [write, add] graphs; 1 or 2 slot rows
        torch.cuda.synchronize(device)


def _slot_rows(routed: list[int], slot_of: dict[int, int], groups: list[list[int]]) -> list[list[int]]:
    """Per launch group, the slot of each routed pair ([T*K]), -1 where the pair's expert is not in the group."""
    if len(groups) == 1:
        return [[slot_of.get(e, -1) for e in routed]]
    rows = []
    for group in groups:
        members = set(group)
        rows.append([slot_of.get(e, -1) if e in members else -1 for e in routed])
    return rows


class CpuShare:
    """The RAM-resident misses the CPU computes where they sit (hybrid execution); their RAM blocks stay
    locked until computed."""

    def __init__(self, cpu: CpuExperts, cache: RamCache, layer: int, experts: list[int]):
        self.cpu, self.cache, self.layer = cpu, cache, layer
        self.blocks = {e: cache.block(cache.lookup((layer, e))) for e in experts}
        for e in experts:
            cache.lock((layer, e))
        self._y: torch.Tensor | None = None

    def compute(self, call: LayerCall) -> None:
        """The share's weighted sum [T, H] float32; its RAM blocks are unlocked after it."""
        try:
            self._y = self.cpu.compute(self.blocks, call.routed, call.top_k, call.x, call.weights)
        finally:
            for expert in self.blocks:
                self.cache.unlock((self.layer, expert))

    def add_into(self, call: LayerCall) -> None:
        """out += the share (computed now unless it was before the device's share)."""
        if self._y is None:
            self.compute(call)
        self.cpu.add_into(self._y, call.out)
