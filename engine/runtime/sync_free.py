"""Decode steps with one host sync a token, not one a MoE layer, where every routed expert is held (VRAM or RAM).

A synced step reads each MoE layer's routed ids on the host (one sync a layer), then copies its misses into
slots and launches the experts. Where every expert block sits in a VRAM slot or in the pinned RAM cache, a step
can skip that: right after each layer's router its captured launch reads every routed expert where it sits, its
VRAM slot or its pinned RAM block in place over PCIe (unified addressing), from a device table of each block's
byte offset from its layer's bank (kernels/moe_decode.py, `bases`). The host replays the layers back to back and
syncs once, for the token; it reads the step's ids afterwards, for the use counts and telemetry.

The table holds while no block moves, and blocks move only in synced steps (a prompt's pass, or a decode step
that copies its misses in). So every REFRESH_TOKENS-th token is a synced step (its misses copied into slots as
the policy ranks them; the table is rebuilt once its copies have landed), and a step goes in place only while the
misses a token cost more read in place than copied by less than the syncs they spare (`worth_it`).
"""
from __future__ import annotations

import numpy as np
import torch

from engine.runtime.cache import RamCache
from engine.runtime.placement import measure_copy_s
from engine.runtime.slots import SlotBanks

REFRESH_TOKENS = 16     # every this many tokens a synced step: its misses copied in, the slots' ranking followed
SYNC_S = 2e-4           # a MoE layer's host sync and the host's work before its expert launch (py-spy, H100 box)
MISS_DECAY = 0.8        # the misses a token: an average over the last few steps


class ExpertTable:
    """[MoE layers, E] int64 on the device: each block's byte offset from its layer's bank, its slot's or its
    RAM block's; and which of them are RAM blocks (on the host, for counting the step's reads in place)."""

    def __init__(self, moe_layers: list[int], num_experts: int, device: torch.device):
        self.rows = {layer: i for i, layer in enumerate(moe_layers)}
        self.offsets = torch.zeros(len(moe_layers), num_experts, dtype=torch.int64, device=device)
        self.in_ram = np.zeros((len(moe_layers), num_experts), dtype=bool)
        self.valid = False

    def build(self, banks: SlotBanks, cache: RamCache) -> bool:
        """The table from where every block sits now (no copy in flight); False where a block is in neither tier."""
        rows, shape = self.rows, self.offsets.shape
        held = np.zeros(shape, dtype=bool)
        offsets = np.zeros(shape, dtype=np.int64)          # absolute addresses first: RAM blocks, then slots
        addresses = cache.addresses()
        for (layer, expert), slot in cache.held():
            row = rows.get(layer)
            if row is not None:
                offsets[row, expert], held[row, expert] = addresses[slot], True
        self.in_ram[:] = True
        for bank, tensor in enumerate(banks.banks):
            for (layer, expert), slot in banks.resident(bank):
                row = rows[layer]
                offsets[row, expert] = tensor.data_ptr() + slot * banks.block_bytes
                held[row, expert], self.in_ram[row, expert] = True, False
        if not held.all():
            return False
        bases = np.array([banks.banks[banks.bank_of(layer)].data_ptr() for layer in rows], dtype=np.int64)
        self.offsets.copy_(torch.from_numpy(offsets - bases[:, None]))
        self.valid = True
        return True


