"""The engine: one loaded model, its expert streaming machinery, and generation.

    eng = Engine.load(model_dir, device="cpu", vram_budget="2GB", ram_cache="4GB")
    for event in eng.generate(messages, GenerationParams(...)): ...
"""
from __future__ import annotations

import atexit
import threading
import time
import weakref
from pathlib import Path
from typing import Iterator

import torch

import engine.chat_template as chat_template
from engine.format import generation_config, modeldir
from engine.model import dense_quant as dense_quant_
from engine.detokenize import IncrementalDetokenizer
from engine.errors import SluiceError
from engine.options import Options
from engine.host import available_memory
from engine.plan.hardware import check_ram_cache_fits
from engine.params import GenerationParams, TokenEvent
from engine.runtime.sampling import TokenSampler
from engine.sizes import parse_size
from engine.format.resolve import resolve_model_dir
from engine.runtime.budget import default_budgets, default_context
from engine.runtime.kernel_warmup import ensure_warm
from engine.runtime.runner import PrefillCancelled, Runner
from engine.runtime.telemetry import Telemetry, current_cpu

FILL_IDLE_S = 1.0       # seconds without a generation before RAM is filled in the background
FILL_POLL_S = 0.005     # how often the filler looks (a read takes ~3 ms at 2 GB/s)
_FILLING: "weakref.WeakSet[Engine]" = weakref.WeakSet()      # engines whose RAM filler may still run


@atexit.register
def _stop_fillers() -> None:
    """At interpreter exit, the fillers of engines never closed are stopped first: a daemon thread still inside a
    torch call when Python finalizes is torn down through C++ frames, which aborts the process ("terminate called
    without an active exception") after a script or test that did not close its engine."""
    for engine in list(_FILLING):
        engine._stop_filling()


