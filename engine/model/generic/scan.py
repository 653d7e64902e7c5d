"""A transformers MoE model read from its config alone: built on the meta device (no memory, no weights),
its routed-experts modules found by transformers' shared experts interface.

transformers gives most MoE families one experts class shape (`use_experts_implementation`): fused
`gate_up_proj` [E, 2I, H] (or transposed [E, H, 2I], or gate and up interleaved; ungated experts, Nemotron-H's
`has_gate=False`: `up_proj` [E, I, H] in its place) and `down_proj` [E, H, I] parameters, called as
experts(hidden [T, H], top_k_index [T, K], top_k_weights [T, K]) -> [T, H]. The decorator leaves its flags
on every instance (has_gate, has_bias, is_transposed, ...), which is how an experts module is recognised here,
whatever its family calls it. One other contract is known: Llama 4's experts
take every expert's copy of the tokens already scaled by its routing score (experts(x [E*T, H]) -> [E*T, H],
zero rows for the experts a token does not use), `scaled_inputs` below; and LongCat-Flash's experts take the
shared call with ids past the routed experts for its zero-compute (identity) experts, `num_zero_experts`.
"""
from __future__ import annotations

import contextlib
import functools
import re
from dataclasses import dataclass

import torch

from engine.errors import SluiceError

_LAYER = re.compile(r"\.layers\.(\d+)\.")


@dataclass(frozen=True)
class ExpertsInterface:
    """What every routed-experts module of one model shares, and where each one sits."""
    paths: dict[int, str]           # layer -> the experts module's path in the causal LM ("model.layers.3.mlp.experts")
    num_experts: int
    intermediate: int
    hidden: int
    is_transposed: bool             # gate_up_proj [E, H, 2I] and down_proj [E, I, H]
    is_concatenated: bool           # gate rows then up rows (else interleaved: gate0, up0, gate1, ...)
    has_bias: bool
    experts_class: type             # the family's experts class (its `_apply_gate` and `act_fn` are the math)
    hub_names: dict[str, str]       # gate | up | down -> one expert's tensor in the Hub's layout ("gate_proj.weight")
    text_model: str                 # the language model's path: "model", or "model.language_model" in a VL model
    head: str                       # the output head's path: "lm_head" ("language_model.lm_head": Llama 4's VL)
    scaled_inputs: bool = False     # Llama 4's contract: experts(x [E*T, H]) on inputs scaled by the routing scores
    num_zero_experts: int = 0       # LongCat-Flash: ids E.. E+Z-1 are identity experts (their output: the input)
    has_gate: bool = True           # False: up_proj [E, I, H] and down_proj alone, down(act(up x)) (Nemotron-H)

    def is_text_tensor(self, name: str) -> bool:
        """Whether the tensor is one Sluice runs (the language model and its head; not a vision tower)."""
        return name.startswith((self.text_model + ".", self.head + "."))

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(sorted(self.paths))


def model_class(cfg):
    """transformers' class for `cfg`: its causal LM, or for a vision-language checkpoint its image-text model (whose
    language model Sluice runs; the vision tower is never built into memory)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if cfg.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and getattr(cfg, "vision_config", None) is None:
        return AutoModelForCausalLM
    return AutoModelForImageTextToText


def meta_model(cfg):
    """transformers' model of `cfg` on the meta device: every module, no memory (one sentence where transformers
    has no text generation model for the config)."""
    from transformers.initialization import no_init_weights
    try:
        with torch.device("meta"), no_init_weights():
            return model_class(cfg).from_config(cfg)
    except ValueError as exc:
        raise SluiceError(f"transformers has no text generation model for '{cfg.model_type}' ({exc}); "
                          "Sluice cannot run it.") from None
    except (TypeError, KeyError, AttributeError, RuntimeError, AssertionError) as exc:   # its own checks of a config
        raise SluiceError(f"transformers cannot build a '{cfg.model_type}' model from this config.json "
                          f"({type(exc).__name__}: {exc}); download the model again or fix it.") from None


def is_experts_module(module: torch.nn.Module) -> bool:
    """A module of transformers' shared experts interface (the decorator's flags, 3-D expert weights), or of
    Llama 4's scaled-inputs contract."""
    down = getattr(module, "down_proj", None)
    has_weights = isinstance(down, torch.nn.Parameter) and down.dim() == 3
    return has_weights and (hasattr(module, "is_transposed") or takes_scaled_inputs(module)
                            or zero_experts(module) > 0)


def zero_experts(module: torch.nn.Module) -> int:
    """How many zero-compute (identity) experts follow the routed ones (LongCat-Flash's), called the shared way."""
    import inspect
    if not hasattr(module, "num_routed_experts") or len(inspect.signature(module.forward).parameters) != 3:
        return 0
    return getattr(module, "zero_expert_num", 0) or 0


