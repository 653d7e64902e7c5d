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

import functools
import os
import threading
import time

import torch
from safetensors import safe_open

from engine.errors import SluiceError
from engine.format.modeldir import DENSE_FILE, ModelDir
from engine.model import dense_quant as dense_quant_
from engine.model.block import Router, Step
from engine.model.layers import Packed
from engine.model.families import family_module
from engine.model.file_table import EMBED_TABLE, FileTable, can_map, keeps_table, table_in_file
from engine.model.state import ModelState, state_bytes
from engine.plan.hardware import available_memory, cgroup_capped
from engine.runtime.budget import computes_in_place, in_place_defaults, plan_budgets, prefill_workspace_bytes
from engine.runtime.cache import RamCache, anonymous_buffer
from engine.runtime.cpu_experts import CPU_FAST_FORMATS, CpuExperts
from engine.runtime.decode_step import DecodeStep
from engine.runtime.experts import Experts, decoded_expert_bytes
from engine.runtime.memory import DriverMemory, drop_file_cache, release_free_heap
from engine.runtime.ngram import attach_ngram
from engine.runtime import load_speeds
from engine.runtime.pinned import pinned_buffer
from engine.runtime.placement import MODES, Placement, measure_copy_s
from engine.runtime.slots import SlotBanks
from engine.runtime.store import ExpertStore
from engine.runtime.switches import cublas_free, env_int
from kernels.vocab_chunks import MAX_K
from engine.runtime.telemetry import Telemetry
from kernels.formats import random_bank


_CONTEXT_BYTES: dict[int, int] = {}    # device index -> driver-view bytes outside torch's allocator
# Under a memory cap, what the cache leaves: the page cache of the code being run (the libraries' hot pages) and
# what the process still grows by after loading (measured: +13 MiB over two prompts). Under a 4 GiB cgroup on the
# H200 box a 3.0 GiB cache (100 MiB left beside the process) still read back no pages while decoding (0.02 a token):
# BENCHMARKS.md "Session 10".
RAM_RESERVE = 192 << 20
TOP_K_AT_LOAD = 40          # the app's top-k (app/store.py): its sampling kernel is checked at load


class PrefillCancelled(Exception):
    """Engine.cancel() arrived during a prefill (checked between layers)."""


