"""The routed experts of the MoE layers, on blocks streamed into the device slot banks: the coordinator.

For the tokens of a layer (a whole prompt, or one decode token):
  1. one host sync reads the routed expert ids (and, in decode, the speculated ids of the next layer);
  2. experts already in the layer's bank compute first;
  3. the others come from the RAM cache, or from disk on the reader threads, into the bank, in batches no
     larger than the bank or the RAM cache;
  4. in decode, the next layer's speculated experts start coming into the other bank.
Who does what: residency.py decides (what is resident, what to evict, what to bring ahead), reads.py reads
from disk, the mover (movers.py, one per device kind) copies, expert_compute.py computes. Hybrid execution:
in a decode step the placement cost model (placement.py) may give some RAM-resident misses to the CPU, which
computes them where they sit (cpu_experts.py) while the device computes the rest; their partial sums meet in
`out`. The CPU device computing int8 experts in place reads its disk misses into the RAM cache and computes them
there too: nothing is copied into its slots.
"""
from __future__ import annotations

import time
from collections import Counter

import torch

from engine.format.layout import Layout
from engine.runtime.cache import RamCache
from engine.runtime.cpu_experts import CpuExperts
from engine.runtime.expert_compute import CpuShare, LayerCall, LayerCompute
from engine.runtime.movers import make_mover
from engine.runtime.reads import DiskReads
from engine.runtime.residency import (FillPlan, Key, copies_ahead, hottest, keys_to_read, reads_ahead,
                                      split_resident)
from engine.runtime.slots import SlotBanks
from engine.runtime.speculation import score
from engine.runtime.store import ExpertStore
from engine.runtime.telemetry import Telemetry
from kernels.quant_formats import QUANT_FORMATS

DEFAULT_BATCH = 32          # experts brought in per batch in prefill
FILL_READS = 2              # reads in flight, of any kind, below which RAM is filled in the background (`fill`)


def decoded_expert_bytes(layout: Layout, dtype: torch.dtype) -> int:
    """Bytes of one expert's gate (where it has one), up and down decoded to the compute dtype (0 when the block
    already is)."""
    if layout.fmt == "bf16" and dtype == torch.bfloat16:
        return 0
    projections = 3 if layout.is_gated else 2
    return projections * layout.intermediate * layout.hidden * torch.empty((), dtype=dtype).element_size()