def takes_scaled_inputs(module: torch.nn.Module) -> bool:
    """Llama 4's experts: fused gate_up_proj [E, H, 2I] and down_proj [E, I, H], called with the inputs alone."""
    import inspect
    gate_up = getattr(module, "gate_up_proj", None)
    return (not hasattr(module, "is_transposed") and isinstance(gate_up, torch.nn.Parameter) and gate_up.dim() == 3
            and len(inspect.signature(module.forward).parameters) == 1)


def _flag(module: torch.nn.Module, name: str) -> bool:
    """A decorator flag; undecorated experts (Llama 4's, LongCat's): gated, concatenated, no bias, no norm,
    transposed where gate_up_proj's last dim is not down_proj's output (2I, not H)."""
    if hasattr(module, name):
        return getattr(module, name)
    if name == "is_transposed":
        return module.gate_up_proj.shape[2] != module.down_proj.shape[1]
    return name in ("has_gate", "is_concatenated")


def find_experts(model) -> dict[str, torch.nn.Module]:
    """path -> module of every routed-experts module of the interface."""
    return {name: module for name, module in model.named_modules() if is_experts_module(module)}


def has_routed_experts(cfg) -> bool:
    """Whether `cfg`'s model has routed experts (modules named `experts` holding 3-D weights), of any interface."""
    return bool(_expert_like(meta_model(cfg)))


def _expert_like(model) -> list[str]:
    return [name for name, module in model.named_modules() if name.endswith("experts")
            and any(p.dim() == 3 for p in module.parameters(recurse=False))]


def unsupported_experts(model) -> str | None:
    """Why this model's experts cannot be streamed, as a phrase, or None."""
    experts = find_experts(model)
    others = [name for name in _expert_like(model) if name not in experts]
    if others:
        return (f"its experts ({type(model.get_submodule(others[0])).__name__}) do not use transformers' shared "
                "experts interface")
    if not experts:
        return "it has no routed experts that transformers' shared experts interface describes"
    first = next(iter(experts.values()))
    width = first.down_proj.shape[2 if _flag(first, "is_transposed") else 1]
    if width != model.config.get_text_config().hidden_size:
        return "its experts work in a latent width apart from the hidden size"
    if _flag(first, "has_post_expert_norm"):
        return "its experts norm their outputs"
    if any(_LAYER.search(name + ".") is None for name in experts):
        return "an experts module lies outside the decoder layers"
    return None


_INTERFACES: dict[str, ExpertsInterface] = {}      # config (JSON) -> its interface: the spec is read often


def read_interface(cfg) -> ExpertsInterface:
    """The experts interface of `cfg`'s model (one sentence naming what is missing where it has none)."""
    key = cfg.to_json_string(use_diff=False)
    if key not in _INTERFACES:
        _INTERFACES.clear()            # one model at a time is the usual case: no growth over a long session
        _INTERFACES[key] = _read_interface(cfg)
    return _INTERFACES[key]


def _read_interface(cfg) -> ExpertsInterface:
    model = meta_model(cfg)
    problem = unsupported_experts(model)
    experts = {} if problem else find_experts(model)
    if experts:
        text = next(iter(experts)).partition(".layers.")[0] + "."
        problem = dense_conversion(cfg.model_type, [n for n, _ in model.named_parameters() if n.startswith(text)])
    if problem:
        raise SluiceError(f"Sluice cannot run '{cfg.model_type}' models: {problem}.")
    first = next(iter(experts.values()))
    down, transposed = first.down_proj, _flag(first, "is_transposed")
    num_experts, intermediate = down.shape[0], down.shape[1] if transposed else down.shape[2]
    paths = {int(_LAYER.search(name + ".").group(1)): name for name in experts}
    text_model = next(iter(experts)).partition(".layers.")[0]
    output = model.get_output_embeddings()
    head = next(name for name, module in model.named_modules() if module is output)
    return ExpertsInterface(paths, num_experts, intermediate, cfg.get_text_config().hidden_size, transposed,
                            _flag(first, "is_concatenated"), _flag(first, "has_bias"), type(first),
                            hub_expert_names(cfg.model_type), text_model, head, takes_scaled_inputs(first),
                            zero_experts(first), _flag(first, "has_gate"))


@contextlib.contextmanager
def parameters_on_meta():
    """While a model is built, each parameter moves to the meta device as it is registered (one tensor's memory at
    a time: the checkpoint's dense weights take their place); buffers stay where they are made (the rotary tables
    the constructors compute). Process-wide while it lasts: the engine loads one model at a time."""
    original = torch.nn.Module.register_parameter

    def register_on_meta(self, name, param):
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        original(self, name, param)

    torch.nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original