class Runner:
    def __init__(self, model_dir: ModelDir, device: torch.device, dtype: torch.dtype, telemetry: Telemetry, *,
                 vram_budget: int | None, ram_cache: int | None, max_tokens: int, default_vram: int, default_ram: int,
                 use_graphs: bool = True, use_kernels: bool = True, max_prompt_tokens: int | None = None,
                 cpu_experts: str = "auto", dense_quant: str | None = None, progress=None):
        self.device, self.dtype, self.telemetry = torch.device(device), dtype, telemetry
        self.is_cuda = self.device.type == "cuda"
        # On a GPU a decode step's prefetch waits until the next layer's mixer is enqueued (Experts.run's
        # `defer`); on the CPU device nothing runs meanwhile, so the reads start as early as they can.
        # SLUICE_DEFER_PREFETCH=0: right after the layer's launches, as before (an A/B switch).
        self.defer_prefetch = self.is_cuda and env_int("SLUICE_DEFER_PREFETCH") != 0
        spec, layout = model_dir.spec, model_dir.layout
        self.spec = spec
        if self.is_cuda:
            torch.cuda.empty_cache()       # blocks a previous model left cached would blur what this one measures
        base_bytes = self._allocated()                # not ours (e.g. other models in a test process)
        weights = _load_dense(model_dir, self.device, dtype, progress, dense_quant=dense_quant)
        self.model = family_module(spec.family).build(spec, weights, dtype, self.device)
        if use_kernels and self.is_cuda:       # after build: a family may split a fused int8 weight (Qwen3-Next)
            self._choose_linear_kernels(weights)
            if cublas_free():
                self._choose_router_kernels()
        # the table left in the file takes neither the device's memory nor the process's
        dense_bytes = sum(dense_quant_.nbytes(t) for t in weights.values() if not isinstance(t, FileTable))
        kv_bytes = state_bytes(self.model.state_specs(), max_tokens, dtype)
        dtype_bytes = torch.empty((), dtype=dtype).element_size()
        work = prefill_workspace_bytes(spec, max_prompt_tokens or max_tokens, dtype_bytes) if self.is_cuda else 0
        budgets = dict(block_bytes=layout.block_bytes, top_k=spec.top_k, num_experts=spec.num_experts,
                       num_moe_layers=len(spec.moe_layers), dense_bytes=dense_bytes, kv_bytes=kv_bytes,
                       vram_budget=vram_budget, ram_cache=ram_cache, default_vram=default_vram, default_ram=default_ram,
                       device_slot_bytes=layout.block_bytes + (0 if self.is_cuda else decoded_expert_bytes(layout, dtype)))
        if vram_budget is None and computes_in_place(self.device.type, layout.fmt, cpu_experts):
            budgets["default_vram"], budgets["default_ram"] = in_place_defaults(
                default_vram, default_ram, dense_bytes + kv_bytes, budgets["device_slot_bytes"])
        plan_budgets(workspace_bytes=work, **budgets)                    # fail early, before allocating more
        self.kernel_verdict = None
        self._candidates: dict[int, object] | None = {} if use_kernels and self.is_cuda else None
        self.top_candidates(TOP_K_AT_LOAD)          # the app's top-k: checked (and compiled) in the warm-up child
        # The self-check's scratch bank (top_k + 1 blocks) comes and goes before the state and slots exist.
        kernel = self._choose_kernel(layout) if use_kernels and self.is_cuda and self.model.expert_kernel else None
        # Prefill's experts through the grouped-GEMM kernel (warm 512-token prefill on the H200 box: 1257 / 1478
        # tok/s against 501 / 634 through the per-expert torch loop); SLUICE_PREFILL_KERNEL=0: the torch loop
        prefill_kernel = self._choose_prefill_kernel(layout) if kernel and env_int("SLUICE_PREFILL_KERNEL") != 0 else None
        self.state = ModelState(self.model.state_specs(), max_tokens, dtype, self.device, static=self.is_cuda)
        self.step = DecodeStep(self.model, self.state, self.device, use_graphs and self.model.graph_safe)
        graph_bytes, work = self._capture_decode(base_bytes, dense_bytes + kv_bytes, work)
        context_bytes = self._driver_overhead() if self.is_cuda else 0
        release_free_heap()       # what loading left free in the heap: room for the RAM cache under a cap
        if ram_cache is None and cgroup_capped():
            # Under a memory cap the cache takes what the cap leaves now that the rest is loaded.
            reserve = (env_int("SLUICE_RAM_RESERVE_MIB") or RAM_RESERVE >> 20) << 20     # A/B switch
            budgets["default_ram"] = max(available_memory() - reserve, 0)
        self.plan = plan_budgets(workspace_bytes=work + graph_bytes + context_bytes, **budgets)
        telemetry.set(vram_budget_bytes=self.plan.vram_budget_bytes, vram_slot_bytes=self.plan.slot_bytes,
                      kv_tokens=max_tokens, vram_graph_bytes=graph_bytes, vram_context_bytes=context_bytes)
        telemetry.info["device"] = str(self.device)
        if self.is_cuda:
            telemetry.attach_driver_vram(DriverMemory(self.device.index or 0).used_bytes)
        self.store = ExpertStore(model_dir, telemetry)
        # a PLE model's n-gram rows stream from their own file through a cache inside the same RAM budget
        ngram_bytes = attach_ngram(self.model, model_dir.path, self.plan.ram_cache_bytes, telemetry)
        self.cache = RamCache(self.plan.ram_cache_bytes - ngram_bytes, layout.block_bytes, telemetry,
                              allocate=pinned_buffer if self.is_cuda else anonymous_buffer)
        self.banks = SlotBanks(self.plan.slots_per_bank, layout.block_bytes, self.device, telemetry)
        self.cache.uses = self.banks.rank                 # one routing frequency for both tiers' evictions
        table = self.model.embed_tokens
        if isinstance(table, FileTable) and keeps_table(available_memory(), self.plan.ram_cache_bytes, table.nbytes):
            table.keep_cached()
        self.experts = Experts(self.store, self.cache, self.banks, telemetry, layout, self.model.expert_mlp,
                               dtype, self.device, kernel, cpu=self._cpu_experts(layout, cpu_experts),
                               prefill_kernel=prefill_kernel)
        # RAM filled in the background with the blocks no prompt has read yet (Experts.fill); SLUICE_RAM_FILL=0: never
        self.fills = env_int("SLUICE_RAM_FILL") != 0
        self._lock = threading.Lock()             # a pass, a step or a fill at a time (the filler is another thread)
        self._used_at = time.monotonic()
        if self.fills:
            self.experts.plan_fill([(layer, e) for layer in self.spec.moe_layers for e in range(self.spec.num_experts)])
        if not self.is_cuda:
            device_bytes = dense_bytes + self.plan.slot_bytes + kv_bytes
            telemetry.set(vram_used_bytes=device_bytes)
            telemetry.set_max(vram_peak_bytes=device_bytes)
        if self.step.use_graphs and kernel is not None:
            s = self.step
            with torch.inference_mode():
                self.experts.capture({layer: (s.out[layer].h, s.out[layer].route_weights, s.moe_out[layer])
                                      for layer in s.moe_out})

    def _cpu_experts(self, layout, mode: str) -> CpuExperts | None:
        """Hybrid execution (CUDA, or forced with mode "all"): the CPU computes the RAM-resident experts
        the placement gives it, at speeds measured here, on this machine, now; in mode "auto" only where
        the CPU is faster than a copy (Placement.pays_off), else None, the speeds kept for the report. On CUDA the
        speeds are kept per machine (load_speeds.py): where they said "copying is faster", nothing is measured again
        and the fused kernel's numba never loads."""
        if mode not in MODES:
            raise SluiceError(f"cpu_experts must be one of {', '.join(MODES)}, not {mode!r}.")
        if mode == "off" or (mode == "auto" and layout.fmt not in CPU_FAST_FORMATS):
            return None           # auto: only formats the CPU multiplies without dequantising first
        if computes_in_place(self.device.type, layout.fmt, mode):
            mode = "all"
        if self.is_cuda:
            torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) - 1))   # one core stays the decode thread's
        threads = torch.get_num_threads()
        key = load_speeds.speeds_key(self.device, layout, self.model.expert_kernel, self.dtype, threads) if (
            self.is_cuda and mode == "auto") else None
        known = load_speeds.recall(key) if key else None
        if known is not None and not Placement(cpu_s=known["cpu_expert_s"], copy_s=known["copy_s"], mode=mode,
                                               cpu_load_s=known["cpu_expert_s"]).pays_off():
            # copying was faster at an earlier load: no CPU share, and no fused kernel loaded (load_speeds.py)
            self.telemetry.info["placement"] = {**known, "threads": threads, "mode": mode, "active": False,
                                                "measured": "earlier"}
            return None
        placement = Placement(cpu_s=0.0, copy_s=0.0, mode=mode)
        cpu = CpuExperts(layout, self.model.expert_mlp, self.dtype, self.device, self.spec.top_k, self.telemetry,
                         placement, activation=self.model.expert_kernel)
        offsets = {f.name: f.offset for f in layout.fields}
        block = random_bank(1, layout.block_bytes, layout.fmt, offsets, layout.intermediate, layout.hidden)[0]
        x = torch.randn(1, layout.hidden).to(self.dtype)
        kernel = cpu.choose_kernel(block, x)           # the torch expert or the fused kernel, timed here
        placement.cpu_s = placement.cpu_load_s = kernel["cpu_expert_s"]
        if self.is_cuda:
            placement.copy_s = measure_copy_s(block.pin_memory(), self.banks.banks[0][0])
        active = placement.pays_off()
        if key:
            load_speeds.remember(key, {**kernel, "copy_s": placement.copy_s})
        self.telemetry.info["placement"] = {**kernel, "copy_s": placement.copy_s,
                                            "threads": threads, "mode": mode, "active": active, "measured": "now"}
        return cpu if active else None

    def _capture_decode(self, base_bytes: int, resident_bytes: int, work: int) -> tuple[int, int]:
        """Capture the decode graphs (CUDA) before the slot banks exist -> (bytes they hold: pool and
        library workspaces, the workspace peak): measured, not estimated."""
        if not self.is_cuda:
            return 0, work
        torch.cuda.reset_peak_memory_stats(self.device)
        with torch.inference_mode():
            self.step.capture()
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

    def _choose_linear_kernels(self, weights: dict) -> None:
        """The int8 dense weights' GPU kernel, checked once per distinct shape; a shape that fails keeps
        the torch reference (and a warning says so)."""
        from kernels.selfcheck import select_int8_linear
        chosen: dict[tuple[int, int], object] = {}
        for w in [v for w in weights.values() if isinstance(w, Packed) for v in (w, *w.views)]:
            if w.shape not in chosen:
                fn, verdict = select_int8_linear(*w.shape, self.device, dtype=self.dtype, prompts=cublas_free())
                chosen[w.shape] = fn
                if not verdict.ok:
                    self.telemetry.warn(f"int8 dense kernel disabled for {tuple(w.shape)} on this GPU: {verdict.reason}")
            w.kernel = chosen[w.shape]

    def _choose_router_kernels(self) -> None:
        """The softmax top-k routers through kernels.router, checked once per shape (unless SLUICE_CUBLAS_FREE=0)."""
        from kernels.selfcheck import select_router
        chosen: dict[tuple, object] = {}
        # getattr: a family's own block (DeepSeek-V4's) may route without a `router`
        for router in [r for r in (getattr(b, "router", None) for b in self.model.blocks) if type(r) is Router]:
            key = (*router.weight.shape, router.top_k, router.renormalize)
            if key not in chosen:
                chosen[key], verdict = select_router(*key, self.device, dtype=self.dtype)
                if not verdict.ok:
                    self.telemetry.warn(f"Router kernel disabled for {key} on this GPU: {verdict.reason}")
            router.kernel = chosen[key]

    def top_candidates(self, k: int):
        """Top-k sampling's candidates kernel for k's block size (kernels/top_candidates.py), checked at its
        first use in this process (a cached verdict after a machine's first); None: the host takes the row."""
        if self._candidates is None or not 0 < k <= MAX_K:
            return None
        block = 1 << (k - 1).bit_length()
        if block not in self._candidates:
            from kernels.selfcheck import select_top_candidates
            self._candidates[block], verdict = select_top_candidates(self.spec.vocab_size, k, self.device)
            if not verdict.ok:
                self.telemetry.warn(f"Top-k sampling kernel disabled for k up to {block} on this GPU: {verdict.reason}")
        return self._candidates[block]

    def _choose_kernel(self, layout):
        from kernels.selfcheck import select_moe_decode
        offsets = {f.name: f.offset for f in layout.fields}
        activation = self.model.expert_kernel
        fn, verdict = select_moe_decode(layout.fmt, offsets, layout.block_bytes, layout.intermediate, layout.hidden,
                                        self.spec.top_k, self.device, dtype=self.dtype, activation=activation)
        self.kernel_verdict = verdict
        if not verdict.ok:
            self.telemetry.warn(f"Fused expert kernel disabled on this GPU: {verdict.reason}")
            return None
        return functools.partial(fn, activation=activation)

    def _choose_prefill_kernel(self, layout):
        """The prefill kernel where the expert format has one and it passes its check on this GPU, else None."""
        from kernels.moe_prefill import PREFILL_FORMATS, PrefillKernel, default_config
        from kernels.selfcheck import check_moe_prefill
        if layout.fmt not in PREFILL_FORMATS:
            return None
        offsets = {f.name: f.offset for f in layout.fields}
        verdict = check_moe_prefill(layout.fmt, offsets, layout.block_bytes, layout.intermediate, layout.hidden,
                                    self.spec.top_k, self.device, dtype=self.dtype, activation=self.model.expert_kernel)
        if not verdict.ok:
            self.telemetry.warn(f"Prefill expert kernel disabled on this GPU: {verdict.reason}")
            return None
        return PrefillKernel(default_config(self.dtype), self.model.expert_kernel)

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
        self.experts.synchronize()
        self.state.reset()
        ids = torch.tensor(token_ids, device=self.device)
        step = Step(torch.arange(len(token_ids), device=self.device), 0, self.state)
        self.experts.begin_pass()
        try:                                  # a pass changes the eviction policy (slots.py): end it always
            x = self.model.embed(ids)                                                 # [T, H]
            for layer, block in enumerate(self.model.blocks):
                if cancel is not None and cancel.is_set():
                    raise PrefillCancelled()
                x, h = block.mix(x, step)
                moe_out = None
                if block.is_moe:
                    weights, expert_ids = block.route(h)                              # [T, K], [T, K]
                    ids, nxt = expert_ids.flatten(), self.step.next_moe[layer]
                    if nxt is not None and self.experts.pass_reads:   # the next layer's router here: reads ahead
                        ids = torch.cat([ids, self.model.blocks[nxt].route(h)[1].flatten()])
                    moe_out = torch.empty(h.shape, dtype=torch.float32, device=self.device)
                    self.experts.run(layer, h, weights, ids, moe_out, nxt)
                x = block.combine(x, h, moe_out)
        finally:
            self.experts.end_pass()
        return self.model.head(x)

    def decode(self, token: int, position: int) -> torch.Tensor:
        """One token at `position` -> logits [V] float32, a static buffer: valid until the next step.
        The greedy token is in `self.step.token_out`."""
        with self._lock:
            try:
                return self._decode(token, position)
            finally:
                self._used_at = time.monotonic()

    def _decode(self, token: int, position: int) -> torch.Tensor:
        s = self.step
        s.set_step(token, position)
        self.experts.begin_step()
        for layer, block in enumerate(self.model.blocks):
            o = s.run_layer(layer)
            self.experts.run_deferred()        # the previous MoE layer's prefetch, behind this layer's mixer
            if block.is_moe:
                self.experts.run(layer, o.h, o.route_weights, o.ids, s.moe_out[layer], s.next_moe[layer],
                                 static_inputs=s.use_graphs, defer=self.defer_prefetch)
        s.run_head()
        self.experts.run_deferred()
        if self.fills:                         # where no allocation waits: the idle filler's may
            self.experts.fill(grow=False)
        if self.is_cuda and position % 16 == 0:   # a host-side counter (~60 us a read): a step's graphs allocate
            stats = torch.cuda.memory_stats_as_nested_dict(self.device)          # nothing, so now and then
            self.telemetry.set(vram_peak_bytes=stats["allocated_bytes"]["all"]["peak"])
        return s.logits

    def close(self) -> None:
        with self._lock:
            self.experts.synchronize()
            self.store.close()


def _load_dense(model_dir: ModelDir, device: torch.device, dtype: torch.dtype, progress,
                dense_quant: str | None = None) -> dict[str, torch.Tensor | Packed | FileTable]:
    """The dense weights on the device in the compute dtype, but for an embedding table the model reads
    from its file (file_table.table_in_file). With `dense_quant` "int8" the weights the family allows are
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
                weights[name] = dense_quant_.to_int8(tensor.to(dtype=dtype)).to(device)
            else:
                weights[name] = tensor.to(device=device, dtype=dtype if tensor.is_floating_point() else None)
            if progress and i % 32 == 0:
                progress(i, len(names), "loading dense weights")
    drop_file_cache(path)       # read once, now on the device (the table left there is read again as needed)
    return weights
