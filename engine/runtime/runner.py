"""One model on one device under hard VRAM and RAM budgets: the same construction and code path for
every device (the device picks kernels and where buffers live, not which code runs).

  dense weights  -> device, in the compute dtype; the family builds its blocks from them
  model state    -> device (KV cache and per-layer state; static at full size on CUDA, graph-safe)
  expert blocks  -> disk (O_DIRECT) -> RAM LRU cache (pinned on CUDA, grows as it fills, never past
                    its budget) -> two slot banks on the device, the rest of the VRAM budget
Prefill runs the whole prompt through each block (experts in batches, each read at most once per
layer); decode runs the one-token step (CUDA graphs where available) and the routed experts.
"""
from __future__ import annotations

import os
import threading
import time

import torch
from safetensors import safe_open

from engine.format.file_table import FileTable, can_map, keeps_table
from engine.format.modeldir import DENSE_FILE, ModelDir
from engine.format.ngram import read_index
from engine.format.quant import quantize
from engine.model import dense_quant as dense_quant_
from engine.model.block import Step
from engine.model.layers import Packed
from engine.model.model import EMBED_TABLE, table_in_file
from engine.model.families import family_module
from engine.model.state import ModelState, state_bytes
from engine.host import available_memory, cgroup_capped
from engine.options import Options
from engine.runtime.budget import Plan, computes_in_place, in_place_defaults, plan_budgets, prefill_workspace_bytes
from engine.runtime.cache import RamCache, anonymous_buffer
from engine.runtime.cpu_experts import CPU_FAST_FORMATS, CpuExperts
from engine.runtime.decode_step import DecodeStep
from engine.runtime.experts import Experts, decoded_expert_bytes
from engine.runtime.memory import DriverMemory, drop_file_cache, release_free_heap
from engine.runtime.ngram import attach_ngram, held_bytes
from engine.runtime import load_speeds
from engine.runtime.pacing import make_pacing
from engine.runtime.pinned import pinned_buffer
from engine.runtime.placement import Placement, ShareTrial, measure_copy_s
from engine.runtime.slots import SlotBanks
from engine.runtime.store import ExpertStore
from engine.runtime.attach import CandidateKernels, attach_kernels, expert_kernels
from engine.runtime.telemetry import Telemetry
from kernels.cpu_linear import slab_rows
from kernels.formats import random_bank


_CONTEXT_BYTES: dict[int, int] = {}    # device index -> driver-view bytes outside torch's allocator
# Under a memory cap, what the RAM cache leaves: the page cache of the code being run (the libraries' hot pages)
# and what the process still grows by after loading.
RAM_RESERVE = 192 << 20
TOP_K_AT_LOAD = 40          # the app's top-k (app/store.py): its sampling kernel is checked at load


class PrefillCancelled(Exception):
    """Engine.cancel() arrived during a prefill (checked between layers)."""