@contextlib.contextmanager
def experts_on_meta(experts_class: type):
    """While a model is built, its experts classes allocate on the meta device: only the dense weights take memory
    (the experts modules are then replaced by adapters)."""
    original = experts_class.__init__

    @functools.wraps(original)
    def init_on_meta(self, *args, **kwargs):
        with torch.device("meta"):
            original(self, *args, **kwargs)

    experts_class.__init__ = init_on_meta
    try:
        yield
    finally:
        experts_class.__init__ = original


@functools.lru_cache(maxsize=None)
def _transforms(model_type: str, kind: str) -> tuple:
    """The family's checkpoint conversions of one kind ("WeightRenaming", "WeightConverter"), as its loader has them."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    return tuple(t for t in get_checkpoint_conversion_mapping(model_type) or () if type(t).__name__ == kind)


def hub_expert_names(model_type: str) -> dict[str, str]:
    """One expert's gate, up and down tensors as the Hub stores them, read from the converters transformers fuses
    them with (`feed_forward.experts.*.w1.weight` + `*.w3.weight` -> `gate_up_proj`: gate "w1.weight"; ungated
    experts' `*.up_proj.weight` -> `up_proj`); the usual `gate_proj.weight`, ... where the family has none."""
    names = {proj: f"{proj}_proj.weight" for proj in ("gate", "up", "down")}
    for converter in _transforms(model_type, "WeightConverter"):
        sources, targets = converter.source_patterns, converter.target_patterns
        per_expert = [p.split("experts.*.", 1)[1] for p in sources if "experts.*." in p]
        if len(per_expert) != len(sources) or len(targets) != 1:
            continue
        if targets[0].endswith("experts.gate_up_proj") and len(per_expert) == 2:
            names["gate"], names["up"] = per_expert
        elif targets[0].endswith(("experts.down_proj", "experts.up_proj")) and len(per_expert) == 1:
            names[targets[0].rpartition(".")[2].removesuffix("_proj")] = per_expert[0]
    return names


def dense_converters(model_type: str) -> list:
    """The family's converters of dense tensors (its experts' aside): each merges tensors into one (Kimi-Linear's
    q/k/v convolutions), applied at repack (engine.format.generic_dense)."""
    return [c for c in _transforms(model_type, "WeightConverter")
            if not all(t.endswith(("experts.gate_up_proj", "experts.up_proj", "experts.down_proj"))
                       for t in c.target_patterns)]


def dense_conversion(model_type: str, text_names: list[str]) -> str | None:
    """Why the checkpoint's dense tensors cannot be read into transformers' names, as a phrase, or None: a converter
    that splits one tensor into several (the repack merges, it does not split), where it makes tensors of the
    language model (`text_names`; Kimi-K2.5's splits only its vision tower's, which Sluice neither repacks nor
    loads)."""
    for converter in dense_converters(model_type):
        if len(converter.target_patterns) != 1 and _makes_any(converter, text_names):
            return (f"transformers splits some of its dense weights as it loads them "
                    f"({converter.source_patterns[0]} into {', '.join(converter.target_patterns)})")
    return None


def _makes_any(converter, names: list[str]) -> bool:
    """Whether one of the converter's target patterns (`*` for a layer or an expert's number) names one of names."""
    patterns = [re.compile(r"(^|\.)" + re.escape(t).replace(r"\*", r"\d+") + r"(\.|$)") for t in converter.target_patterns]
    return any(p.search(name) for p in patterns for name in names)


def in_memory_name(model_type: str, name: str) -> str:
    """A checkpoint's dense tensor name as transformers' model holds it (the family's renamings, as its loader
    applies them: ERNIE-4.5's `mlp.moe_statics.` -> `mlp.gate.moe_statics.`)."""
    from transformers.core_model_loading import apply_renamings
    return apply_renamings(name, list(_transforms(model_type, "WeightRenaming")))


def parameter_counts(cfg) -> tuple[int, int, int]:
    """(the text model's parameters, the routed experts', the input embedding's) of `cfg`'s model, counted on the
    meta device (tied weights once, as transformers' num_parameters counts them; no vision tower)."""
    model, interface = meta_model(cfg), read_interface(cfg)
    experts = sum(p.numel() for module in find_experts(model).values() for p in module.parameters())
    text = sum(p.numel() for name, p in model.named_parameters() if interface.is_text_tensor(name))
    return text, experts, model.get_input_embeddings().weight.numel()
