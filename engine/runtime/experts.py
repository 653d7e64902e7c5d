"""The routed experts of one MoE layer, on blocks streamed into the device slot banks.

For the tokens of a layer (a whole prompt, or one decode token):
  1. one host sync reads the routed expert ids (and, in decode, the speculated ids of the next layer);
  2. experts already in the layer's bank compute first;
  3. the others come from the RAM cache, or from disk on the reader threads, over the copy stream
     into the bank, in batches no larger than the bank or the RAM cache; each copy records an event
     and the compute stream waits on those events only (no host sync);
  4. in decode, the next layer's speculated experts start copying into the other bank.
Hybrid execution: in a decode step the placement cost model (engine.runtime.placement) may give some
of the RAM-resident misses to the CPU, which computes them where they sit (engine.runtime.cpu_experts)
while the GPU computes the rest; their partial sums meet in `out`.
Residency is one policy, exclusive tiers: a block copied into VRAM is demoted in RAM, and a block
evicted from VRAM is written back to RAM, so RAM holds what VRAM does not and the two caches add up
(measured on the H200: RAM hit rate 5% when inclusive; see BENCHMARKS.md). A prefill is a sweep over
nearly every expert: its copies pass through a rotating pool of slots (slots.py), a RAM hit keeps its
place in RAM and a block read for it is the first RAM may drop, so both tiers keep what they held.
Compute: on CUDA, a few tokens run the self-checked Triton kernel straight on the bank (replayed from
CUDA graphs at decode); otherwise each expert runs the family's expert MLP in torch on the tokens
routed to it. On the CPU device every copy is synchronous and a resident expert is decoded once.
A copy into a bank first waits for the last compute that read the bank (`bank_free`), and a RAM block
stays locked until its copy has finished, so nothing is overwritten while in use.
"""
from __future__ import annotations

import os
import time
from collections import Counter
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Callable

import torch

from engine.format.layout import Layout
from engine.format.quant import dequantize
from engine.runtime.budget import prefill_expert_bytes
from engine.runtime.cache import RamCache
from engine.runtime.cpu_experts import FUSED_MAX_GROUP, MAX_TOKENS as CPU_MAX_TOKENS
from engine.runtime.cpu_experts import CpuExperts
from engine.runtime.cuda_driver import HostToDevice
from engine.runtime.slots import SlotBanks
from engine.runtime.speculation import score
from engine.runtime.switches import env_int
from engine.runtime.store import ExpertStore
from engine.runtime.telemetry import Telemetry
from engine.runtime.token_groups import token_groups

Key = tuple[int, int]
DEFAULT_BATCH = 32          # experts brought in per batch in prefill
FILL_READS = 2              # reads in flight, of any kind, below which RAM is filled in the background (`fill`)
KERNEL_MAX_TOKENS = 4       # above this many tokens the torch path (one matmul per expert) is faster
# A slot's expert on the CPU device through the fused kernel for up to this many tokens: on the 2-core dev
# machine, an OLMoE expert took 0.4 / 1.3 / 2.7 / 5.8 ms fused at 1 / 8 / 16 / 32 tokens, against 4.8-11.9 ms
# to decode its float copy and multiply (0.5 / 1.5 / 2.1 / 2.9 ms once the copy is kept in its slot).
FUSED_MAX_TOKENS = 16


def decoded_expert_bytes(layout: Layout, dtype: torch.dtype) -> int:
    """Bytes of one expert's gate, up and down decoded to the compute dtype (0 when the block already is)."""
    if layout.fmt == "bf16" and dtype == torch.bfloat16:
        return 0
    return 3 * layout.intermediate * layout.hidden * torch.empty((), dtype=dtype).element_size()


