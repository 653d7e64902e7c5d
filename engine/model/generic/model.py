"""A transformers model (a causal LM, or a vision-language model's language part) whose routed experts stream:
prefill and decode passes for the runner.

The model is transformers' own (built from the config with its experts classes on the meta device, so only
the dense weights take memory), its dense weights the checkpoint's, its cache its own (any kind: KV,
recurrent, sliding). Each experts module is a StreamedExperts adapter; a pass calls them in layer order with
the runtime's Experts (engine.runtime.experts), which brings each layer's experts in as the native families'
blocks do: resident first, misses in batches, and in decode the next MoE layer's experts prefetched from
that layer's own router on this layer's input. On CUDA, a family whose one-token forward has no step-dependent
host control flow (graphs.graph_blocker) decodes on a static cache as CUDA graph segments split at its experts
(graphs.py); the others, the CPU and Options.eager run the modules eagerly.
"""
from __future__ import annotations

from typing import Callable

import torch

from engine.errors import SluiceError
from engine.model.generic.adapter import StreamedExperts, StreamedScaledExperts, expert_math
from engine.model.generic.graphs import SegmentCapture, cache_bytes, graph_blocker, into_static, replay
from engine.model.generic.scan import ExpertsInterface, experts_on_meta, model_class, parameters_on_meta
from engine.model.spec import ModelSpec
from engine.model.state import StateSpec


class Passes:
    """What one pass (a prompt or a decode step) hands the adapters: the runtime's experts and its options."""

    def __init__(self, experts, decode: bool, defer: bool = False, check_cancel: Callable[[], None] | None = None):
        self.experts, self.decode, self.defer, self.check_cancel = experts, decode, defer, check_cancel


