"""The engine: one loaded model, its expert streaming machinery, and generation.

    eng = Engine.load(model_dir, device="cpu", vram_budget="2GB", ram_cache="4GB")
    for event in eng.generate(messages, GenerationParams(...)): ...
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from engine.format import modeldir
from engine.runtime.budget import plan_budgets
from engine.runtime.cache import RamCache, anonymous_buffer
from engine.detokenize import IncrementalDetokenizer
from engine.errors import SluiceError
from engine.plan.hardware import available_memory
from engine.model.layers import KVCache
from engine.model.decoder import MoeDecoder, decoded_expert_bytes
from engine.model.hybrid import HybridDecoder, HybridState
from engine.params import GenerationParams, TokenEvent
from engine.runtime.sampling import sample
from engine.runtime.scheduler import ExpertScheduler
from engine.sizes import parse_size
from engine.runtime.slots import SlotBanks
from engine.format.resolve import resolve_model_dir
from engine.model.spec import rope_inv_freq
from engine.runtime.store import ExpertStore
from engine.runtime.telemetry import Telemetry, current_cpu

MAX_CONTEXT_TOKENS = 8192


class Engine:
    def __init__(self, model: modeldir.ModelDir, device: torch.device, dtype: torch.dtype,
                 vram_budget: int | None, ram_cache: int | None, progress=None):
        self.model, self.spec, self.device, self.dtype = model, model.spec, device, dtype
        self.telemetry_source = Telemetry()
        self._cancel = threading.Event()
        self._lock = threading.Lock()           # one generation at a time
        spec = self.spec
        self.max_context = min(spec.max_position_embeddings, MAX_CONTEXT_TOKENS)
        self.gpu = None
        if device.type == "cuda":
            self._init_cuda(model, device, dtype, vram_budget, ram_cache)
        else:
            self._init_cpu(model, device, dtype, vram_budget, ram_cache, progress)
        self.tokenizer = self._load_tokenizer()
        self.eos_token_ids = set(spec.eos_token_ids) | self._generation_config_eos()

    def _init_cpu(self, model, device, dtype, vram_budget, ram_cache, progress) -> None:
        """The CPU device: same store, cache, slots and scheduler; torch reference math."""
        spec, layout = self.spec, model.layout
        with safe_open(str(model.path / modeldir.DENSE_FILE), framework="pt") as f:
            names = list(f.keys())
            weights = {}
            for i, name in enumerate(names):
                weights[name] = f.get_tensor(name).to(device=device, dtype=dtype)
                if progress and i % 32 == 0:
                    progress(i, len(names), "loading dense weights")
        dense_bytes = sum(t.numel() * t.element_size() for t in weights.values())
        elem = torch.empty((), dtype=dtype).element_size()
        kv_bytes = 2 * spec.num_layers * self.max_context * spec.num_kv_heads * spec.head_dim * elem
        if spec.hybrid:
            kv_bytes = HybridState.bytes_needed(spec, self.max_context, elem)
        available = available_memory()
        self.plan = plan_budgets(
            block_bytes=layout.block_bytes, top_k=spec.top_k, num_experts=spec.num_experts,
            num_moe_layers=len(spec.moe_layers), dense_bytes=dense_bytes, kv_bytes=kv_bytes, workspace_bytes=0,
            vram_budget=vram_budget, ram_cache=ram_cache,
            default_vram=available // 4, default_ram=available // 2,
            device_slot_bytes=layout.block_bytes + decoded_expert_bytes(layout, dtype))

        t = self.telemetry_source
        t.info.update(device=str(device))
        t.set(vram_budget_bytes=self.plan.vram_budget_bytes, vram_slot_bytes=self.plan.slot_bytes)
        self.store = ExpertStore(model, t)
        self.cache = RamCache(self.plan.ram_cache_bytes, layout.block_bytes, t, allocate=anonymous_buffer)
        self.slots = SlotBanks(self.plan.slots_per_bank, layout.block_bytes, device, t)
        self.scheduler = ExpertScheduler(self.store, self.cache, self.slots, t)
        self.kv = KVCache(spec.num_layers, spec.num_kv_heads, spec.head_dim, self.max_context, dtype, device) \
            if not spec.hybrid else HybridState(spec, self.max_context, dtype, device)
        device_bytes = dense_bytes + self.plan.slot_bytes + kv_bytes
        t.set(vram_used_bytes=device_bytes)
        t.set_max(vram_peak_bytes=device_bytes)
        inv_freq, scaling = rope_inv_freq(model.manifest["config"], spec)
        self.decoder = (HybridDecoder if spec.hybrid else MoeDecoder)(spec, weights, layout, inv_freq.to(device),
                                                                      scaling, dtype)

    def _init_cuda(self, model, device, dtype, vram_budget, ram_cache) -> None:
        """The CUDA path (engine.gpu): pinned RAM cache of exact size, overlapped streaming into two
        slot banks with speculative prefetch, self-checked Triton kernels, CUDA-graph decode."""
        from engine.runtime.cuda_model import CudaModel
        available = available_memory()
        eager = os.environ.get("SLUICE_EAGER", "") not in ("", "0")    # the one switch: no CUDA graphs, no Triton
        gpu = CudaModel(model.path, device=device, vram_budget=vram_budget, ram_cache=ram_cache, dtype=dtype,
                        max_tokens=self.max_context, telemetry=self.telemetry_source,
                        use_graphs=not eager, use_kernels=not eager,
                        default_vram=torch.cuda.mem_get_info(device)[0] * 9 // 10, default_ram=available // 2)
        self.gpu, self.plan, self.decoder, self.kv = gpu, gpu.plan, gpu.decoder, gpu.kv
        self.store, self.cache, self.slots, self.scheduler = gpu.store, gpu.cache, gpu.banks, gpu.scheduler

    @classmethod
    def load(cls, model_dir, device: str = "cpu", vram_budget=None, ram_cache=None, dtype=None, progress=None) -> "Engine":
        dev = _pick_device(device)
        path = resolve_model_dir(Path(model_dir).expanduser(), progress)
        model = modeldir.open_model_dir(path)
        if dtype is None:
            compute = torch.float32 if dev.type == "cpu" else torch.bfloat16
        else:
            compute = getattr(torch, str(dtype).removeprefix("torch."), None)
            if not isinstance(compute, torch.dtype) or not compute.is_floating_point:
                raise SluiceError(f"Unknown compute dtype '{dtype}': use float32, bfloat16 or float16.")
        return cls(model, dev, compute, parse_size(vram_budget), parse_size(ram_cache), progress)

    @property
    def info(self) -> dict:
        s = self.spec
        return {"name": self.model.name, "path": str(self.model.path), "family": s.family, "num_layers": s.num_layers,
                "num_experts": s.num_experts, "top_k": s.top_k, "quant": self.model.quant, "device": str(self.device),
                "dtype": str(self.dtype).removeprefix("torch."), "expert_bytes": self.model.layout.block_bytes,
                "expert_bytes_total": self.model.expert_bytes_total, "slots_per_bank": self.plan.slots_per_bank,
                "ram_cache_bytes": self.plan.ram_cache_bytes, "vram_budget_bytes": self.plan.vram_budget_bytes,
                "direct_io": self.store.is_direct, "max_context": self.max_context,
                "has_chat_template": bool(self.tokenizer is not None and getattr(self.tokenizer, "chat_template", None))}

    def _load_tokenizer(self):
        if "tokenizer.json" not in self.model.manifest.get("tokenizer_files", []) and \
                "tokenizer.model" not in self.model.manifest.get("tokenizer_files", []):
            return None
        from transformers import AutoTokenizer
        try:
            return AutoTokenizer.from_pretrained(str(self.model.path))
        except (OSError, ValueError) as exc:
            raise SluiceError(f"The tokenizer files in '{self.model.path}' cannot be read ({exc}); repack the model.") from exc

    def _generation_config_eos(self) -> set[int]:
        import json
        path = self.model.path / "generation_config.json"
        if not path.is_file():
            return set()
        eos = json.loads(path.read_text()).get("eos_token_id")
        return set(eos if isinstance(eos, list) else [] if eos is None else [eos])

    # ---- public API -------------------------------------------------------------------------------
    def encode(self, prompt) -> tuple[list[int], bool]:
        """messages | text | token ids -> (prompt ids, whether a chat template was applied)."""
        if isinstance(prompt, (list, tuple)) and all(isinstance(i, int) for i in prompt):
            return list(prompt), False
        if self.tokenizer is None:
            raise SluiceError("This model has no tokenizer files; pass token ids (--prompt-ids) instead of text.")
        if isinstance(prompt, str):
            return self.tokenizer(prompt)["input_ids"], False
        if not getattr(self.tokenizer, "chat_template", None):
            raise SluiceError("This model has no chat template; use a plain prompt instead of chat mode.")
        _refuse_images(prompt)
        ids = self.tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids), True

    def generate(self, prompt, params: GenerationParams | None = None) -> Iterator[TokenEvent]:
        params = params or GenerationParams()
        prompt_ids, is_chat = self.encode(prompt)
        if not prompt_ids:
            raise SluiceError("The prompt is empty; type something to send.")
        if len(prompt_ids) + params.max_new_tokens > self.max_context:
            raise SluiceError(f"The prompt ({len(prompt_ids)} tokens) plus {params.max_new_tokens} new tokens exceeds "
                              f"the {self.max_context}-token context Sluice keeps for this model; start a new chat or shorten it.")
        if not self._lock.acquire(blocking=False):
            raise SluiceError("The engine is already generating; wait for it or stop it first.")
        try:
            yield from self._generate(prompt_ids, is_chat, params)
        finally:
            self._lock.release()

    def cancel(self) -> None:
        self._cancel.set()

    def telemetry(self) -> dict:
        snap = self.telemetry_source.snapshot()
        snap["model"] = {"name": self.model.name, "family": self.spec.family, "quant": self.model.quant}
        return snap

    def close(self) -> None:
        if self.gpu is not None:
            self.gpu.close()
        else:
            self.store.close()

    # ---- generation loop ---------------------------------------------------------------------------
    def _generate(self, prompt_ids: list[int], is_chat: bool, params: GenerationParams) -> Iterator[TokenEvent]:
        t = self.telemetry_source
        self._cancel.clear()
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        eos = set(self.eos_token_ids)
        if is_chat and self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        detok = IncrementalDetokenizer(self.tokenizer, params.stop) if self.tokenizer is not None else None
        t.set(prompt_tokens=len(prompt_ids), generated_tokens=0, decode_tok_s=0.0, ttft_s=0.0)

        start = time.perf_counter()
        self.kv.reset()
        if self.gpu is not None:
            self.gpu.begin_prefill()
        self.scheduler.begin_pass()
        with torch.inference_mode():
            logits = self.decoder.forward(torch.tensor(prompt_ids, device=self.device), 0, self.kv, self.scheduler)
        self.scheduler.end_pass()
        prefill_s = time.perf_counter() - start
        t.set(prefill_tok_s=len(prompt_ids) / prefill_s, ttft_s=prefill_s, decode_thread_core=current_cpu())

        position, generated, decode_start = len(prompt_ids), 0, time.perf_counter()
        while True:
            if self._cancel.is_set():
                yield TokenEvent(None, detok.flush() if detok else "", True, "cancelled")
                return
            token = sample(logits, params, generator)
            generated += 1
            t.set(generated_tokens=generated)
            if generated > 1:
                t.set(decode_tok_s=(generated - 1) / (time.perf_counter() - decode_start))
            else:
                decode_start = time.perf_counter()
            if token in eos:
                yield TokenEvent(token, detok.flush() if detok else "", True, "eos")
                return
            text = detok.push(token) if detok else ""
            if detok and detok.stopped:
                yield TokenEvent(token, text, True, "stop")
                return
            if generated >= params.max_new_tokens:
                yield TokenEvent(token, text + (detok.flush() if detok else ""), True, "length")
                return
            yield TokenEvent(token, text)
            with torch.inference_mode():
                if self.gpu is not None:
                    logits = self.gpu.decode_step(token, position)
                else:
                    logits = self.decoder.forward(torch.tensor([token], device=self.device), position, self.kv,
                                                  self.scheduler)
            position += 1


def _refuse_images(messages) -> None:
    """Sluice runs text models (of a vision-language checkpoint, the text part only)."""
    for m in messages:
        parts = m.get("content") if isinstance(m, dict) else None
        has_media = isinstance(parts, list) and any(isinstance(p, dict) and p.get("type", "text") != "text" for p in parts)
        if has_media or (isinstance(m, dict) and (m.get("images") or m.get("image"))):
            raise SluiceError("Images are not supported: Sluice runs the text part of this model only; "
                              "send the message without the image.")


def _pick_device(device: str) -> torch.device:
    if device not in ("cpu", "cuda") and not str(device).startswith("cuda:"):
        raise SluiceError(f"Unknown device '{device}': use cpu or cuda.")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SluiceError("No CUDA GPU is available (or this PyTorch build has no CUDA); use --device cpu.")
    return torch.device(device)