class SyncFreeSteps:
    """The launches (captured once, over the decode step's static buffers) and the policy: which step goes without
    its syncs."""

    def __init__(self, compute, banks: SlotBanks, cache: RamCache, moe_layers: list[int], num_experts: int,
                 top_k: int, extra_miss_s: float, telemetry, device: torch.device):
        """extra_miss_s: what an expert read in place costs more than copied in (measured at load)."""
        self.compute, self.banks, self.cache, self.telemetry = compute, banks, cache, telemetry
        self.table = ExpertTable(moe_layers, num_experts, device)
        self.num_blocks = len(moe_layers) * num_experts
        self.extra_miss_s = extra_miss_s
        self.misses = 0.0                    # a token's misses, decayed average over steps of both kinds
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        shape = (len(moe_layers), top_k)
        self._step_ids = torch.zeros(shape, dtype=torch.int64, device=device)     # the step's routed ids
        self._host_ids = torch.zeros(shape, dtype=torch.int64, pin_memory=device.type == "cuda")   # ... read back
        self._bases = torch.zeros(shape, dtype=torch.int64, device=device)        # their blocks' offsets
        self._slots = torch.zeros(1, top_k, dtype=torch.int32, device=device)     # >= 0: each read at its base
        self._pending = False                             # a step whose ids are not counted yet
        self._ids_landed = torch.cuda.Event() if self._host_ids.is_pinned() else None   # ... behind their copy
        self._since_sync = 0

    # ------------------------------------------------------------------ the launches
    def _launch(self, layer: int, x: torch.Tensor, weights: torch.Tensor, out: torch.Tensor, ids: torch.Tensor) -> None:
        """out = the layer's routed experts of x [1, H], each read where the table says, its ids kept for the host."""
        row, top_k = self.table.rows[layer], weights.shape[1]
        routed, bases = self._step_ids[row], self._bases[row]
        routed.copy_(ids[:top_k])
        torch.index_select(self.table.offsets[row], 0, routed, out=bases)
        c = self.compute
        c.kernel(x, self.banks.banks[self.banks.bank_of(layer)], self._slots, weights.float(), c.layout.fmt, c.offsets,
                 c.layout.intermediate, out=out, bases=bases[None])

    def capture(self, layers: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
        """One CUDA graph a MoE layer over the decode step's static buffers {layer: (x [1, H], weights [1, K],
        out [1, H], ids [K + guesses])}."""
        pool = torch.cuda.graph_pool_handle()
        for layer, buffers in layers.items():
            buffers[3].zero_()                            # the ids the capture's own steps left: valid rows
            self._launch(layer, *buffers)                 # compiled and warmed outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._launch(layer, *buffers)
            self._graphs[layer] = graph
        torch.cuda.synchronize(self.table.offsets.device)

    @property
    def captured(self) -> bool:
        return bool(self._graphs)

    def run(self, layer: int, x: torch.Tensor, weights: torch.Tensor, out: torch.Tensor, ids: torch.Tensor) -> None:
        """The layer's experts in place: its graph replayed where captured, else launched on these tensors."""
        graph = self._graphs.get(layer)
        if graph is not None:
            graph.replay()
        else:
            self._launch(layer, x, weights, out, ids)

    # ------------------------------------------------------------------ the policy
    def invalidate(self) -> None:
        """Blocks may move (a synced run): the table is rebuilt before the next step in place."""
        self.table.valid = False

    def worth_it(self, moe_layers: int) -> bool:
        """Whether a token's misses, read in place, cost less extra than the layers' syncs they spare."""
        return self.misses * self.extra_miss_s < moe_layers * SYNC_S

    def begin_step(self, settle) -> bool:
        """Whether this decode step goes without a host sync a layer (call after the previous step's result was
        read: its ids' copy has landed). `settle` lands every copy and read in flight (the table is built on
        blocks that sit still)."""
        self._count_previous()
        self._since_sync += 1
        if self._since_sync >= REFRESH_TOKENS or not self.worth_it(len(self.table.rows)):
            self._since_sync = 0
            return False
        if not self.table.valid:
            if len(self.cache) + self.banks.num_resident() < self.num_blocks:     # some block in neither tier
                return False
            settle()
            if not self.table.build(self.banks, self.cache):
                return False
        self.telemetry.add(sync_free_steps=1)
        return True

    def end_step(self) -> None:
        """After a step in place: its routed ids to the host (counted at the next step's start)."""
        self._host_ids.copy_(self._step_ids, non_blocking=True)
        if self._ids_landed is not None:
            self._ids_landed.record()
        self._pending = True

    def note_synced_misses(self, misses: int) -> None:
        self.misses = MISS_DECAY * self.misses + (1 - MISS_DECAY) * misses

    def _count_previous(self) -> None:
        if not self._pending:
            return
        if self._ids_landed is not None:
            self._ids_landed.synchronize()       # (long landed where the step's token was read)
        self._pending = False
        ids = self._host_ids.numpy()
        misses = 0
        for layer, row in self.table.rows.items():
            routed = ids[row].tolist()
            self.banks.note_used(layer, routed)
            misses += int(self.table.in_ram[row, ids[row]].sum())
        pairs = ids.size
        self.note_synced_misses(misses)
        self.telemetry.add(vram_hits=pairs - misses, vram_misses=misses, pcie_reads=misses)


def extra_miss_s(kernel, bank: torch.Tensor, block: torch.Tensor, host_block: torch.Tensor, layout, offsets,
                 dtype: torch.dtype) -> float | None:
    """Check the kernel reads a pinned RAM block in place exactly as it reads the same block in a slot -> what an expert
    read in place costs more than one copied in (seconds, CUDA events; 0 off CUDA), or None where the in-place
    result differs (then no step goes in place). One pair: its sums come in one order either way (several pairs
    add into `out` atomically, in any order)."""
    device = bank.device
    bank[0].copy_(block)
    x = torch.randn(1, layout.hidden, device=device).to(dtype)
    one = (bank, torch.zeros(1, 1, dtype=torch.int32, device=device), torch.ones(1, 1, device=device), layout.fmt,
           offsets, layout.intermediate)

    def bases_of(block: torch.Tensor) -> torch.Tensor:
        return torch.full((1, 1), block.data_ptr() - bank.data_ptr(), dtype=torch.int64, device=device)

    # the kernel reading through `bases` is compiled apart from the slots' one and may round a sum otherwise
    # (1 ulp): bitwise against itself reading the slot, and close to the slots' kernel
    bases = bases_of(host_block)
    in_slot = kernel(x, *one, bases=bases_of(bank[0]))
    if not (torch.equal(in_slot, kernel(x, *one, bases=bases))
            and torch.allclose(in_slot, kernel(x, *one), rtol=1e-4, atol=1e-6)):
        return None
    if device.type != "cuda":
        return 0.0

    def seconds(**kw) -> float:
        kernel(x, *one, **kw)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            kernel(x, *one, **kw)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / 5

    read_s = seconds(bases=bases) - seconds()
    return max(read_s - measure_copy_s(host_block, bank[0]), 0.0)