class GenericModel:
    """What the runner loads for a generic family: transformers' model with StreamedExperts in place."""

    runs_passes = True       # the runner hands it whole passes (no blocks for its decode step)
    graph_safe = False
    blocks: list = []
    embed_tokens = None
    embed_in_ram = False

    def __init__(self, spec: ModelSpec, hf, experts_module: torch.nn.Module, device: torch.device):
        self.spec, self.hf, self.device = spec, hf, torch.device(device)
        self.interface: ExpertsInterface = spec.generic
        self.expert_mlp, self.expert_kernel = expert_math(experts_module, self.interface.is_concatenated)
        self._routers = _routers(hf, self.interface)
        self._moe_layers = self.interface.moe_layers
        self._passes: Passes | None = None
        self._cache = None
        # the decode as graph segments (use_static_decode, capture): a static cache, the step's token, the
        # captured segments and their logits; `graph_error` says why a capture failed (decode then runs eagerly)
        self._static = self._token = self.segments = self._logits = None
        self._capture: SegmentCapture | None = None
        self._kv_bytes = 0
        self.graph_error: str | None = None
        # the module holding the language model and its head: the root, or Llama 4's `language_model` (its VL
        # wrapper adds nothing for text and fails on a text-only output in transformers 5.24)
        self._lm = hf.get_submodule(self.interface.head.rpartition(".")[0])
        for layer, path in self.interface.paths.items():
            parent, _, name = path.rpartition(".")
            adapter = StreamedScaledExperts(layer, self.run_scaled_experts) if self.interface.scaled_inputs \
                else StreamedExperts(layer, self.run_experts)
            setattr(hf.get_submodule(parent), name, adapter)

    def state_specs(self) -> list[dict[str, StateSpec]]:
        """For the budget only (transformers keeps the cache): keys and values per layer, from the config."""
        return state_specs(self.spec)

    # ---------------------------------------------------------------- decode graphs
    @property
    def capture_blocker(self) -> str | None:
        """Why this family's decode can't be captured as graph segments, or None where it can."""
        return graph_blocker(self.interface, self._lm.config.get_text_config(decoder=True))

    def use_static_decode(self, max_tokens: int, kv_bytes: int) -> bool:
        """A static cache of `max_tokens` where the family's decode can be captured -> whether it is used; the
        graphs come with `capture`, which drops the cache if it holds more than `kv_bytes` (the budget's figure)."""
        if self.capture_blocker is not None:
            return False
        from transformers import StaticCache
        self._static = StaticCache(config=self._lm.config, max_cache_len=max_tokens)
        self._kv_bytes = kv_bytes
        self._token = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        return True

    def capture(self) -> None:
        """On CUDA with a static cache: a warm-up step (the cache's tensors, library handles), then the decode
        step captured as graph segments (one pool); the cache is emptied after. A cache larger than the budget
        counts (per-head keys of latent attention, say) is dropped: the decode then runs eagerly on transformers'
        growing cache. A failed capture leaves the eager decode (on the static cache), `graph_error` saying why."""
        if self._static is None or self.device.type != "cuda":
            return
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self._captured_step(SegmentCapture())
            torch.cuda.synchronize(self.device)
            fits = cache_bytes(self._static) <= self._kv_bytes
            if fits:
                self._record()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if fits:
            self._static.reset()
        else:
            self._static = self._cache = None

    def _record(self) -> None:
        capture = SegmentCapture(torch.cuda.graph_pool_handle())
        try:
            self._logits = self._captured_step(capture)
            self.segments = capture.finish()
        except RuntimeError as e:
            capture.abandon()
            self._logits, self.graph_error = None, f"{type(e).__name__}: {e}".splitlines()[0]

    def static_expert_inputs(self) -> dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """{layer: (x [1, H], weights [1, K], out [1, H])}: the segments' expert buffers, whose kernel launches the
        runtime captures in turn (none without segments)."""
        return {s.layer: (s.x, s.weights, s.out) for s in (self.segments or [])[:-1]}

    def _captured_step(self, capture: SegmentCapture) -> torch.Tensor:
        self._capture, self._cache = capture, self._static
        capture.begin()
        try:
            return self._forward(self._token, Passes(None, decode=True))
        finally:
            self._capture = None

    # ---------------------------------------------------------------- passes
    def prefill(self, token_ids: list[int], experts, check_cancel: Callable[[], None]) -> torch.Tensor:
        """A new conversation's prompt -> logits of its last token [V] float32 (the cache starts again)."""
        self._cache = None
        ids = torch.tensor([token_ids], device=self.device)
        logits = self._forward(ids, Passes(experts, decode=False, check_cancel=check_cancel))
        if self._static is not None:      # the prompt's attention over its own keys, not the static cache's length
            self._cache = into_static(self._cache, self._static)
        return logits

    def decode(self, token: int, experts, defer: bool) -> torch.Tensor:
        """The next token of the conversation -> its logits [V] float32 (with graphs: a static buffer, valid
        until the next step)."""
        if self.segments is not None:
            self._token.fill_(token)
            replay(self.segments, experts, defer)
            return self._logits
        ids = torch.tensor([[token]], device=self.device)
        return self._forward(ids, Passes(experts, decode=True, defer=defer))

    def _forward(self, ids: torch.Tensor, passes: Passes) -> torch.Tensor:
        self._passes = passes
        try:
            out = self._lm(input_ids=ids, cache=self._cache, use_cache=True, logits_to_keep=1)
        finally:
            self._passes = None
        self._cache = out.cache
        return out.logits[0, -1].float()

    def run_experts(self, layer: int, x: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
        """The adapters' call: x [T, H], top_k_index / top_k_weights [T, K] -> the weighted sum [T, H] (x's dtype)."""
        if self.interface.num_zero_experts:
            return self._with_zero_experts(layer, x, top_k_index, top_k_weights)
        return self._routed(layer, x, top_k_index, top_k_weights).to(x.dtype)

    def _routed(self, layer: int, x: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        """Sluice's experts on x [T, H] -> the weighted sum [T, H] float32 (while capturing: the segment's
        static output, written at each replay)."""
        p = self._passes
        ids, next_layer = top_k_index.flatten(), None
        if p.decode:
            next_layer, guesses = self._guess_next(layer, x)
            if guesses is not None:
                ids = torch.cat([ids, guesses.to(ids.dtype)])
        if self._capture is not None:
            return self._capture.cut(layer, x, top_k_weights, ids, next_layer)
        p.experts.run_deferred()           # the previous MoE layer's prefetch, behind this layer's mixer
        if p.check_cancel is not None:
            p.check_cancel()
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        p.experts.run(layer, x, top_k_weights, ids, out, next_layer, defer=p.defer)
        return out

    def _with_zero_experts(self, layer: int, x: torch.Tensor, top_k_index: torch.Tensor,
                           top_k_weights: torch.Tensor) -> torch.Tensor:
        """LongCat-Flash: ids past the routed experts are identity experts (x times its weight, added here); the
        routed (token, choice) pairs go to the runtime as tokens of one expert each."""
        # T = tokens, K = choices a token, P = routed pairs, H = hidden
        is_zero = top_k_index >= self.interface.num_experts                                   # [T, K]
        identity = (x[:, None, :] * (top_k_weights * is_zero)[..., None].to(x.dtype)).sum(1)     # [T, H]
        token_ids, choice_ids = (~is_zero).nonzero(as_tuple=True)                             # [P], [P]
        out = identity.float()
        if len(token_ids):
            routed = self._routed(layer, x[token_ids], top_k_index[token_ids, choice_ids][:, None],
                                  top_k_weights[token_ids, choice_ids][:, None])
            out.index_add_(0, token_ids, routed)
        return out.to(x.dtype)

    def run_scaled_experts(self, layer: int, routed_in: torch.Tensor) -> torch.Tensor:
        """Llama 4's call: routed_in [E*T, H], each expert's copy of the tokens scaled by its routing score (zero
        where a token does not use it) -> each expert's output on its copy [E*T, H]. The non-zero rows go to the
        runtime as tokens of one expert each, weight 1 (exact); a zero row's output is zero (no expert bias)."""
        # E = experts, T = tokens, P = (expert, token) pairs routed, H = hidden
        rows = routed_in.view(self.interface.num_experts, -1, routed_in.shape[-1])          # [E, T, H]
        expert_ids, token_ids = (rows != 0).any(-1).nonzero(as_tuple=True)                # [P], [P]
        ones = torch.ones(len(expert_ids), 1, dtype=torch.float32, device=rows.device)
        out = torch.zeros_like(rows)
        out[expert_ids, token_ids] = self.run_experts(layer, rows[expert_ids, token_ids], expert_ids[:, None], ones)
        return out.view(routed_in.shape)

    def _guess_next(self, layer: int, x: torch.Tensor) -> tuple[int | None, torch.Tensor | None]:
        """The next MoE layer and its experts guessed from its own router on this layer's input, best first
        (a guess only decides what is prefetched)."""
        later = [m for m in self._moe_layers if m > layer]
        if not later or later[0] not in self._routers:
            return None, None
        guesses = _best_first(self._routers[later[0]](x), self.spec.top_k, self.spec.num_experts)
        if guesses is not None and self.interface.num_zero_experts:     # not LongCat's zero-compute experts (a
            guesses = guesses[guesses < self.spec.num_experts]            # mask's size waits for the GPU)
        return later[0], guesses


def state_specs(spec: ModelSpec) -> list[dict[str, StateSpec]]:
    """Keys and values per layer (a recurrent layer's fixed state is smaller than a long context's keys)."""
    kv = {"k": StateSpec((spec.num_kv_heads, spec.head_dim)), "v": StateSpec((spec.num_kv_heads, spec.head_dim))}
    return [dict(kv) for _ in range(spec.num_layers)]


def build(spec: ModelSpec, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device) -> GenericModel:
    """transformers' model of `spec` on `device` in `dtype`: its parameters made on the meta device (the experts'
    never allocated), then the checkpoint's dense weights put in their place; its experts modules replaced."""
    from transformers.initialization import no_init_weights
    interface: ExpertsInterface = spec.generic
    with experts_on_meta(interface.experts_class), parameters_on_meta(), torch.device(device), no_init_weights():
        hf = model_class(spec.cfg).from_config(spec.cfg, dtype=dtype)
    experts_module = hf.get_submodule(next(iter(interface.paths.values())))
    model = GenericModel(spec, hf, experts_module, device)
    _load_dense(hf, weights, spec)
    hf.eval().requires_grad_(False)
    return model


def _load_dense(hf, weights: dict[str, torch.Tensor], spec: ModelSpec) -> None:
    """The checkpoint's dense tensors put in place (each kept in the dtype transformers gives it: float32 router
    buffers stay float32); a tensor the model needs and the checkpoint lacks is one sentence."""
    expected = hf.state_dict(keep_vars=True)
    for name, tensor in weights.items():
        if name not in expected:
            continue                        # e.g. a rotary table older checkpoints saved
        module_path, _, attr = name.rpartition(".")
        module = hf.get_submodule(module_path)
        current = expected[name]
        value = tensor.to(dtype=current.dtype)
        if isinstance(current, torch.nn.Parameter):
            setattr(module, attr, torch.nn.Parameter(value, requires_grad=False))
        else:
            module._buffers[attr] = value
    head = spec.generic.head + ".weight"
    tied = head not in weights and spec.tie_word_embeddings
    if tied:
        hf.get_output_embeddings().weight = hf.get_input_embeddings().weight
    _refuse_missing(hf, expected, weights, spec, head if tied else None)


def _refuse_missing(hf, expected: dict, weights: dict, spec: ModelSpec, tied_head: str | None) -> None:
    text = spec.generic.is_text_tensor              # a vision tower stays on the meta device, never called
    missing = [n for n in expected if text(n) and n not in weights and n != tied_head]
    missing += [n for n, p in hf.named_parameters() if text(n) and p.device.type == "meta" and n not in missing]
    if missing:
        raise SluiceError(f"This {spec.family} model's dense weights lack '{missing[0]}' (and {len(missing) - 1} more), "
                          "which transformers' model needs; repack it from the original checkpoint.")


def _routers(hf, interface: ExpertsInterface) -> dict[int, torch.nn.Module]:
    """layer -> the router beside its experts (the MoE block's `gate` or `router`), where it takes the hidden
    states alone."""
    routers = {}
    for layer, path in interface.paths.items():
        block = hf.get_submodule(path.rpartition(".")[0])
        router = getattr(block, "gate", None) or getattr(block, "router", None)
        if isinstance(router, torch.nn.Module) and _takes_one_input(router):
            routers[layer] = router
    return routers


def _takes_one_input(module: torch.nn.Module) -> bool:
    """Whether the module's forward takes the hidden states alone (some routers also take their block's bias)."""
    import inspect
    return len(inspect.signature(module.forward).parameters) == 1


def _best_first(routed, top_k: int, num_experts: int) -> torch.Tensor | None:
    """A router's output -> one token's expert ids [K] best first, or None where its output is not one of the
    usual forms: (..., weights [T, K], ids [T, K]), or logits [T, E]."""
    tensors = [t for t in (routed if isinstance(routed, tuple) else (routed,)) if isinstance(t, torch.Tensor)]
    ids = _first(tensors, lambda t: not t.is_floating_point() and t.dim() == 2 and t.shape[-1] == top_k)
    if ids is None:
        logits = _first(tensors, lambda t: t.is_floating_point() and t.shape[-1] == num_experts)
        return None if logits is None else logits.reshape(-1, num_experts)[0].topk(top_k).indices
    weights = _first(tensors, lambda t: t.is_floating_point() and t.shape == ids.shape)
    return ids[0] if weights is None else ids[0][torch.argsort(weights[0], descending=True)]


def _first(tensors: list[torch.Tensor], test) -> torch.Tensor | None:
    return next((t for t in tensors if test(t)), None)