class Runner:
    def __init__(self, model_dir: ModelDir, device: torch.device, dtype: torch.dtype, telemetry: Telemetry, *,
                 vram_budget: int | None, ram_cache: int | None, max_tokens: int, default_vram: int, default_ram: int,
                 max_prompt_tokens: int | None = None, dense_quant: str | None = None, progress=None,
                 options: Options = Options()):
        self.device, self.dtype, self.telemetry, self.options = torch.device(device), dtype, telemetry, options
        self.is_cuda = self.device.type == "cuda"
        # On a GPU a decode step's prefetch waits until the next layer's mixer is enqueued (Experts.run's
        # `defer`); on the CPU device nothing runs meanwhile, so the reads start as early as they can.
        self.defer_prefetch = self.is_cuda
        spec, layout = model_dir.spec, model_dir.layout
        self.spec = spec
        if self.is_cuda:
            torch.cuda.empty_cache()       # blocks a previous model left cached would blur what this one measures
        base_bytes = self._allocated()                # not ours (e.g. other models in a test process)
        weights = _load_dense(model_dir, self.device, dtype, progress, dense_quant=dense_quant)
        self.model = family_module(spec.family).build(spec, weights, dtype, self.device)
        # after the build: a family may split a fused int8 weight (Qwen3-Next)
        attach_kernels(self.model, weights, self.device, dtype, self.options, telemetry.warn)
        # the table left in the file takes neither the device's memory nor the process's
        dense_bytes = sum(dense_quant_.nbytes(t) for t in weights.values() if not isinstance(t, FileTable))
        kv_bytes = state_bytes(self.model.state_specs(), max_tokens, dtype)
        budgets = self._budgets(layout, dense_bytes, kv_bytes, vram_budget, ram_cache, default_vram, default_ram)
        self.ngram_index = read_index(model_dir.path) if hasattr(self.model, "ngram") else None  # a PLE model's
        budgets["table_bytes"] = held_bytes(self.ngram_index.total_bytes) if self.ngram_index is not None else 0
        dtype_bytes = torch.empty((), dtype=dtype).element_size()
        work = prefill_workspace_bytes(spec, max_prompt_tokens or max_tokens, dtype_bytes) if self.is_cuda else 0
        plan_budgets(workspace_bytes=work, **budgets)                    # fail early, before allocating more
        self.top_candidates = CandidateKernels(spec.vocab_size, self.device, self.options, telemetry.warn)
        self.top_candidates(TOP_K_AT_LOAD)          # the app's top-k: checked (and compiled) in the warm-up child
        # The self-check's scratch bank (top_k + 1 blocks) comes and goes before the state and slots exist.
        kernel, prefill_kernel, self.kernel_verdict = expert_kernels(self.model, layout, spec.top_k, self.device,
                                                                     dtype, self.options, telemetry.warn)
        # a model that runs its own passes (engine.model.generic) keeps its own cache: no state here
        own_state = [] if self.model.runs_passes else self.model.state_specs()
        self.state = ModelState(own_state, max_tokens, dtype, self.device, static=self.is_cuda)
        self.step = DecodeStep(self.model, self.state, self.device, not options.eager and self.model.graph_safe)
        if self.model.runs_passes and self.is_cuda and not options.eager:   # its own graphs (generic.graphs)
            self.model.use_static_decode(max_tokens, kv_bytes)
        self.plan = self._final_plan(budgets, base_bytes, dense_bytes + kv_bytes, work, ram_cache, max_tokens)
        self._make_experts(model_dir, kernel, prefill_kernel, dense_bytes + kv_bytes)

    def _budgets(self, layout, dense_bytes: int, kv_bytes: int, vram_budget: int | None, ram_cache: int | None,
                 default_vram: int, default_ram: int) -> dict:
        """plan_budgets' arguments but the workspace: where the CPU computes experts in place, the defaults
        leave VRAM (the host's memory here) to the RAM cache."""
        slot_bytes = layout.block_bytes + (0 if self.is_cuda else decoded_expert_bytes(layout, self.dtype))
        budgets = dict(block_bytes=layout.block_bytes, top_k=self.spec.top_k, num_experts=self.spec.num_experts,
                       num_moe_layers=len(self.spec.moe_layers), dense_bytes=dense_bytes, kv_bytes=kv_bytes,
                       vram_budget=vram_budget, ram_cache=ram_cache, default_vram=default_vram,
                       default_ram=default_ram, device_slot_bytes=slot_bytes)
        if vram_budget is None and computes_in_place(self.device.type, layout.fmt, self.options.cpu_experts):
            budgets["default_vram"], budgets["default_ram"] = in_place_defaults(
                default_vram, default_ram, dense_bytes + kv_bytes, slot_bytes, self.spec.top_k)
        return budgets

    def _final_plan(self, budgets: dict, base_bytes: int, resident_bytes: int, work: int, ram_cache: int | None,
                    max_tokens: int) -> Plan:
        """The plan once the decode graphs and the driver's context are measured (CUDA) and, under a memory
        cap, the RAM cache sized by what the cap leaves now that the rest is loaded."""
        graph_bytes, work = self._capture_decode(base_bytes, resident_bytes, work)
        context_bytes = self._driver_overhead() if self.is_cuda else 0
        release_free_heap()       # what loading left free in the heap: room for the RAM cache under a cap
        if ram_cache is None and cgroup_capped():
            budgets["default_ram"] = max(available_memory() - RAM_RESERVE, 0)
        plan = plan_budgets(workspace_bytes=work + graph_bytes + context_bytes, **budgets)
        self.telemetry.set(vram_budget_bytes=plan.vram_budget_bytes, vram_slot_bytes=plan.slot_bytes,
                           kv_tokens=max_tokens, vram_graph_bytes=graph_bytes, vram_context_bytes=context_bytes)
        self.telemetry.info["device"] = str(self.device)
        if self.is_cuda:
            self.telemetry.attach_driver_vram(DriverMemory(self.device.index or 0).used_bytes)
        else:
            device_bytes = resident_bytes + plan.slot_bytes
            self.telemetry.set(vram_used_bytes=device_bytes)
            self.telemetry.set_max(vram_peak_bytes=device_bytes)
        return plan

    def _make_experts(self, model_dir: ModelDir, kernel, prefill_kernel, resident_bytes: int) -> None:
        """The store, the two tiers and the experts over them; the idle fill planned, the decode graphs'
        expert launches captured."""
        layout, telemetry = model_dir.layout, self.telemetry
        self.store = ExpertStore(model_dir, telemetry)
        # a PLE model's n-gram rows stream from their own file through a cache inside the same RAM budget (or
        # are held in it, where it holds the whole model)
        ngram_bytes = attach_ngram(self.model, model_dir.path, self.ngram_index, self.plan.ram_cache_bytes,
                                   model_dir.expert_bytes_total, telemetry)
        self.cache = RamCache(self.plan.ram_cache_bytes - ngram_bytes, layout.block_bytes, telemetry,
                              allocate=pinned_buffer if self.is_cuda else anonymous_buffer)
        self.banks = SlotBanks(self.plan.slots_per_bank, layout.block_bytes, self.device, telemetry)
        self.pacing = make_pacing(self.options.copy_rate_gbps, self.banks.banks[0][0], telemetry)
        self.cache.uses = self.banks.rank                 # one routing frequency for both tiers' evictions
        table = self.model.embed_tokens
        if isinstance(table, FileTable) and keeps_table(available_memory(), self.plan.ram_cache_bytes, table.nbytes):
            table.keep_cached()
        self.experts = Experts(self.store, self.cache, self.banks, telemetry, layout, self.model.expert_mlp,
                               self.dtype, self.device, kernel, cpu=self._cpu_experts(layout, self.options.cpu_experts),
                               prefill_kernel=prefill_kernel, prefetch_reads=self.options.prefetch_reads,
                               prefetch_copies=self.options.prefetch_copies, pacing=self.pacing)
        cpu = self.experts.cpu
        self._share_trial = cpu.placement.trial if cpu is not None else None
        self._last_step: float | None = None      # when the decode step before started (the trial's step times)
        self.fills = self.options.ram_fill          # RAM filled in the background with blocks no prompt has read
        self._lock = threading.Lock()             # a pass, a step or a fill at a time (the filler is another thread)
        self._used_at = time.monotonic()
        if self.fills:
            self.experts.plan_fill([(layer, e) for layer in self.spec.moe_layers for e in range(self.spec.num_experts)])
        static = self._static_expert_inputs() if kernel is not None else {}
        if static:
            with torch.inference_mode():
                self.experts.capture(static)

    def _static_expert_inputs(self) -> dict:
        """{layer: (x [1, H], weights [1, K], out [1, H])}: the decode graphs' expert buffers (none when eager)."""
        if self.model.runs_passes:
            return self.model.static_expert_inputs()
        s = self.step
        return {layer: (s.out[layer].rows, s.out[layer].route_weights, s.moe_out[layer])
                for layer in s.moe_out} if s.use_graphs else {}

    def _cpu_experts(self, layout, mode: str) -> CpuExperts | None:
        """Hybrid execution (CUDA, or forced with mode "all"): the CPU computes the RAM-resident experts
        the placement gives it, at speeds measured here, on this machine, now; in mode "auto" only where
        the CPU is faster than a copy (Placement.pays_off), else None, the speeds kept for the report. The copy is
        paced as the mover paces it where the bench simulates a slower link. On CUDA the speeds are kept per machine
        (load_speeds.py): where they said "copying is faster", nothing is measured again and the fused kernel's
        numba never loads."""
        if mode == "off" or (mode == "auto" and layout.fmt not in CPU_FAST_FORMATS):
            return None           # auto: only formats the CPU multiplies without dequantising first
        if computes_in_place(self.device.type, layout.fmt, mode):
            mode = "all"
        if self.is_cuda:
            torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) - 1))   # one core stays the decode thread's
        threads = torch.get_num_threads()
        o = self.options
        key = load_speeds.speeds_key(self.device, layout, self.model.expert_kernel, self.dtype, threads,
                                     o.cpu_kernel, o.copy_rate_gbps) if self.is_cuda and mode == "auto" else None
        if key and self._copies_were_faster(key, threads, mode):
            return None
        placement = Placement(cpu_s=0.0, copy_s=0.0, mode=mode)
        cpu = CpuExperts(layout, self.model.expert_mlp, self.dtype, self.device, self.spec.top_k, self.telemetry,
                         placement, activation=self.model.expert_kernel, cpu_kernel=self.options.cpu_kernel)
        offsets = {f.name: f.offset for f in layout.fields}
        block = random_bank(1, layout.block_bytes, layout.fmt, offsets, layout.intermediate, layout.hidden)[0]
        x = torch.randn(1, layout.hidden).to(self.dtype)
        kernel = cpu.choose_kernel(block, x)           # the torch expert or the fused kernel, timed here
        placement.cpu_s = placement.cpu_load_s = kernel["cpu_expert_s"]
        if self.is_cuda:
            placement.copy_s = measure_copy_s(block.pin_memory(), self.banks.banks[0][0], pacing=self.pacing)
        active = placement.pays_off()
        if active and self.is_cuda and mode == "auto":      # near the threshold the model errs: the steps decide
            placement.trial = ShareTrial()
        if key:
            load_speeds.remember(key, {**kernel, "copy_s": placement.copy_s})
        self.telemetry.info["placement"] = {**kernel, "copy_s": placement.copy_s,
                                            "threads": threads, "mode": mode, "active": active, "measured": "now"}
        return cpu if active else None

    def _copies_were_faster(self, key: str, threads: int, mode: str) -> bool:
        """Whether an earlier load on this machine found copying faster than the CPU (load_speeds.py): then no
        CPU share, and no fused kernel loaded."""
        known = load_speeds.recall(key)
        if known is None or Placement(cpu_s=known["cpu_expert_s"], copy_s=known["copy_s"], mode=mode,
                                      cpu_load_s=known["cpu_expert_s"]).pays_off():
            return False
        self.telemetry.info["placement"] = {**known, "threads": threads, "mode": mode, "active": False,
                                            "measured": "earlier"}
        return True

    def _capture_decode(self, base_bytes: int, resident_bytes: int, work: int) -> tuple[int, int]:
        """Capture the decode graphs (CUDA) before the slot banks exist -> (bytes they hold: pool and
        library workspaces, the workspace peak): measured, not estimated."""
        if not self.is_cuda:
            return 0, work
        torch.cuda.reset_peak_memory_stats(self.device)
        with torch.inference_mode():
            (self.model.capture if self.model.runs_passes else self.step.capture)()
        if getattr(self.model, "graph_error", None):
            self.telemetry.warn(f"The decode runs without CUDA graphs: capturing them failed ({self.model.graph_error}).")
        torch.cuda.synchronize(self.device)
        held = self._allocated() - base_bytes
        return max(held - resident_bytes, 0), max(work, torch.cuda.max_memory_allocated(self.device) - base_bytes - held)

    def _driver_overhead(self) -> int:
        """What the driver shows for this process beyond torch's allocator (the CUDA context, loaded
        kernel modules, library handles): charged to the VRAM budget so that the budget is what
        `nvidia-smi` shows. Measured once per process and device, after the first model's graphs and
        kernels are loaded (later loads would see the same context, give or take the driver's
        rounding); 0 where NVML cannot say."""
        index = self.device.index or 0
        if index not in _CONTEXT_BYTES:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            used = DriverMemory(index).used_bytes()
            _CONTEXT_BYTES[index] = max(used - torch.cuda.memory_reserved(self.device), 0) if used else 0
        return _CONTEXT_BYTES[index]

    def _allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device) if self.is_cuda else 0

    # ------------------------------------------------------------------ forward passes
    def idle_s(self) -> float:
        """Seconds since the last pass or step ended (or the load)."""
        return 0.0 if self._lock.locked() else time.monotonic() - self._used_at

    def fill(self) -> bool:
        """A few more blocks read into free RAM slots (Experts.fill), as many in flight as there are reader threads
        (the runner is idle: nothing else reads); False once nothing is left to read."""
        with self._lock:
            return self.fills and self.experts.fill(reads=self.store.num_threads)

    def prefill(self, token_ids: list[int], cancel=None) -> torch.Tensor:
        """A new conversation's prompt -> logits of its last token [V] float32. `cancel` (a threading.Event),
        when set, stops it between layers with PrefillCancelled."""
        with self._lock:
            try:
                return self._prefill(token_ids, cancel)
            finally:
                self._used_at = time.monotonic()

    def _prefill(self, token_ids: list[int], cancel) -> torch.Tensor:
        # T = tokens, H = hidden
        self._last_step = None                    # the next decode step's time would count this prompt
        self.experts.synchronize()
        self.state.reset()
        ids = torch.tensor(token_ids, device=self.device)
        step = Step(torch.arange(len(token_ids), device=self.device), 0, self.state)
        self.experts.begin_pass()
        try:                                  # a pass changes the eviction policy (residency.py): end it always
            if self.model.runs_passes:
                return self.model.prefill(token_ids, self.experts, lambda: _check_cancel(cancel))
            x = self.model.embed(ids)                                                 # [T, H]
            for layer, block in enumerate(self.model.blocks):
                if cancel is not None and cancel.is_set():
                    raise PrefillCancelled()
                x, h = block.mix(x, step)
                moe_out = None
                if block.is_moe:
                    rows, weights, expert_ids = block.expert_rows(h, *block.route(h))  # [T, H], [T, K], [T, K]
                    moe_out = torch.empty(rows.shape, dtype=torch.float32, device=self.device)
                    self.experts.run(layer, rows, weights, expert_ids.flatten(), moe_out)
                x = block.combine(x, h, moe_out)
        finally:
            self.experts.end_pass()
        return self.model.head(x)

    def decode(self, token: int, position: int) -> torch.Tensor:
        """One token at `position` -> logits [V] float32, a static buffer: valid until the next step."""
        with self._lock:
            try:
                return self._decode(token, position)
            finally:
                self._used_at = time.monotonic()

    def _decode(self, token: int, position: int) -> torch.Tensor:
        if self._share_trial is not None:
            self._time_step(self._share_trial)
        self.experts.begin_step()
        logits = self._own_step(token) if self.model.runs_passes else self._block_step(token, position)
        self.experts.run_deferred()
        if self.fills:                         # where no allocation waits: the idle filler's may
            self.experts.fill(grow=False)
        if self.is_cuda and position % 16 == 0:   # a host-side counter (~60 us a read): a step's graphs allocate
            stats = torch.cuda.memory_stats_as_nested_dict(self.device)          # nothing, so now and then
            self.telemetry.set(vram_peak_bytes=stats["allocated_bytes"]["all"]["peak"])
        return logits

    def _time_step(self, trial: ShareTrial) -> None:
        """The CPU share's trial times each decode step from the start of the one before (the sampler's wait for
        the GPU and the app's handling of the token included: what a user waits a token)."""
        now = time.perf_counter()
        if trial.step(None if self._last_step is None else now - self._last_step):
            self.telemetry.info["placement"]["trial"] = trial.verdict
        self._last_step = now

    def _block_step(self, token: int, position: int) -> torch.Tensor:
        s = self.step
        s.set_step(token, position)
        for layer, block in enumerate(self.model.blocks):
            o = s.run_layer(layer)
            self.experts.run_deferred()        # the previous MoE layer's prefetch, behind this layer's mixer
            if block.is_moe:
                self.experts.run(layer, o.rows, o.route_weights, o.ids, s.moe_out[layer], s.next_moe[layer],
                                 static_inputs=s.use_graphs, defer=self.defer_prefetch)
        s.run_head()
        return s.logits

    def _own_step(self, token: int) -> torch.Tensor:
        """A model that runs its own passes: its modules call the experts layer by layer (engine.model.generic)."""
        return self.model.decode(token, self.experts, defer=self.defer_prefetch)

    def close(self) -> None:
        with self._lock:
            self.experts.synchronize()
            self.store.close()