class Experts:
    def __init__(self, store: ExpertStore, cache: RamCache, banks: SlotBanks, telemetry: Telemetry, layout: Layout,
                 expert_mlp, dtype: torch.dtype, device: torch.device, kernel=None, batch_size: int = DEFAULT_BATCH,
                 cpu: CpuExperts | None = None, prefill_kernel=None, prefetch_reads: int | None = None,
                 prefetch_copies: int | None = None, pacing=None):
        """prefetch_reads / prefetch_copies: how many of the next layer's best guesses start a disk read / a
        copy ahead (None: residency.reads_ahead's and copies_ahead's rule); pacing: the movers' simulated slower
        link (engine.runtime.pacing), or None."""
        self.store, self.cache, self.banks, self.telemetry = store, cache, banks, telemetry
        self.device = torch.device(device)
        self.batch_size = max(1, min(batch_size, banks.slots_per_bank, cache.num_slots))
        self._cpu_batch = max(1, min(batch_size, cache.num_slots))      # reads for the CPU device's in-place share
        self.cpu = cpu               # hybrid execution: the CPU's share of RAM-resident experts, or None
        self.prefetch_reads, self.prefetch_copies = prefetch_reads, prefetch_copies
        self.mover = make_mover(self.device, banks, cache, telemetry, cpu.placement if cpu is not None else None,
                                pacing)
        # the CPU device computing every RAM-resident expert where it sits: a disk miss is read into RAM and
        # computed there too (a copy into a slot would be one more pass over memory, and the slot path may
        # dequantise the block first); fixed at load, so decided once
        self._cpu_takes_reads = (cpu is not None and not self.mover.is_async and cpu.placement.mode == "all"
                                 and QUANT_FORMATS[cpu.layout.fmt].cpu_in_place)
        fused_slots = cpu if cpu is not None and cpu.fused and not self.mover.is_async else None
        self.compute = LayerCompute(banks, self.mover, layout, expert_mlp, dtype, self.batch_size, kernel,
                                    prefill_kernel, fused_slots)
        self.reads = DiskReads(store, cache, telemetry, self.mover.wait_copies)
        self._ahead: tuple[int, list[int]] | None = None   # (next layer, its guesses) for an early read-ahead
        self._read_ahead: dict[int, set[int]] = {}           # layer -> experts whose reads started early
        self._predicted: dict[int, set[int]] = {}
        self._prefetched: dict[int, set[int]] = {}
        self._deferred: tuple | None = None            # what `run(..., defer=True)` left for `run_deferred`
        self._fill = FillPlan()

    # ------------------------------------------------------------------ prefill passes
    def begin_pass(self) -> None:
        """A prefill starts: count disk reads per expert (each should be read at most once a layer); its misses
        rotate through a pool of slots and keep the blocks resident before it (a sweep, residency.py)."""
        self.reads.pass_counts = Counter()
        self.banks.begin_sweep()

    def end_pass(self) -> None:
        for key in self.banks.end_sweep():       # still in VRAM after the sweep: RAM may drop them first again
            self.cache.demote(key)
        if self.reads.pass_counts:
            self.telemetry.set_max(prefill_max_expert_reads=max(self.reads.pass_counts.values()))
        self.reads.pass_counts = None

    # ------------------------------------------------------------------ one layer
    def run(self, layer: int, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, out: torch.Tensor,
            next_layer: int | None = None, static_inputs: bool = False, defer: bool = False) -> torch.Tensor:
        """x [T, H], weights [T, K] -> the routed experts' weighted sum [T, H], written into `out`.
        ids: [T*K (+ P)] device ints: the routed expert ids, then the speculated experts of `next_layer`
        (prefetched while this layer runs). static_inputs: x, weights and out are the same tensors at every
        call for this layer (CUDA-graph buffers), so launches are replayed. defer: what the launches do not
        need (the next layer's prefetch, the use counts, telemetry and slot states) waits for `run_deferred`,
        which the decode calls once the next layer's mixer is enqueued: the GPU then computes that mixer while
        the decode thread does this work. (A decode step's own misses are all protected while they are
        brought in, so their use counts, counted later, would not have changed a victim.)"""
        num_tokens, top_k = weights.shape
        hybrid = self._stage(x, weights, static_inputs)
        routed, predicted, waited = _host_ids(ids, num_tokens * top_k)
        wanted, slot_of, late, counts = self._find(layer, routed, waited, defer)
        if next_layer is not None and predicted:   # read ahead as soon as this layer's own reads are queued
            self._ahead = (next_layer, predicted)
        call = LayerCall(layer, x, weights, routed, ids, out)
        share = self._cpu_share(call, late) if hybrid and late else None
        if share is not None:
            late = [e for e in late if e not in share.blocks]
        read_for_cpu, late = (late, []) if hybrid and self._cpu_takes_reads else ([], late)
        ready = self._compute(call, wanted, slot_of, late, static_inputs, defer)
        if share is not None:              # the device's share is enqueued: the CPU does its own now
            share.add_into(call)
        if read_for_cpu:
            self._read_for_cpu(call, read_for_cpu)
        prefetch = next_layer if next_layer is not None and predicted else None
        if defer:
            self._deferred = (prefetch, predicted, layer, routed, counts, ready, None if late else wanted)
        elif prefetch is not None:
            self._prefetch(prefetch, predicted)
        return out

    def _stage(self, x: torch.Tensor, weights: torch.Tensor, static_inputs: bool) -> bool:
        """Before the layer's host sync -> whether the CPU may take a share of this layer (its inputs then
        start on their way to the host)."""
        if not static_inputs:        # a decode step's graphs: the stream is looked up once a step (`begin_step`)
            self.mover.follow_compute_stream()
        # on a GPU the CPU's share is a decode step's; the CPU device computes RAM-resident experts in place for
        # a prompt too (copying each into a slot first cost far more)
        hybrid = self.cpu is not None and self.cpu.takes(x.shape[0])
        if hybrid:
            self.cpu.stage(x, weights)
        return hybrid

    def _find(self, layer: int, routed: list[int], waited: float, defer: bool):
        """-> (the wanted experts in routing order, {expert: slot} of those resident, the others, the counts).
        A deferred step's layer with no miss leaves the RAM side's bookkeeping (`_settle_layer`) to `run_deferred`:
        its launch then follows the host sync at once."""
        wanted = list(dict.fromkeys(routed))                                 # unique, in routing order
        slot_of, late = split_resident(wanted, lambda e: self.banks.find((layer, e)))
        if late or not defer:
            self._settle_layer(layer, wanted)         # before `_bring_in`: RAM blocks unlocked, wrong guesses settled
        if not defer:
            self.mover.count_copy_time()
            self.banks.note_used(layer, routed)
        counts = dict(vram_hits=len(slot_of), vram_misses=len(late), sync_wait_s=waited)
        if not defer:
            self.telemetry.add(**counts)
        return wanted, slot_of, late, counts

    def _settle_layer(self, layer: int, wanted: list[int]) -> None:
        """The RAM blocks of finished copies unlocked, the layer's guesses scored and its wrong guesses' reads
        settled (what `_bring_in` needs before it inserts into the RAM cache)."""
        self.mover.unlock_finished()
        self._score_speculation(layer, set(wanted))

    def _compute(self, call: LayerCall, wanted: list[int], slot_of: dict[int, int], late: list[int],
                 static_inputs: bool, defer: bool) -> dict[int, int]:
        """The device's share -> the {expert: slot}s whose state `run_deferred` still sets."""
        if not self.compute.uses_kernel(call.x.shape[0], len(wanted)):
            self.compute.run_slots(call, slot_of, late, self._bring_in)
            return {}
        early = list(slot_of)
        if late:
            slot_of.update(self._bring_in(call.layer, late, protected={(call.layer, e) for e in wanted}))
        self.compute.launch(call, slot_of, early, late, static_inputs)
        if defer:
            return slot_of
        self.compute.set_ready(call.layer, slot_of)
        return {}

    def _cpu_share(self, call: LayerCall, late: list[int]) -> CpuShare | None:
        """The misses the CPU computes from the RAM cache (placement cost model); the rest are copied. Where
        copies do not overlap compute (the CPU device) the share is computed now, so its RAM blocks are unlocked
        before the slot path's reads need them."""
        layer = call.layer
        candidates = [e for e in late if (layer, e) in self.cache and (layer, e) not in self.reads]
        on_cpu = self.cpu.placement.cpu_share(candidates, call.x.shape[0], lambda e: self.banks.uses((layer, e)),
                                              self.mover.queued_copies())
        if not on_cpu:
            return None
        share = CpuShare(self.cpu, self.cache, layer, on_cpu)
        if not self.mover.is_async:
            share.compute(call)
        return share

    def _read_for_cpu(self, call: LayerCall, experts: list[int]) -> None:
        """out += the experts read into the RAM cache and computed where they landed, a batch at a time (a
        batch's reads all in flight before the first wait; the next layer's guessed reads queued behind)."""
        layer = call.layer
        for start in range(0, len(experts), self._cpu_batch):
            batch = experts[start:start + self._cpu_batch]
            in_ram, from_disk = self._locate(layer, batch)                 # each block locked once
            if from_disk:
                self._start_reads_ahead()
            landed = [e for e, _ in in_ram]
            try:
                for expert, _ in self._landed(layer, from_disk):
                    landed.append(expert)                # locked from here until computed
                CpuShare(self.cpu, self.cache, layer, batch).add_into(call)
            finally:
                for expert in landed:
                    self.cache.unlock((layer, expert))

    def begin_step(self) -> None:
        """A decode step starts: its launches go to the stream current now; the copies' busy time is counted."""
        self.mover.begin_step()

    def run_deferred(self) -> None:
        """The work a `run(..., defer=True)` left: its use counts, telemetry and next layer's prefetch (the
        copies' busy time is counted by the next `begin_step`)."""
        if self._deferred is None:
            return
        (next_layer, predicted, layer, routed, counts, ready, unsettled), self._deferred = self._deferred, None
        if unsettled is not None:
            self._settle_layer(layer, unsettled)
        self.banks.note_used(layer, routed)
        self.telemetry.add(**counts)
        self.compute.set_ready(layer, ready)
        if next_layer is not None:
            self._prefetch(next_layer, predicted)

    def capture(self, layers: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
        self.compute.capture(layers, self.device)

    # ------------------------------------------------------------------ transfers
    def _bring_in(self, layer: int, experts: list[int], protected: set[Key], each: bool = False) -> dict[int, int]:
        """Make experts resident in layer's bank; returns {expert: slot}. RAM hits are copied first, disk reads
        are all in flight before the first wait. each: every copy gets its own done event (the torch path
        computes each expert as soon as it lands); else the RAM hits share one (the kernel computes them all in
        one launch anyway, and an event costs the decode thread a few microseconds)."""
        in_ram, from_disk = self._locate(layer, experts)
        placed = {}
        with self.mover.copy_batch(layer, each):
            for expert, ram_slot in in_ram:
                placed[expert] = self.mover.copy(layer, expert, ram_slot, protected, ram_hit=True)
        if from_disk:
            self._start_reads_ahead()
        for expert, ram_slot in self._landed(layer, from_disk):
            with self.mover.copy_batch(layer):
                placed[expert] = self.mover.copy(layer, expert, ram_slot, protected)
        return placed

    def _landed(self, layer: int, from_disk: list):
        """Yields each (expert, RAM slot) of `_locate`'s disk reads once its read has landed, in order; a failed
        read abandons those after it."""
        for i, (expert, ram_slot, future) in enumerate(from_disk):
            try:
                self.reads.finish((layer, expert), future)
            except BaseException:
                self.reads.abandon(layer, from_disk[i + 1:])
                raise
            yield expert, ram_slot

    def _start_reads_ahead(self) -> None:
        """The next layer's guessed reads, queued behind this layer's own (they go first)."""
        if self._ahead is not None:
            (ahead, guesses), self._ahead = self._ahead, None
            self._read_ahead[ahead] = self._prefetch_reads(ahead, guesses)

    def _locate(self, layer: int, experts: list[int]) -> tuple[list, list]:
        """-> ([(expert, RAM slot)] of the RAM hits, locked; [(expert, RAM slot, read)] of the disk reads:
        those started ahead, then new ones)."""
        in_ram, from_disk = [], []
        for expert in experts:
            key = (layer, expert)
            pending = self.reads.pending.pop(key, None)
            if pending is not None:
                from_disk.append((expert, *pending))
                continue
            ram_slot = self.cache.lookup(key)
            if ram_slot is not None:
                self.cache.lock(key)
                in_ram.append((expert, ram_slot))
            else:
                from_disk.append((expert, *self.reads.start(key)))
        return in_ram, from_disk

    # ------------------------------------------------------------------ speculation
    def _prefetch(self, layer: int, experts: list[int]) -> None:
        """Start bringing `layer`'s predicted experts (best guess first): RAM hits copy now (other bank), for the
        better half of the guesses (residency.copies_ahead); disk reads start for the guesses no tier holds
        (residency.reads_ahead), to be copied when the layer asks for them. With a CPU share, the coldest RAM
        hits stay where they are, for the CPU (placement.prefetch_count)."""
        self._predicted[layer] = set(experts)
        self._ahead = None
        if layer not in self._read_ahead and self._all_resident(layer, experts):
            self._prefetched[layer] = set()            # (the fits regimes' usual step: nothing to bring)
            return
        in_ram = self._lock_guesses_in_ram(layer, experts[:copies_ahead(len(experts), self.prefetch_copies)])
        issued = self._read_ahead.pop(layer, None)
        if issued is None:
            issued = self._prefetch_reads(layer, experts)
        to_copy = self._prefetch_copies(layer, in_ram)
        for expert in {e for e, _ in in_ram} - {e for e, _ in to_copy}:   # left to the CPU: unlocked again
            self.cache.unlock((layer, expert))
        if to_copy:
            keys = {(layer, e) for e in experts}
            with self.mover.copy_batch(layer):
                for expert, ram_slot in to_copy:
                    self.mover.copy(layer, expert, ram_slot, protected=keys)
                    issued.add(expert)
        self._prefetched[layer] = issued
        self.telemetry.add(prefetch_issued=len(issued))

    def _all_resident(self, layer: int, experts: list[int]) -> bool:
        """Whether every guess the prefetch would look at sits in the layer's bank (each made recent, as that
        look does)."""
        count = max(copies_ahead(len(experts), self.prefetch_copies),
                    reads_ahead(len(experts), self.prefetch_reads, self.mover.reads_all_guesses))
        return all(self.banks.find((layer, e)) is not None for e in experts[:count])

    def _lock_guesses_in_ram(self, layer: int, experts: list[int]) -> list[tuple[int, int]]:
        """[(expert, RAM slot)] of the guesses only RAM holds, locked at once (a read started next must not
        evict one)."""
        in_ram = []
        for expert in experts:
            key = (layer, expert)
            if self.banks.find(key) is not None or key in self.reads:
                continue
            ram_slot = self.cache.lookup(key)
            if ram_slot is not None:
                self.cache.lock(key)
                in_ram.append((expert, ram_slot))
        return in_ram

    def _prefetch_reads(self, layer: int, experts: list[int]) -> set[int]:
        """Start disk reads for the best guesses that neither tier holds; a prefetch never waits for a RAM block.
        Returns their experts."""
        count = reads_ahead(len(experts), self.prefetch_reads, self.mover.reads_all_guesses)
        keys = [(layer, e) for e in experts[:count]]
        held = lambda key: self.banks.find(key) is not None or key in self.reads or key in self.cache  # noqa: E731
        issued = set()
        for key in keys_to_read(keys, held, self.cache.can_insert):
            self.reads.start_ahead(key)
            issued.add(key[1])
        return issued

    def _prefetch_copies(self, layer: int, in_ram: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The predicted RAM hits worth copying ahead: all of them, or with a CPU share the hottest ones, so that
        the CPU can compute the rest in about the time their copies would take."""
        if self.cpu is None or not in_ram:
            return in_ram
        count = self.cpu.placement.prefetch_count(len(in_ram))
        return hottest(in_ram, lambda item: self.banks.uses((layer, item[0])), count)

    def _score_speculation(self, layer: int, actual: set[int]) -> None:
        predicted = self._predicted.pop(layer, None)
        correct, needed = score(predicted, actual) if predicted is not None else (0, 0)
        prefetched = self._prefetched.pop(layer, set())
        self.telemetry.add(spec_correct=correct, spec_predicted=needed, prefetch_used=len(prefetched & actual))
        # Reads started for experts this layer did not use: once one lands its RAM slot holds the block (and is
        # unlocked); the decode thread does not wait for one still in flight before its own layer's reads.
        self.reads.unused.update(k for k in self.reads.pending if k[0] == layer and k[1] not in actual)
        self.reads.settle_unused(wait=False)

    # ------------------------------------------------------------------ filling RAM in the background
    def plan_fill(self, keys: list[Key]) -> None:
        """The blocks `fill` reads, in this order (the model's, layer by layer: a prompt's pass starts at layer 0)."""
        self._fill = FillPlan(keys)

    def fill(self, reads: int = FILL_READS, grow: bool = True) -> bool:
        """Read blocks that neither tier holds into free RAM slots, never evicting one, while the disk has fewer
        than `reads` reads in flight (a layer's own reads and guesses go first; the caller holds the engine, as a
        layer does). A block read here is one the model will use later, and where RAM holds the whole model it
        then never waits for the disk again. The reads settle as a wrong guess's do. Without `grow`, only where no
        allocation waits (RamCache.has_free): a decode step must not wait while a chunk of the cache is
        page-locked. Returns whether there may be more to read: False once every block has a place or RAM has
        no free slot left."""
        if not self._fill:                    # (a decode step asks every token: nothing to do once done)
            return False
        self.reads.settle_unused(wait=False)
        held = lambda key: key in self.cache or key in self.reads or self.banks.holds(key)  # noqa: E731
        while self._fill and len(self.reads) < reads:
            if not self.cache.has_free(grow):
                if grow or not self.cache.has_free():
                    self._fill.clear()
                break
            key = self._fill.next_key(held)
            if key is None:
                break
            self.reads.start_ahead(key)
            self.reads.unused.add(key)
            self.telemetry.add(ram_fill_reads=1)
        return bool(self._fill)

    def synchronize(self) -> None:
        """Wait for every copy and release every lock (end of a generation, before closing)."""
        self._deferred = None              # a step cut short: its prefetch is moot, its guesses cleared below
        self.mover.synchronize()
        self.reads.settle_all()
        self._predicted.clear()
        self._prefetched.clear()
        self._read_ahead.clear()
        self._ahead = None


def _host_ids(ids: torch.Tensor, num_routed: int) -> tuple[list[int], list[int], float]:
    """The layer's one host sync -> (routed ids, the next layer's guesses unique and best first, seconds waited)."""
    start = time.perf_counter()
    values = ids.tolist()
    waited = time.perf_counter() - start
    return values[:num_routed], list(dict.fromkeys(values[num_routed:])), waited