class Experts:
    def __init__(self, store: ExpertStore, cache: RamCache, banks: SlotBanks, telemetry: Telemetry, layout: Layout,
                 expert_mlp: Callable, dtype: torch.dtype, device: torch.device, kernel: Callable | None = None,
                 batch_size: int = DEFAULT_BATCH, cpu: CpuExperts | None = None, prefill_kernel=None):
        self.store, self.cache, self.banks, self.telemetry = store, cache, banks, telemetry
        self.layout, self.expert_mlp, self.dtype, self.kernel = layout, expert_mlp, dtype, kernel
        self.offsets = {f.name: f.offset for f in layout.fields}
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        self.batch_size = max(1, min(batch_size, banks.slots_per_bank, cache.num_slots))
        self.exclusive = True
        self.sweeps = env_int("SLUICE_SWEEP") != 0      # a prefill's misses rotate through a pool (slots.py)
        # a prefill's reads all queued at the layer's start, the next layer's behind them (`_start_pass_reads`)
        self.pass_reads = env_int("SLUICE_PASS_READS") == 1
        self.cpu = cpu               # hybrid execution: the CPU's share of RAM-resident experts, or None
        self.prefill_kernel = prefill_kernel    # kernels.moe_prefill.PrefillKernel, or None (torch loop)
        # With a CPU share, the next layer's prefetch is issued after it (measured faster on the H200 box: 64.1
        # against 56.2 tok/s, BENCHMARKS runs 21-22); SLUICE_PREFETCH_FIRST=1 issues it before, for an A/B.
        self.prefetch_first = os.environ.get("SLUICE_PREFETCH_FIRST", "0") == "1"
        # Disk reads started ahead for the better half of the next layer's guesses on a GPU, all of them
        # on the CPU device (see `_prefetch`); SLUICE_PREFETCH_READS=N: the best N (an A/B switch).
        self.prefetch_reads = env_int("SLUICE_PREFETCH_READS")
        # RAM hits copied ahead for the better half of the guesses (see `_prefetch`); SLUICE_PREFETCH_COPIES=N:
        # for the best N (an A/B switch)
        self.prefetch_copies = env_int("SLUICE_PREFETCH_COPIES")
        # The next layer's read-ahead starts as soon as this layer's own reads are queued, not after they
        # landed, so the disk is not left idle at each layer's end (see `_bring_in`; exceeds regime on the
        # H200 box: 4.26 / 4.09 tok/s against 4.00 / 3.68, alternated). SLUICE_EARLY_READS=0: after they landed.
        self.early_reads = env_int("SLUICE_EARLY_READS") != 0
        self._ahead: tuple[int, list[int]] | None = None   # (next layer, its guesses) for an early read-ahead
        self._read_ahead: dict[int, set[int]] = {}           # layer -> experts whose reads started early
        # Decoded weights per device slot on the CPU device (counted in its slot budget): an expert that
        # stays resident is decoded once, not once per token. CUDA reads blocks directly (kernels).
        self._decoded: dict[tuple[int, int], tuple[Key, dict]] | None = None if self.is_cuda else {}
        self.copy_stream = torch.cuda.Stream(self.device) if self.is_cuda else None
        # a block's copy through the driver, not torch's copy_ (engine.runtime.cuda_driver), where it loads
        self._h2d = HostToDevice.load() if self.is_cuda and banks.block_bytes == cache.block_bytes else None
        self._copy_handle = self.copy_stream.cuda_stream if self.is_cuda else 0
        self._slot_ready: dict[tuple[int, int], torch.cuda.Event] = {}     # (bank, slot) -> copy done
        # the last compute reading each bank: one event a bank, re-recorded (a copy's wait takes the record
        # made before it; a new event a layer cost the decode thread 5-11% of a token, BENCHMARKS run 78)
        self._bank_free = [torch.cuda.Event(), torch.cuda.Event()] if self.is_cuda else [None, None]
        self._inflight: list[tuple[torch.cuda.Event, Key]] = []             # (copy done, RAM block it reads/writes)
        self._timed: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []   # copy batches, for h2d busy time
        self._reads: dict[Key, tuple[int, Future]] = {}                    # prefetch disk reads in flight
        self._unused: set[Key] = set()            # of those, guesses their layer did not use (settled once landed)
        self._predicted: dict[int, set[int]] = {}
        self._prefetched: dict[int, set[int]] = {}
        self._pass_reads: Counter | None = None        # disk reads per (layer, expert) during a prefill
        # Index staging: pinned host rows -> device rows (stream-ordered, so reuse after the next
        # layer's host sync is safe: that sync waits for every copy enqueued before it). (Rows page-locked by
        # runtime.pinned instead of torch's allocator took the decode thread longer: 8.7% against 6.2%, run 81.)
        self._stage = [torch.empty(512, dtype=torch.int32, pin_memory=self.is_cuda) for _ in range(8)]
        self._stage_np = [row.numpy() for row in self._stage]
        self._stage_dev = [torch.empty(512, dtype=torch.int32, device=self.device) for _ in range(8)]
        self._stage_next = 0
        self._graphs: dict[int, tuple[list[torch.cuda.CUDAGraph], list[torch.Tensor]]] = {}   # see capture
        self._graph_pool = torch.cuda.graph_pool_handle() if self.is_cuda else None
        self._compute_stream = torch.cuda.current_stream(self.device) if self.is_cuda else None   # set by `run`
        self._batch_copies = 0                         # copies issued in the current `_copy_batch`
        self._batch_each = True                        # ... each with its own done event, or one for all
        self._batch_ready: list[tuple[int, int]] = []  # (bank, slot)s and RAM keys the batch's done event covers
        self._batch_keys: list[Key] = []
        self._deferred: tuple | None = None            # what `run(..., defer=True)` left for `run_deferred`
        self._fill_keys: list[Key] = []                # blocks `fill` may still read, the next one last

    # ------------------------------------------------------------------ prefill passes
    def begin_pass(self) -> None:
        """A prefill starts: count disk reads per expert (each should be read at most once a layer); its
        misses rotate through a pool of slots and keep the blocks resident before it (a sweep, slots.py;
        SLUICE_SWEEP=0: by recency, as in decode)."""
        self._pass_reads = Counter()
        if self.sweeps:
            self.banks.begin_sweep()

    def end_pass(self) -> None:
        for key in self.banks.end_sweep():       # still in VRAM after the sweep: RAM may drop them first again
            if self.exclusive:
                self.cache.demote(key)
        if self._pass_reads:
            self.telemetry.set_max(prefill_max_expert_reads=max(self._pass_reads.values()))
        self._pass_reads = None

    # ------------------------------------------------------------------ one layer
    def run(self, layer: int, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, out: torch.Tensor,
            next_layer: int | None = None, static_inputs: bool = False, defer: bool = False) -> torch.Tensor:
        """x [T, H], weights [T, K] -> the routed experts' weighted sum [T, H], written into `out`.
        ids: [T*K (+ P)] device ints: the routed expert ids, then the speculated experts of
        `next_layer` (prefetched while this layer runs). static_inputs: x, weights and out are the
        same tensors at every call for this layer (CUDA-graph buffers), so launches are replayed.
        defer: what the launches do not need (the next layer's prefetch, the use
        counts, telemetry and slot states) waits for `run_deferred`, which the decode calls once the next
        layer's mixer is enqueued: the GPU then computes that mixer while the decode thread does this work,
        instead of waiting for the thread. (A decode step's own misses are all protected while they are
        brought in, so their use counts, counted later, would not have changed a victim.)"""
        num_tokens, top_k = weights.shape
        if self.is_cuda and not static_inputs:     # a decode step's graphs: looked up once a step (`begin_step`)
            self._compute_stream = torch.cuda.current_stream(self.device)
        # on a GPU the CPU's share is a decode step's; the CPU device computes RAM-resident experts in place
        # for a prompt too (copying each into a slot first took 38% of a warm prefill, BENCHMARKS sessions 16-17)
        hybrid = self.cpu is not None and (num_tokens <= CPU_MAX_TOKENS or not self.is_cuda)
        if hybrid:
            self.cpu.stage(x, weights)
        ids_dev = ids
        waited = time.perf_counter()
        ids = ids.tolist()                                                   # the one host sync of the layer
        waited = time.perf_counter() - waited
        routed, guesses = ids[:num_tokens * top_k], ids[num_tokens * top_k:]
        in_pass = self._pass_reads is not None                  # a prefill: its guesses only start reads
        predicted = [] if in_pass else list(dict.fromkeys(guesses))                  # guesses, best first
        self._unlock_finished_copies()
        wanted = list(dict.fromkeys(routed))                                 # unique, in routing order
        if not defer:
            self._count_copy_time()
        self._score_speculation(layer, set(wanted))    # before `_bring_in`: its wrong guesses' reads may settle
        if not defer:
            self.banks.note_used(layer, routed)
        slot_of, late = {}, []
        for expert in wanted:
            slot = self.banks.find((layer, expert))
            if slot is None:
                late.append(expert)
            else:
                slot_of[expert] = slot
        counts = dict(vram_hits=len(slot_of), vram_misses=len(late), sync_wait_s=waited)
        if not defer:
            self.telemetry.add(**counts)
        if in_pass and self.pass_reads:
            self._start_pass_reads(layer, late, next_layer, guesses)
        if self.early_reads and next_layer is not None and predicted:
            self._ahead = (next_layer, predicted)
        on_cpu = self._cpu_share(layer, late, num_tokens) if hybrid and late else []
        if on_cpu:
            late = [e for e in late if e not in on_cpu]
            cpu_blocks = {e: self.cache.block(self.cache.lookup((layer, e))) for e in on_cpu}
            for e in on_cpu:
                self.cache.lock((layer, e))
            # the CPU device has nothing to overlap: its share first, its RAM blocks unlocked before the slot path's reads
            cpu_y = None if self.is_cuda else self._cpu_compute(layer, cpu_blocks, routed, top_k, x, weights)
        use_kernel = self.kernel is not None and num_tokens <= KERNEL_MAX_TOKENS and len(wanted) <= self.batch_size
        if use_kernel:
            early = list(slot_of)
            if late:
                slot_of.update(self._bring_in(layer, late, protected={(layer, e) for e in wanted}))
            self._kernel_launches(layer, x, weights, routed, top_k, slot_of, early, late, out, static_inputs)
            self._mark_bank_free(layer)
            if not defer:
                self._set_ready(layer, slot_of)
        else:
            grouped = self.prefill_kernel is not None and num_tokens > KERNEL_MAX_TOKENS
            routed_dev = ids_dev[:num_tokens * top_k]
            (self._kernel_layer if grouped else self._torch_layer)(layer, x, weights, routed, routed_dev, top_k,
                                                                   slot_of, late, out)
        if next_layer is not None and predicted and self.prefetch_first:
            self._prefetch(next_layer, predicted)
        if on_cpu:                                   # the GPU's share is enqueued: the CPU does its own now
            if self.is_cuda:
                cpu_y = self._cpu_compute(layer, cpu_blocks, routed, top_k, x, weights)
            self.cpu.add_into(cpu_y, out)
        late_prefetch = next_layer if next_layer is not None and predicted and not self.prefetch_first else None
        if defer:
            self._deferred = (late_prefetch, predicted, layer, routed, counts, slot_of if use_kernel else {})
        elif late_prefetch is not None:
            self._prefetch(late_prefetch, predicted)
        return out

    def _cpu_compute(self, layer: int, blocks: dict[int, torch.Tensor], routed: list[int], top_k: int,
                     x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The CPU's share [T, H] float32 from its locked RAM blocks, which are unlocked after it."""
        try:
            return self.cpu.compute(blocks, routed, top_k, x, weights)
        finally:
            for expert in blocks:
                self.cache.unlock((layer, expert))

    def begin_step(self) -> None:
        """A decode step starts: its layers' launches go to the stream current now (one lookup, not one a layer);
        the copies' busy time of the steps before is counted (once a step, not once a layer)."""
        if self.is_cuda:
            self._compute_stream = torch.cuda.current_stream(self.device)
            self._count_copy_time()

    def run_deferred(self) -> None:
        """The work a `run(..., defer=True)` left: its use counts, telemetry and next layer's prefetch (the
        copies' busy time is counted by the next `begin_step`)."""
        if self._deferred is None:
            return
        (next_layer, predicted, layer, routed, counts, ready), self._deferred = self._deferred, None
        self.banks.note_used(layer, routed)
        self.telemetry.add(**counts)
        self._set_ready(layer, ready)
        if next_layer is not None:
            self._prefetch(next_layer, predicted)

    def _start_pass_reads(self, layer: int, late: list[int], next_layer: int | None, guesses: list[int]) -> None:
        """A prefill keeps the disk busy: every miss of this layer that neither tier holds is read now (not
        batch by batch), then, behind them, the next MoE layer's experts its router picks on this layer's
        input for some token (`guesses`, most picked first), as long as RAM has a block to spare for them
        (free, or also in VRAM: a read ahead must not evict a block a later layer hits). Reads in flight
        lock at most half the RAM cache's blocks."""
        room = self.cache.num_slots // 2 - len(self._reads)
        ahead = [e for e, _ in Counter(guesses).most_common()] if next_layer is not None else []
        keys = [(layer, e) for e in late] + [(next_layer, e) for e in ahead]
        for i, key in enumerate(keys):
            if room <= 0 or not (self.cache.can_insert() if i < len(late) else self.cache.has_spare()):
                break
            if key in self._reads or key in self.cache or self.banks.holds(key):
                continue
            self._reads[key] = self._start_read(key)
            room -= 1

    def _cpu_share(self, layer: int, late: list[int], num_tokens: int) -> list[int]:
        """The misses the CPU computes from the RAM cache (placement cost model); the rest are copied."""
        candidates = [e for e in late if (layer, e) in self.cache and (layer, e) not in self._reads]
        queued = len(self._inflight) - _finished_prefix([done for done, _ in self._inflight]) if self.is_cuda else 0
        return self.cpu.placement.cpu_share(candidates, num_tokens, lambda e: self.banks.uses((layer, e)), queued)

    def _torch_layer(self, layer, x, weights, routed, routed_dev, top_k, resident, late, out) -> None:
        """Each expert in torch on its tokens: the resident ones, then the rest in batches."""
        groups = token_groups(routed, routed_dev, top_k)
        out.zero_()
        self._torch_experts(layer, x, weights, groups, resident, out)
        for start in range(0, len(late), self.batch_size):
            batch = late[start:start + self.batch_size]
            placed = self._bring_in(layer, batch, protected={(layer, e) for e in batch}, each=True)
            self._torch_experts(layer, x, weights, groups, placed, out)

    def _kernel_layer(self, layer, x, weights, routed, routed_dev, top_k, resident, late, out) -> None:
        """The prefill kernel, one call for the resident experts, then one per batch brought in (after its
        copies), the torch path's batches and bank protocol; the pairs are sorted once, in that order."""
        routing = self.prefill_kernel.route(routed, routed_dev, list(resident) + late, top_k)
        workspace = prefill_expert_bytes(self.layout.intermediate, self.layout.hidden, x.shape[0])
        x, weights, bank = x.contiguous(), weights.float().contiguous(), self.banks.bank_of(layer)
        out.zero_()
        batches = [late[start:start + self.batch_size] for start in range(0, len(late), self.batch_size)]
        for batch in [None, *batches]:                                          # None: the resident experts
            slot_of = resident if batch is None else self._bring_in(layer, batch, protected={(layer, e) for e in batch})
            if not slot_of:
                continue
            self._wait_slots(bank, list(slot_of.values()))
            for expert, slot in slot_of.items():
                self.banks.set_state((layer, expert), slot, "computing")
            self.prefill_kernel(x, self.banks.banks[bank], routing, slot_of, weights, self.layout.fmt, self.offsets,
                                self.layout.intermediate, out, workspace_bytes=workspace)
            self._mark_bank_free(layer)
            self._set_ready(layer, slot_of)

    def _torch_experts(self, layer, x, weights, groups, slot_of: dict[int, int], out) -> None:
        if not slot_of:
            return
        bank = self.banks.bank_of(layer)
        fuses = self._fuses(x, out)
        for expert, slot in slot_of.items():
            self._wait_slots(bank, [slot])
            self.banks.set_state((layer, expert), slot, "computing")
            token_idx, k_idx = groups[expert]
            if fuses and self._fused_beats((layer, expert), bank, slot, len(token_idx)):   # the int8 block as it is
                self.cpu.fused_into(out, x, self.banks.banks[bank][slot], token_idx, weights[token_idx, k_idx])
                continue
            y = self.expert_mlp(x[token_idx], self._expert_weights(layer, expert, bank, slot))
            out.index_add_(0, token_idx, (y * weights[token_idx, k_idx, None]).to(out.dtype))
        self._mark_bank_free(layer)
        self._set_ready(layer, slot_of)

    def _fused_beats(self, key: Key, bank: int, slot: int, num_tokens: int) -> bool:
        """Whether the fused kernel computes this slot's expert for num_tokens faster than torch: always up to
        FUSED_MAX_TOKENS; up to the CPU share's FUSED_MAX_GROUP where the slot keeps no float copy of it (a
        prompt's sweep rotates the slots, so torch would dequantise the block first)."""
        if num_tokens <= FUSED_MAX_TOKENS:
            return True
        cached = self._decoded.get((bank, slot)) if self._decoded is not None else None
        return num_tokens <= FUSED_MAX_GROUP and (cached is None or cached[0] != key)

    def _fuses(self, x: torch.Tensor, out: torch.Tensor) -> bool:
        """On the CPU device in float32, with the fused CPU kernel chosen at load, a slot's int8 block is
        computed as it is (kernels.cpu_moe), not decoded to a float copy first (BENCHMARKS.md session 16).
        In bfloat16 the slot keeps torch's path: its products round as the reference's do."""
        return (self.cpu is not None and self.cpu.fused and not self.is_cuda
                and x.dtype == out.dtype == torch.float32)

    def _expert_weights(self, layer: int, expert: int, bank: int, slot: int) -> dict[str, torch.Tensor]:
        """The expert in this slot, dequantised to the compute dtype (parts named gate, up, down, and
        e.g. gate_bias where the family has them)."""
        if self._decoded is not None:
            cached = self._decoded.get((bank, slot))
            if cached is not None and cached[0] == (layer, expert):
                return cached[1]
        parts = self.layout.parts(self.banks.banks[bank][slot])
        decoded = {proj: dequantize(p, self.layout.fmt, self.dtype) for proj, p in parts.items()}
        if self._decoded is not None:
            self._decoded[(bank, slot)] = ((layer, expert), decoded)
        return decoded

    def _wait_slots(self, bank: int, slots: list[int]) -> None:
        """The compute stream waits for these slots' copies (each distinct done event once)."""
        if self.is_cuda:
            events = {self._slot_ready.pop((bank, slot), None) for slot in slots}
            events.discard(None)
            for event in events:
                self._compute_stream.wait_event(event)

    def _mark_bank_free(self, layer: int) -> None:
        if self.is_cuda:
            self._bank_free[self.banks.bank_of(layer)].record(self._compute_stream)

    def _set_ready(self, layer: int, slot_of: dict[int, int]) -> None:
        for expert, slot in slot_of.items():
            self.banks.set_state((layer, expert), slot, "ready")

    # ------------------------------------------------------------------ kernels (CUDA, few tokens)
    def _kernel_launches(self, layer, x, weights, routed, top_k, slot_of, early, late, out, static_inputs) -> None:
        """Fused-kernel launches into `out`: for one token the resident experts first (the others'
        slots are -1: the kernel reads nothing for them), then, after their copy events, the late
        ones added on top. Several tokens run in one launch once everything is in."""
        num_tokens = x.shape[0]
        bank = self.banks.bank_of(layer)
        groups = [early, late] if num_tokens == 1 and early and late else [early + late]
        rows = []
        for group in groups:
            members = set(group) if len(groups) > 1 else None
            rows.append([slot_of.get(e, -1) if members is None or e in members else -1 for e in routed])
        replay = static_inputs and num_tokens == 1 and layer in self._graphs
        if replay:                                   # both groups' slot rows in one upload
            graphs, flat_rows = self._graphs[layer]
            self._upload([s for row in rows for s in row], flat_rows[len(rows) - 1])
        for i, group in enumerate(groups):
            self._wait_slots(bank, [slot_of[e] for e in group])
            if replay:
                graphs[i > 0].replay()
                continue
            index = self._upload(rows[i]).view(num_tokens, top_k)
            self.kernel(x, self.banks.banks[bank], index, weights.float(), self.layout.fmt, self.offsets,
                        self.layout.intermediate, out=out, accumulate=i > 0)

    def _upload(self, values: list[int], dst: torch.Tensor | None = None) -> torch.Tensor:
        """int32 values on the device through a pinned staging row, into `dst` if given."""
        i = self._stage_next
        self._stage_next = (i + 1) % len(self._stage)
        n = len(values)
        self._stage_np[i][:n] = values
        dst = self._stage_dev[i][:n] if dst is None else dst
        return dst.copy_(self._stage[i][:n], non_blocking=True)

    def capture(self, layers: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
        """Capture the one-token kernel launches of each layer in CUDA graphs, two per layer (write
        `out`, add into `out`), over static inputs {layer: (x [1, H], weights [1, K], out [1, H])}
        (the decode step's buffers). The expert slots are a static int32 row per layer, uploaded
        before each replay. Done once at load, so no capture happens while tokens are timed."""
        for layer, (x, weights, out) in layers.items():
            bank = self.banks.bank_of(layer)
            index = torch.zeros(2, weights.shape[1], dtype=torch.int32, device=self.device)   # slot 0: valid bytes
            graphs = []
            for accumulate in (False, True):
                launch = lambda: self.kernel(x, self.banks.banks[bank], index[int(accumulate)][None],  # noqa: E731
                                             weights.float(), self.layout.fmt, self.offsets,
                                             self.layout.intermediate, out=out, accumulate=accumulate)
                launch()                                          # compile / warm up outside the capture
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._graph_pool):
                    launch()
                graphs.append(graph)
            self._graphs[layer] = (graphs, [index[:1].view(-1), index.view(-1)])  # [write, add] graphs; 1 or 2 slot rows
        torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------ transfers
    def _bring_in(self, layer: int, experts: list[int], protected: set[Key], each: bool = False) -> dict[int, int]:
        """Make experts resident in layer's bank; returns {expert: slot}. RAM hits are copied first,
        disk reads are all in flight before the first wait. each: every copy gets its own done event (the
        torch path computes each expert as soon as it lands); else the RAM hits share one (the kernel
        computes them all in one launch anyway, and an event costs the decode thread ~5-10 us)."""
        in_ram, from_disk = [], []
        for expert in experts:
            key = (layer, expert)
            pending = self._reads.pop(key, None)
            if pending is not None:
                from_disk.append((expert, *pending))
                continue
            ram_slot = self.cache.lookup(key)
            if ram_slot is not None:
                self.cache.lock(key)
                in_ram.append((expert, ram_slot))
            else:
                from_disk.append((expert, *self._start_read(key)))
        placed = {}
        with self._copy_batch(layer, each):
            for expert, ram_slot in in_ram:
                placed[expert] = self._copy(layer, expert, ram_slot, protected, ram_hit=True)
        if from_disk and self._ahead is not None:     # queued behind this layer's reads: they go first
            (ahead, guesses), self._ahead = self._ahead, None
            self._read_ahead[ahead] = self._prefetch_reads(ahead, guesses)
        for i, (expert, ram_slot, future) in enumerate(from_disk):
            try:
                self._finish_read((layer, expert), future)
            except BaseException:
                self._abandon_reads(layer, from_disk[i + 1:])
                raise
            with self._copy_batch(layer):
                placed[expert] = self._copy(layer, expert, ram_slot, protected)
        return placed

    def _start_read(self, key: Key) -> tuple[int, Future]:
        if not self.cache.can_insert():      # every RAM block is locked by a copy in flight: let them land
            self._wait_copies()
        if not self.cache.can_insert():      # or by reads of wrong guesses still in flight
            self._settle_unused(wait=True)
        ram_slot = self.cache.insert(key)
        self.cache.lock(key)
        if self._pass_reads is not None:
            self._pass_reads[key] += 1
        return ram_slot, self.store.submit(*key, self.cache.block(ram_slot).numpy())

    def _finish_read(self, key: Key, future: Future) -> None:
        start = time.perf_counter()
        try:
            future.result()
            self.telemetry.add(read_wait_s=time.perf_counter() - start)
        except BaseException:
            self.cache.unlock(key)
            self.cache.discard(key)
            raise

    def _abandon_reads(self, layer: int, reads) -> None:
        """After a failed read: the batch's other reads must not land in a reused RAM slot."""
        for expert, _, future in reads:
            if not future.cancel():
                future.exception()
            self.cache.unlock((layer, expert))
            self.cache.discard((layer, expert))

    @contextmanager
    def _copy_batch(self, layer: int, each: bool = False):
        """Copies into layer's bank issued inside, on the copy stream after the last compute that read
        the bank; the batch is timed as a whole (h2d busy time) by one pair of events, whose end also
        marks every copy done unless `each` copy records its own."""
        self._batch_copies = 0
        if not self.is_cuda:
            try:
                yield
            finally:
                self.telemetry.add(h2d_bytes=self._batch_copies * self.cache.block_bytes)
            return
        bank = self.banks.bank_of(layer)
        issued, self._batch_each = time.perf_counter(), each
        self._batch_ready, self._batch_keys = [], []
        torch.cuda.set_stream(self.copy_stream)      # (cheaper than torch.cuda.stream's context: ~40 us a batch)
        start = torch.cuda.Event(enable_timing=True)
        try:
            self.copy_stream.wait_event(self._bank_free[bank])     # (none recorded yet: no wait)
            start.record(self.copy_stream)
            yield
        finally:        # also when a copy failed: the ones issued before it keep their done event and RAM locks
            end = torch.cuda.Event(enable_timing=True)
            end.record(self.copy_stream)
            torch.cuda.set_stream(self._compute_stream)
            self._timed.append((start, end))
            for bank_slot in self._batch_ready:
                self._slot_ready[bank_slot] = end
            self._inflight += [(end, key) for key in self._batch_keys]
            self.telemetry.add(h2d_bytes=self._batch_copies * self.cache.block_bytes)
        if self.cpu is not None:          # the decode thread's time to issue a copy, for the placement
            self.cpu.placement.observe_copies(time.perf_counter() - issued, self._batch_copies)

    def _copy(self, layer: int, expert: int, ram_slot: int, protected: set[Key], ram_hit: bool = False) -> int:
        """Copy a locked RAM block into a slot of layer's bank (inside `_copy_batch`); the RAM lock is
        released when the copy is done. In a sweep (a prefill, see slots.py) the copy is a passing one: a
        RAM hit keeps its place in RAM, and a block the sweep evicts again is not written back."""
        key = (layer, expert)
        bank = self.banks.bank_of(layer)
        slot = self.banks.acquire(key, protected)
        evicted = self.banks.last_evicted
        passing = self.banks.sweeping
        write_back = self._victim_slot(evicted[0]) if evicted and self.exclusive and not (
            passing and self.banks.last_evicted_swept) else None
        dst, src = self.banks.block(key, slot), self.cache.block(ram_slot)
        self._batch_copies += 1
        if self.exclusive and not (passing and ram_hit):
            self.cache.demote(key)
        if not self.is_cuda:
            if write_back is not None:
                self.cache.block(write_back).copy_(dst)
                self.cache.unlock(evicted[0])
            start = time.perf_counter()
            dst.copy_(src)
            self.telemetry.add(h2d_busy_s=time.perf_counter() - start)
            self.cache.unlock(key)
            return slot
        if write_back is not None:           # same stream: the victim's bytes leave before new ones land
            self.cache.block(write_back).copy_(dst, non_blocking=True)
        if self._h2d is not None:
            self._h2d(dst.data_ptr(), src.data_ptr(), self.cache.block_bytes, self._copy_handle)
        else:
            dst.copy_(src, non_blocking=True)
        done = [evicted[0], key] if write_back is not None else [key]
        if not self._batch_each:
            self._batch_ready.append((bank, slot))
            self._batch_keys += done
            return slot
        end = torch.cuda.Event()
        end.record(self.copy_stream)
        self._slot_ready[(bank, slot)] = end
        self._inflight += [(end, k) for k in done]
        return slot

    def _victim_slot(self, victim: Key) -> int | None:
        """RAM slot to write an evicted VRAM block back into (locked), or None: already in RAM (made
        recent instead), or no RAM slot can be freed right now."""
        if victim in self.cache:
            self.cache.touch(victim)
            return None
        if not self.cache.can_insert():
            return None
        ram_slot = self.cache.insert(victim)
        self.cache.lock(victim)
        self.telemetry.add(d2h_bytes=self.cache.block_bytes)
        return ram_slot

    def _wait_copies(self) -> None:
        for end, _ in self._inflight:
            end.synchronize()
        self._release_finished_copies()

    def _release_finished_copies(self) -> None:
        self._unlock_finished_copies()
        self._count_copy_time()

    def _unlock_finished_copies(self) -> None:
        """Unlock the RAM blocks whose copies have finished. All copies run in order on the one copy
        stream, so the first unfinished one ends the scan."""
        done = _finished_prefix([end for end, _ in self._inflight])
        for _, key in self._inflight[:done]:
            self.cache.unlock(key)
        del self._inflight[:done]

    def _count_copy_time(self) -> None:
        """Add the finished copy batches' h2d busy time (telemetry)."""
        done = _finished_prefix([end for _, end in self._timed])
        for start, end in self._timed[:done]:
            self.telemetry.add(h2d_busy_s=start.elapsed_time(end) / 1e3)
        del self._timed[:done]

    # ------------------------------------------------------------------ speculation
    def _prefetch(self, layer: int, experts: list[int]) -> None:
        """Start bringing `layer`'s predicted experts (best guess first), for the better half of the
        guesses: RAM hits copy now (other bank, copy stream); on a GPU a disk read starts, to be copied
        when the layer asks for it (on the CPU device a read starts for every guess: see below).
        Copies: ahead for the lower half they cost more than they saved. On the H200 box (fits-ram) decode
        went 73.4 -> 83.0 tok/s and h2d 0.55 -> 0.41 GB a token without them (BENCHMARKS session 6): PCIe
        is nearly busy there, and a wrong copy also evicts a resident expert.
        Reads: one ahead saves no bytes (a used expert is read anyway) and a wrong one costs a whole block
        from the disk, which on a GPU is the bottleneck once the model exceeds RAM (the exceeds and
        fits-vram-ram runs are disk-bound): the lower half of the guesses were used 53% of the time against
        79% for the upper half, and reading ahead for them took disk bytes a token from 0.38 to 0.48 GB
        (CPU device, session 5) and 0.50 to 0.61 GB on the H200 (session 6). On the CPU device the compute
        is the bottleneck and the disk waits anyway, so every guess is read ahead there.
        With a CPU share, the coldest RAM hits stay where they are, for the CPU (placement.prefetch_count)."""
        self._predicted[layer] = set(experts)
        self._ahead = None
        copy_ahead = max(1, len(experts) // 2) if self.prefetch_copies is None else self.prefetch_copies
        keys = {(layer, e) for e in experts}
        in_ram = []
        for expert in experts[:copy_ahead]:                      # best guess first
            key = (layer, expert)
            if self.banks.find(key) is not None or key in self._reads:
                continue
            ram_slot = self.cache.lookup(key)
            if ram_slot is not None:                 # locked at once: a read started below must not evict it
                self.cache.lock(key)
                in_ram.append((expert, ram_slot))
        issued = self._read_ahead.pop(layer, None)
        if issued is None:
            issued = self._prefetch_reads(layer, experts)
        to_copy = self._prefetch_copies(layer, in_ram)
        for expert in {e for e, _ in in_ram} - {e for e, _ in to_copy}:   # left to the CPU: unlocked again
            self.cache.unlock((layer, expert))
        if to_copy:
            with self._copy_batch(layer):
                for expert, ram_slot in to_copy:
                    self._copy(layer, expert, ram_slot, protected=keys)
                    issued.add(expert)
        self._prefetched[layer] = issued
        self.telemetry.add(prefetch_issued=len(issued))

    def _prefetch_reads(self, layer: int, experts: list[int]) -> set[int]:
        """Start disk reads for the best guesses (all on the CPU device, the better half on a GPU: see
        `_prefetch`) that neither tier holds; a prefetch never waits for a RAM block. Returns their experts."""
        read_ahead = self.prefetch_reads
        if read_ahead is None:
            read_ahead = max(1, len(experts) // 2) if self.is_cuda else len(experts)
        issued = set()
        for expert in experts[:read_ahead]:
            key = (layer, expert)
            if self.banks.find(key) is not None or key in self._reads or key in self.cache:
                continue
            if not self.cache.can_insert():
                break
            self._reads[key] = self._start_read(key)
            issued.add(expert)
        return issued

    def _prefetch_copies(self, layer: int, in_ram: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The predicted RAM hits worth copying ahead: all of them, or with a CPU share the hottest
        ones, so that the CPU can compute the rest in about the time their copies would take."""
        if self.cpu is None or not in_ram:
            return in_ram
        count = self.cpu.placement.prefetch_count(len(in_ram))
        return sorted(in_ram, key=lambda e: -self.banks.uses((layer, e[0])))[:count]

    def _score_speculation(self, layer: int, actual: set[int]) -> None:
        predicted = self._predicted.pop(layer, None)
        correct, needed = score(predicted, actual) if predicted is not None else (0, 0)
        prefetched = self._prefetched.pop(layer, set())
        self.telemetry.add(spec_correct=correct, spec_predicted=needed, prefetch_used=len(prefetched & actual))
        # Reads started for experts this layer did not use: once one lands its RAM slot holds the block (and is
        # unlocked); the decode thread does not wait for one still in flight before its own layer's reads.
        self._unused.update(k for k in self._reads if k[0] == layer and k[1] not in actual)
        self._settle_unused(wait=False)

    def _settle_unused(self, wait: bool) -> None:
        for key in list(self._unused):
            if key not in self._reads:                 # asked for after all: _bring_in took it
                self._unused.discard(key)
            elif wait or self._reads[key][1].done():
                self._unused.discard(key)
                self._settle_read(key)

    def _settle_read(self, key: Key) -> None:
        _, future = self._reads.pop(key)
        try:
            self._finish_read(key, future)
            self.cache.unlock(key)
        except Exception:      # noqa: BLE001 - a failed speculative read only loses the prefetch
            pass

    # ------------------------------------------------------------------ filling RAM in the background
    def plan_fill(self, keys: list[Key]) -> None:
        """The blocks `fill` reads, in this order (the model's, layer by layer: a prompt's pass starts at layer 0)."""
        self._fill_keys = list(reversed(keys))

    def fill(self, reads: int = FILL_READS, grow: bool = True) -> bool:
        """Read blocks that neither tier holds into free RAM slots, never evicting one, while the disk has fewer
        than `reads` reads in flight (a layer's own reads and guesses go first; the caller holds the engine, as a
        layer does). A block read here is one the model will use later (a prompt's pass reads nearly every
        expert; a decode keeps finding the few no prompt has used), and where RAM holds the whole model it then
        never waits for the disk again. The reads settle as a wrong guess's do (`_settle_unused`). Without
        `grow`, only where no allocation waits (RamCache.has_free): a decode step must not wait while a chunk of
        the cache is page-locked (~10 ms for 16 blocks). Returns whether there may be more to read: False once every
        block has a place or RAM has no free slot left."""
        if not self._fill_keys:                    # (a decode step asks every token: nothing to do once done)
            return False
        self._settle_unused(wait=False)
        while self._fill_keys and len(self._reads) < reads:
            if not self.cache.has_free(grow):
                if grow or not self.cache.has_free():
                    self._fill_keys = []
                break
            key = self._fill_keys.pop()
            if key in self.cache or key in self._reads or self.banks.holds(key):
                continue
            self._reads[key] = self._start_read(key)
            self._unused.add(key)
            self.telemetry.add(ram_fill_reads=1)
        return bool(self._fill_keys)

    def synchronize(self) -> None:
        """Wait for every copy and release every lock (end of a generation, before closing)."""
        self._deferred = None              # a step cut short: its prefetch is moot, its guesses cleared below
        if self.is_cuda:
            self.copy_stream.synchronize()
        self._release_finished_copies()
        for key in list(self._reads):
            self._settle_read(key)
        self._unused.clear()
        self._predicted.clear()
        self._prefetched.clear()
        self._read_ahead.clear()
        self._ahead = None


def _finished_prefix(events: list) -> int:
    """How many of the events, recorded in this order on one stream, have completed (a copy batch's
    event stands for each of its copies: it is asked once)."""
    done = None
    for i, event in enumerate(events):
        if event is not done:
            if not event.query():
                return i
            done = event
    return len(events)