class Engine:
    def __init__(self, model: modeldir.ModelDir, device: torch.device, dtype: torch.dtype,
                 vram_budget: int | None, ram_cache: int | None, progress=None, max_context: int | None = None,
                 dense_quant: str | None = None, options: Options = Options()):
        self.model, self.spec, self.device, self.dtype, self.options = model, model.spec, device, dtype, options
        self.dense_quant = dense_quant_.check(dense_quant, self.spec.family)
        self.telemetry_source = Telemetry()
        # the first load on this machine and setting: kernels checked and compiled in a child (kernel_warmup.py)
        self.kernel_warmup = (ensure_warm(model.path, device, dtype, self.dense_quant, options, progress)
                              if device.type == "cuda" and not options.eager else None)
        self._cancel = threading.Event()
        self._lock = threading.Lock()           # one generation at a time
        self._closing = threading.Event()
        free_vram = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0
        default_vram, default_ram = default_budgets(device.type, free_vram, available_memory())
        self.max_context = self._choose_context(max_context, vram_budget or default_vram)
        self.runner = Runner(model, device, dtype, self.telemetry_source, vram_budget=vram_budget, ram_cache=ram_cache,
                             max_tokens=self.max_context, dense_quant=self.dense_quant, options=options,
                             default_vram=default_vram, default_ram=default_ram, progress=progress)
        self.plan = self.runner.plan
        self.tokenizer = self._load_tokenizer()
        self.eos_token_ids = set(self.spec.eos_token_ids) | self._generation_config_eos()
        self._filler = None
        if self.runner.fills:
            self._filler = threading.Thread(target=self._fill_while_idle, name="sluice-ram-fill", daemon=True)
            self._filler.start()
            _FILLING.add(self)

    def _fill_while_idle(self) -> None:
        """Once the runner has been idle for FILL_IDLE_S, the blocks no prompt has read yet go into free RAM slots,
        a few reads at a time (Runner.fill): a model that fits in RAM is all there before the user's next prompt,
        whose prefill then reads nothing from the disk. A pass or step that starts waits at most for one `fill`
        call (microseconds; longer only if it must wait for a chunk of the cache being page-locked), not for its
        reads. While the runner works the thread sleeps until it could be idle long enough; it ends when nothing
        is left to read or at `close`."""
        pause = FILL_IDLE_S
        try:
            while not self._closing.wait(pause):
                idle = self.runner.idle_s()
                if idle < FILL_IDLE_S:
                    pause = max(FILL_POLL_S, FILL_IDLE_S - idle)
                    continue
                if not self.runner.fill():
                    return
                pause = FILL_POLL_S
        except Exception:      # noqa: BLE001 - filling is only ahead of need: a prompt's own read reports the error
            return

    def _choose_context(self, requested: int | None, vram_budget: int) -> int:
        """The context (prompt + answer tokens) the model state is made for: as asked, or the model's own
        limit cut to what the VRAM budget holds beside the dense weights and the expert slots (runtime.budget)."""
        from engine.runtime.experts import decoded_expert_bytes
        spec, layout = self.spec, self.model.layout
        limit = spec.max_position_embeddings
        if requested is not None:
            if not 1 <= requested <= limit:
                raise SluiceError(f"A context of {requested} tokens is not possible for this model: choose "
                                  f"between 1 and {limit} tokens (its own limit).")
            return requested
        is_cuda = self.device.type == "cuda"
        slot = layout.block_bytes + (0 if is_cuda else decoded_expert_bytes(layout, self.dtype))
        dense_bytes = dense_quant_.planned_bytes(self.model.dense_shapes, self.dtype, spec.family, self.dense_quant,
                                                 self.model.dense_dtypes)
        return default_context(spec, self.dtype, self.device.type, vram_budget, dense_bytes, slot)

    @classmethod
    def load(cls, model_dir, device: str = "cpu", vram_budget=None, ram_cache=None, dtype=None, progress=None,
             max_context: int | None = None, cpu_experts: str | None = None, dense_quant: str | None = None,
             options: Options | None = None) -> "Engine":
        """cpu_experts: "auto" (the placement cost model decides, CUDA only), "all" (every RAM-resident
        expert of a decode step is computed by the CPU; also on the CPU device, for tests) or "off"; given, it
        wins over options.cpu_experts. dense_quant: None (dense weights in the compute dtype) or "int8"
        (engine.model.dense_quant). options: the tunables (engine.options.Options; the defaults when None)."""
        options = options or Options()
        if cpu_experts is not None:
            options = options.replace(cpu_experts=cpu_experts)
        dev = _pick_device(device)
        check_ram_cache_fits(parse_size(ram_cache))
        path = resolve_model_dir(Path(model_dir).expanduser(), progress)
        model = modeldir.open_model_dir(path)
        if dtype is None:
            compute = torch.float32 if dev.type == "cpu" else torch.bfloat16
        else:
            compute = getattr(torch, str(dtype).removeprefix("torch."), None)
            if not isinstance(compute, torch.dtype) or not compute.is_floating_point:
                raise SluiceError(f"Unknown compute dtype '{dtype}': use float32, bfloat16 or float16.")
        return cls(model, dev, compute, parse_size(vram_budget), parse_size(ram_cache), progress, max_context,
                   dense_quant, options)

    @property
    def info(self) -> dict:
        s = self.spec
        return {"name": self.model.name, "path": str(self.model.path), "family": s.family, "num_layers": s.num_layers, "vocab_size": s.vocab_size,
                "num_experts": s.num_experts, "top_k": s.top_k, "quant": self.model.quant, "dense_quant": self.dense_quant or "none", "device": str(self.device),
                "dtype": str(self.dtype).removeprefix("torch."), "expert_bytes": self.model.layout.block_bytes,
                "expert_bytes_total": self.model.expert_bytes_total, "slots_per_bank": self.plan.slots_per_bank,
                "ram_cache_bytes": self.plan.ram_cache_bytes, "vram_budget_bytes": self.plan.vram_budget_bytes,
                "direct_io": self.runner.store.is_direct, "max_context": self.max_context,
                "model_max_context": self.spec.max_position_embeddings,
                "min_ram_cache_bytes": self.spec.top_k * self.model.layout.block_bytes,
                "min_vram_budget_bytes": (self.plan.dense_bytes + self.plan.kv_bytes + self.plan.workspace_bytes
                                          + 2 * self.spec.top_k * self.plan.device_slot_bytes),
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
        return generation_config.eos_token_ids(self.model.path)

    # ---- public API -------------------------------------------------------------------------------
    def encode(self, prompt) -> tuple[list[int], bool]:
        """messages | {"messages", "tools"} | text | token ids -> (prompt ids, whether a chat template was applied)."""
        tools = None
        if isinstance(prompt, dict):        # a chat with tool definitions for the template (the HTTP server)
            prompt, tools = prompt["messages"], prompt.get("tools") or None
        if isinstance(prompt, (list, tuple)) and all(isinstance(i, int) for i in prompt):
            return list(prompt), False
        if self.tokenizer is None:
            raise SluiceError("This model has no tokenizer files; pass token ids (--prompt-ids) instead of text.")
        if isinstance(prompt, str):
            return self.tokenizer(prompt)["input_ids"], False
        if not getattr(self.tokenizer, "chat_template", None):
            raise SluiceError("This model has no chat template; use a plain prompt instead of chat mode.")
        _refuse_images(prompt)
        return chat_template.apply(self.tokenizer, list(prompt), tools), True

    def generate(self, prompt, params: GenerationParams | None = None) -> Iterator[TokenEvent]:
        params = params or GenerationParams()
        params.validate(self.spec.vocab_size, prompt)
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
        self._stop_filling()
        self.runner.close()

    def wait_ram_filled(self, timeout_s: float) -> bool:
        """Fill RAM now, as the idle filler does, until nothing is left to read or RAM is full, for at most
        `timeout_s` -> whether it got there: a model that fits in RAM then reads nothing from the disk again (the
        steady state a user reaches while reading an answer). The filler's idle wait is not waited for."""
        deadline = time.monotonic() + timeout_s
        while self.runner.fill():
            if time.monotonic() >= deadline:
                return False
            time.sleep(FILL_POLL_S)
        return True

    def _stop_filling(self) -> None:
        """The RAM filler ended (it stops between two `fill` calls, each a few reads)."""
        self._closing.set()
        if self._filler is not None:
            self._filler.join()
        _FILLING.discard(self)

    # ---- generation loop ---------------------------------------------------------------------------
    def _generate(self, prompt_ids: list[int], is_chat: bool, params: GenerationParams) -> Iterator[TokenEvent]:
        t = self.telemetry_source
        self._cancel.clear()
        candidates = self.runner.top_candidates(params.top_k) if params.temperature > 0 and params.top_k else None
        eos = set(self.eos_token_ids)
        if is_chat and self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        sampler = TokenSampler(params, self.device, candidates, self._constraint(params, eos), self.spec.vocab_size)
        detok = IncrementalDetokenizer(self.tokenizer, params.stop, params.keep_special_tokens) if self.tokenizer is not None else None
        t.set(prompt_tokens=len(prompt_ids), generated_tokens=0, decode_tok_s=0.0, ttft_s=0.0)
        logits = self._prefill(prompt_ids)
        if logits is None:
            yield TokenEvent(None, "", True, "cancelled")
            return
        position, generated, decode_start = len(prompt_ids), 0, time.perf_counter()
        while True:
            if self._cancel.is_set():
                yield TokenEvent(None, detok.flush() if detok else "", True, "cancelled")
                return
            token = sampler(logits)
            generated += 1
            t.set(generated_tokens=generated)
            if generated > 1:
                t.set(decode_tok_s=(generated - 1) / (time.perf_counter() - decode_start))
            else:
                decode_start = time.perf_counter()
            event = _token_event(token, generated, params, eos, detok, sampler.logprobs or (None, None))
            yield event
            if event.finished:
                return
            with torch.inference_mode():
                logits = self.runner.decode(token, position)
            position += 1

    def _prefill(self, prompt_ids: list[int]) -> torch.Tensor | None:
        """The prompt's pass -> its last token's logits, or None when cancel() stopped it (between layers)."""
        start = time.perf_counter()
        try:
            with torch.inference_mode():
                logits = self.runner.prefill(prompt_ids, self._cancel)
        except PrefillCancelled:
            return None
        prefill_s = time.perf_counter() - start
        self.telemetry_source.set(prefill_tok_s=len(prompt_ids) / prefill_s, ttft_s=prefill_s,
                                  decode_thread_core=current_cpu())
        return logits

    def _constraint(self, params: GenerationParams, eos: set[int]):
        """The grammar's state for this generation (structured output), or None."""
        if params.grammar is None:
            return None
        if self.tokenizer is None:
            raise SluiceError("Structured output needs the model's tokenizer files; this model has none.")
        from engine.grammar import Constraint
        return Constraint(params.grammar, self.tokenizer, self.spec.vocab_size, eos)


def _token_event(token: int, generated: int, params: GenerationParams, eos: set[int],
                 detok: IncrementalDetokenizer | None, scores: tuple = (None, None)) -> TokenEvent:
    """The event of a sampled token: the last one at an end-of-sequence token, a stop string or the length.
    `scores`: its log-probabilities (chosen, top), where asked for."""
    if token in eos and not params.ignore_eos:
        return TokenEvent(token, detok.flush() if detok else "", True, "eos", *scores)
    text = detok.push(token) if detok else ""
    if detok and detok.stopped:
        return TokenEvent(token, text, True, "stop", *scores)
    if generated >= params.max_new_tokens:
        return TokenEvent(token, text + (detok.flush() if detok else ""), True, "length", *scores)
    return TokenEvent(token, text, False, None, *scores)


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