def _check_cancel(cancel) -> None:
    if cancel is not None and cancel.is_set():
        raise PrefillCancelled()


def _load_dense(model_dir: ModelDir, device: torch.device, dtype: torch.dtype, progress,
                dense_quant: str | None = None) -> dict[str, torch.Tensor | Packed | FileTable]:
    """The dense weights on the device in the compute dtype, but for an embedding table the model reads
    from its file (engine.model.model.table_in_file). With `dense_quant` "int8" the weights the family allows are
    quantised on the host as they are read (the device gets half the bytes, and never runs the quantisation's
    torch operators: their CUDA modules would hold ~55 MiB of host memory for the process's life)."""
    path = model_dir.path / DENSE_FILE
    with safe_open(str(path), framework="pt") as f:
        names = list(f.keys())
        in_file = {EMBED_TABLE} if table_in_file(model_dir.spec.family, tied="lm_head.weight" not in names) \
            and EMBED_TABLE in names and can_map(path, EMBED_TABLE) else set()
        int8 = dense_quant_.quantized_names(model_dir.spec.family, names) if dense_quant else set()
        weights = {}
        for i, name in enumerate(names):
            if name in in_file:
                weights[name] = FileTable(path, name, dtype, "int8" if name in int8 else None)
                continue
            tensor = f.get_tensor(name)             # integer tables (DeepSeek-V4's tid2eid) keep their dtype
            if name in int8:
                weights[name] = to_int8(tensor.to(dtype=dtype)).to(device)
            else:
                weights[name] = tensor.to(device=device, dtype=dtype if tensor.is_floating_point() else None)
                if weights[name].data_ptr() == tensor.data_ptr():    # still the file's map: a cut file is SIGBUS
                    weights[name] = weights[name].clone()
            if progress and i % 32 == 0:
                progress(i, len(names), "loading dense weights")
    drop_file_cache(path)       # read once, now on the device (the table left there is read again as needed)
    return weights


def to_int8(weight: torch.Tensor) -> Packed:
    """[out, in] in the compute dtype -> its int8 codes and bf16 row scales, on the weight's device, a
    slab of rows at a time (rows are independent): the float32 scratch stays small beside a VRAM budget."""
    rows = slab_rows(weight.shape[1])
    codes = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
    scale = torch.empty(weight.shape[0], dtype=torch.bfloat16, device=weight.device)
    for r in range(0, weight.shape[0], rows):
        parts = quantize(weight[r:r + rows], "int8")
        codes[r:r + rows], scale[r:r + rows] = parts["w"], parts["scale"]
    return Packed({"w": codes, "scale": scale}, "int8", weight.dtype)
