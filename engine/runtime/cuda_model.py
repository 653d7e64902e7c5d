"""A Sluice model on a CUDA device under hard VRAM and RAM budgets: prefill and greedy/sampled decode.

  dense weights  -> VRAM, in the compute dtype
  KV cache       -> VRAM, allocated once at the size the run asks for (prompt + new tokens)
  expert blocks  -> disk (O_DIRECT) -> pinned RAM LRU cache (grows as it fills, never past its budget)
                 -> two VRAM slot banks; the rest of the VRAM budget after dense, KV and workspace
Prefill runs the whole prompt through each layer (the engine's scheduler: experts in batches, each
read at most once per layer); decode runs CUDA-graphed dense pieces and the streaming fused-kernel
MoE (engine.runtime.streaming). Works on the CPU too (no graphs, reference math, plain buffers).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from safetensors.torch import load_file

from engine.runtime.budget import plan_budgets
from engine.runtime.cache import RamCache
from engine.model.layers import KVCache
from engine.format.modeldir import DENSE_FILE, open_model_dir
from engine.model.decoder import MoeDecoder
from engine.model.hybrid import HybridDecoder, HybridState
from engine.runtime.scheduler import ExpertScheduler
from engine.sizes import parse_size
from engine.runtime.slots import SlotBanks
from engine.model.spec import rope_inv_freq
from engine.runtime.store import ExpertStore
from engine.runtime.telemetry import Telemetry
from engine.runtime.decode_step import DenseDecode
from engine.runtime.hybrid_decode_step import HybridDenseDecode
from engine.runtime.pinned import pinned_buffer
from engine.runtime.streaming import StreamingMoe


@dataclass
class Timings:
    prefill_s: float = 0.0
    decode_s: float = 0.0
    prompt_tokens: int = 0
    new_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    after_prefill: dict = field(default_factory=dict)     # telemetry snapshot between the two phases


def workspace_bytes(spec, prompt_tokens: int, dtype_bytes: int, device_type: str = "cuda") -> int:
    """Transient VRAM of a whole-prompt prefill: attention (fused on CUDA: the [T, S] mask; else
    fp32 scores + probs), activations, one dequantized expert, logits. An upper estimate; the run
    reports the measured peak."""
    t = prompt_tokens
    scores = t * t if device_type == "cuda" else spec.num_heads * t * t * (4 + dtype_bytes + 4)
    acts = t * (spec.hidden_size * 12 + spec.num_heads * spec.head_dim * 4) * 4
    expert = 3 * spec.expert_intermediate * spec.hidden_size * 4 + t * spec.expert_intermediate * 3 * 4
    return scores + acts + expert + spec.vocab_size * 8 + (64 << 20)


class CudaModel:
    def __init__(self, model_dir, device="cuda", vram_budget=None, ram_cache=None, dtype=torch.bfloat16,
                 max_tokens: int = 4096, max_prompt_tokens: int | None = None, use_graphs: bool = True,
                 use_kernels: bool = True, num_predicted: int | None = None, telemetry: Telemetry | None = None,
                 default_vram: int = 8 << 30, default_ram: int = 8 << 30):
        self.device = torch.device(device)
        self.telemetry = telemetry or Telemetry()
        self.model_dir = open_model_dir(model_dir)
        spec, layout = self.model_dir.spec, self.model_dir.layout
        self.spec, self.dtype = spec, dtype
        dtype_bytes = torch.empty((), dtype=dtype).element_size()
        is_cuda = self.device.type == "cuda"
        base_bytes = 0
        if is_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            base_bytes = torch.cuda.memory_allocated(self.device)      # not ours (e.g. other models in a test)
        dense = load_file(str(self.model_dir.path / DENSE_FILE), device="cpu")
        weights = {k: v.to(self.device, dtype) for k, v in dense.items()}
        del dense
        dense_bytes = sum(t.numel() * t.element_size() for t in weights.values())
        kv_bytes = 2 * spec.num_layers * max_tokens * spec.num_kv_heads * spec.head_dim * dtype_bytes
        if spec.hybrid:
            kv_bytes = HybridState.bytes_needed(spec, max_tokens, dtype_bytes)
        work = workspace_bytes(spec, max_prompt_tokens or max_tokens, dtype_bytes, self.device.type)
        budgets = dict(block_bytes=layout.block_bytes, top_k=spec.top_k, num_experts=spec.num_experts,
                       num_moe_layers=len(spec.moe_layers), dense_bytes=dense_bytes, kv_bytes=kv_bytes,
                       vram_budget=parse_size(vram_budget), ram_cache=parse_size(ram_cache),
                       default_vram=default_vram, default_ram=default_ram)
        plan_budgets(workspace_bytes=work, **budgets)                    # fail early, before allocating more
        inv_freq, scaling = rope_inv_freq(self.model_dir.manifest["config"], spec)
        self.decoder = (HybridDecoder if spec.hybrid else MoeDecoder)(spec, weights, layout, inv_freq.to(self.device),
                                                                      scaling, dtype, cache_decoded=False)
        offsets = {f.name: f.offset for f in layout.fields}
        self.kernel_verdict = None
        # The self-check's scratch bank (top_k + 1 blocks) comes and goes before KV and slots exist.
        kernel = self._choose_kernel(layout, offsets, use_kernels)
        self.kv = KVCache(spec.num_layers, spec.num_kv_heads, spec.head_dim, max_tokens, dtype, self.device,
                          initial_tokens=max_tokens) if not spec.hybrid else \
            HybridState(spec, max_tokens, dtype, self.device, initial_tokens=max_tokens)
        for store in (self.kv.k, self.kv.v):
            for t in store:
                t.zero_()
        self.dense_decode = (HybridDenseDecode if spec.hybrid else DenseDecode)(
            self.decoder, self.kv, self.device, num_predicted or spec.top_k, use_graphs)
        graph_bytes = 0
        if is_cuda:
            # Capture the decode graphs now, before the slot banks exist, and charge what they really
            # hold (their memory pool, library workspaces of their capture streams) and the peak they
            # reached to the budget: measured, not estimated. The banks get what is left.
            if self.dense_decode.use_graphs:
                with torch.inference_mode():
                    self.dense_decode.capture()
            torch.cuda.synchronize(self.device)
            held = torch.cuda.memory_allocated(self.device) - base_bytes
            peak = torch.cuda.max_memory_allocated(self.device) - base_bytes
            graph_bytes = max(held - dense_bytes - kv_bytes, 0)
            work = max(work, peak - held)
        self.plan = plan_budgets(workspace_bytes=work + graph_bytes, **budgets)
        self.telemetry.set(vram_budget_bytes=self.plan.vram_budget_bytes, vram_slot_bytes=self.plan.slot_bytes,
                           kv_tokens=max_tokens, vram_graph_bytes=graph_bytes)
        self.telemetry.info["device"] = str(self.device)
        self.store = ExpertStore(self.model_dir, self.telemetry)
        allocate = pinned_buffer if is_cuda else None
        self.cache = RamCache(self.plan.ram_cache_bytes, layout.block_bytes, self.telemetry,
                              **({"allocate": allocate} if allocate else {}))
        self.banks = SlotBanks(self.plan.slots_per_bank, layout.block_bytes, self.device, self.telemetry)
        self.scheduler = ExpertScheduler(self.store, self.cache, self.banks, self.telemetry)
        self.moe = StreamingMoe(self.store, self.cache, self.banks, self.telemetry, kernel, layout.fmt, offsets,
                                layout.intermediate, self.device)
        if self.dense_decode.use_graphs and self.kernel_verdict is not None and self.kernel_verdict.ok:
            # (the torch reference reads slot ids on the host: it cannot be captured, and runs eagerly)
            d = self.dense_decode
            with torch.inference_mode():
                self.moe.capture({layer: (d.out[layer].h, d.out[layer].route_weights, d.moe_out[layer])
                                  for layer in spec.moe_layers})

    def _choose_kernel(self, layout, offsets, use_kernels):
        from kernels.moe_decode import moe_decode_ref
        if not use_kernels or self.device.type != "cuda":
            return moe_decode_ref
        from kernels.selfcheck import select_moe_decode
        fn, verdict = select_moe_decode(layout.fmt, offsets, layout.block_bytes, layout.intermediate, layout.hidden,
                                        self.spec.top_k, self.device, dtype=self.dtype)
        self.kernel_verdict = verdict
        if not verdict.ok:
            self.telemetry.warn(f"Fused expert kernel disabled on this GPU: {verdict.reason}")
        return fn

    # ------------------------------------------------------------------ generation
    def generate(self, prompt_ids: list[int], max_new_tokens: int, on_token=None,
                 feed_ids: list[int] | None = None) -> Timings:
        """Greedy decode (the benchmark and equality tests need determinism). Returns timings + ids.
        feed_ids (benchmarks): decode step i takes feed_ids[i] as input instead of the previous
        greedy token (a random-weight model's greedy output repeats itself, and so would its
        experts); the greedy token is still computed and read back, so the cost is the same."""
        timings = Timings(prompt_tokens=len(prompt_ids))
        if len(prompt_ids) + max_new_tokens > self.kv.max_tokens:
            raise ValueError(f"prompt + new tokens ({len(prompt_ids) + max_new_tokens}) exceed the KV cache "
                             f"({self.kv.max_tokens} tokens)")
        self.kv.reset()                    # a new conversation (zeroes fixed DeltaNet states)
        self.begin_prefill()
        self._sync()
        start = time.perf_counter()
        self.scheduler.begin_pass()
        ids = torch.tensor(prompt_ids, device=self.device)
        with torch.inference_mode():
            logits = self.decoder.forward(ids, 0, self.kv, self.scheduler)
        self.scheduler.end_pass()
        token = int(torch.argmax(logits))
        timings.prefill_s = time.perf_counter() - start
        timings.after_prefill = self.telemetry.snapshot()
        timings.token_ids.append(token)
        if on_token:
            on_token(token)
        start = time.perf_counter()
        position = len(prompt_ids)
        with torch.inference_mode():
            for step in range(max_new_tokens - 1):
                self.decode_step(token if feed_ids is None else feed_ids[step], position)
                token = int(self.dense_decode.token_out)    # the per-token host sync
                timings.token_ids.append(token)
                position += 1
                if on_token:
                    on_token(token)
        self._sync()
        timings.decode_s = time.perf_counter() - start
        timings.new_tokens = len(timings.token_ids)
        self.telemetry.set(ttft_s=timings.prefill_s, prefill_tok_s=len(prompt_ids) / max(timings.prefill_s, 1e-9),
                           decode_tok_s=(timings.new_tokens - 1) / max(timings.decode_s, 1e-9))
        if self.device.type == "cuda":
            self.telemetry.set(vram_peak_bytes=torch.cuda.max_memory_allocated(self.device))
        return timings

    def begin_prefill(self) -> None:
        """Before a prefill (engine scheduler, synchronous copies): finish the decode path's copies."""
        self.moe.synchronize()

    def decode_step(self, token: int, position: int) -> torch.Tensor:
        """One token at `position` -> logits [V] float32, a static buffer: valid until the next step
        (clone it to keep it). The greedy token is in `self.dense_decode.token_out`. The graphs were
        captured at load."""
        d, spec = self.dense_decode, self.spec
        d.set_step(token, position)
        for layer in range(spec.num_layers):
            o = d.run_layer(layer)
            if spec.is_moe_layer(layer):
                self.moe.run(layer, o.h, o.route_weights, o.ids, d.moe_out[layer], d.next_moe[layer],
                             static_inputs=d.use_graphs)
        d.run_head()
        if self.device.type == "cuda":
            self.telemetry.set(vram_peak_bytes=torch.cuda.max_memory_allocated(self.device))   # host-side counter
        return d.logits

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        self.moe.synchronize()
        self.store.close()
