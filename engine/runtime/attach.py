"""Kernels attached to a loaded model once, at load, in this one place: each is checked against its torch
reference on this device at the model's shapes (GPU kernels: kernels/selfcheck.py, a verdict cached per machine; a
failure warned about) and set on the pieces that call it. With `options.eager` no GPU kernel is attached: every
piece runs its plain torch path (engine/model/layers.py), so a bug can be bisected against it. On the CPU only the
int8 dense weights take one, unless `options.cpu_kernel` is "torch" (the CPU's numba kernels off).

  piece                         kernel                          what it takes over
  layers.RmsNorm                kernels/rms_norm.py             the standard RMS norms (rows up to norms.MAX_N)
  qwen4.hyper.GroupedNorm       kernels/rms_norm.py             qwen4_exp's per-stream norms (one launch, not seven)
  qwen4.hyper.MixSteps          kernels/hyper_mix.py            the glue around its hyper-connections' linears: 3
                                                                launches a mix, not 8; 1 an inject, not 2
  hybrid.OffsetRmsNorm          kernels/rms_norm.py             (1 + w) norms (Qwen3-Next / 3.5, qwen4_exp): one group
  hybrid.GatedDeltaNet          kernels/deltanet_decode.py      a decode token's delta step and gated norm in one launch
                                                                (qwen4_exp's DeltaNet too)
  attentions (rope_kernel)      kernels/rope.py                 a step's queries and keys rotated in one launch
  attentions (attention_kernel) kernels/decode_attention.py     one decode token's attention (with sinks too)
  qsa.IndexedAttention          kernels/decode_attention.py     a graph step's attention over its gathered picks
  mla.MlaAttention (MLA mixers) kernels/mla_decode.py           one decode token's latent attention (not DSA's)
  block.Router                  kernels/router.py               softmax top-k routing (no cuBLAS, topk, softmax)
  gptoss.TopKSoftmaxRouter      kernels/router.py               gpt-oss's top-k softmax routing, its bias
  deepseek_style.RouterPiece    kernels/router.py               group-limited routing (DeepSeek, GLM, MiniMax, ERNIE...)
  layers.Packed (int8)          kernels/int8_linear.py          int8 dense weights, decode steps and prompts
  layers.Packed (int8), CPU     kernels/cpu_gemv.py             int8 dense weights, decode steps (numba) and prompts
                                                                (kernels/cpu_gemm.py, one tile a model); float32
  the routed experts            kernels/moe_decode.py, moe_prefill.py               (expert_kernels)
  top-k sampling                kernels/top_candidates.py                            (CandidateKernels)
"""
from __future__ import annotations

import functools
from typing import Callable, Iterator

import torch

from engine.model.block import Router
from engine.model.families.deepseek_style import RouterPiece
from engine.model.families.hybrid import GatedDeltaNet, OffsetRmsNorm
from engine.model.gptoss import TopKSoftmaxRouter
from engine.model.layers import Packed, RmsNorm
from engine.model.mla import MlaMixer
from engine.model.model import Model
from engine.model.qwen4.hyper import GatedResidual, GroupedNorm
from engine.model.qwen4.qsa import IndexedAttention
from engine.options import Options
from kernels.deltanet_ref import MAX_HEAD_DIM as MAX_DELTANET_HEAD_DIM
from kernels.norms import MAX_N as MAX_NORM_WIDTH
from kernels.vocab_chunks import MAX_K

Warn = Callable[[str], None]


def attaches(options: Options, device: torch.device) -> bool:
    return not options.eager and torch.device(device).type == "cuda"


def attach_kernels(model: Model, weights: dict, device: torch.device, dtype: torch.dtype, options: Options,
                   warn: Warn) -> None:
    """Every piece's kernel where it passes its check. `weights`: the dense weights the model was built from (its
    int8 ones, row blocks included, get the int8 kernel); called after the build (a family may split a weight)."""
    packed = [v for w in weights.values() if isinstance(w, Packed) for v in (w, *w.views)]
    if torch.device(device).type == "cpu" and options.cpu_kernel != "torch" and dtype == torch.float32:
        _attach_cpu_int8(packed, warn)
    if not attaches(options, device):
        return
    chosen: dict[tuple, object] = {}                  # one check per distinct key
    check = lambda key, kind, select, *args, **kw: _once(                                         # noqa: E731
        chosen, key, lambda: _checked(select, kind, key[1:], warn, *args, **kw))
    for piece in packed + list(_pieces(model)):
        if isinstance(piece, Packed):
            piece.kernel = check(("int8", *piece.shape), "int8 dense", "select_int8_linear", *piece.shape, device,
                                 dtype=dtype, prompts=True)
        elif type(piece) is RmsNorm:
            piece.kernel = _norm_kernel(chosen, piece, device, dtype)
        elif type(piece) is GroupedNorm and piece.group <= MAX_NORM_WIDTH:
            key = ("grouped_norm", piece.group, piece.scale.numel() // piece.group, dtype)
            piece.kernel = check(key, "Grouped norm", "select_grouped_norm", *key[1:], device)
        elif type(piece) is GatedResidual:
            key = ("hyper_steps", piece.count, piece.hidden, piece.down.shape[0], dtype)
            piece.steps.kernel = check(key, "Hyper-connection step", "select_hyper_steps", *key[1:], device)
        elif type(piece) is OffsetRmsNorm and piece.scale.shape[-1] <= MAX_NORM_WIDTH:
            key = ("grouped_norm", piece.scale.shape[-1], 1, dtype)
            piece.kernel = check(key, "Grouped norm", "select_grouped_norm", *key[1:], device)
        elif type(piece) in (Router, TopKSoftmaxRouter):
            topk_first = type(piece) is TopKSoftmaxRouter
            key = ("router", *piece.weight.shape, piece.top_k, not topk_first and piece.renormalize, topk_first)
            piece.kernel = check(key, "Router", "select_router", *key[1:-1], device, dtype=dtype, topk_first=topk_first)
        elif type(piece) is RouterPiece:
            key = ("grouped_router", *piece.weight.shape, piece.router, piece.bias is not None)
            piece.kernel = check(key, "Grouped router", "select_grouped_router", *key[1:], device, dtype=dtype)
            piece.best_first = piece.kernel is not None
            if piece.kernel is not None:        # the weight as loaded (exact): the kernel sums it in float32
                piece.weight = piece.weight.to(dtype)
        elif hasattr(piece, "attention_kernel") and getattr(piece, "takes_kernels", True):
            _attach_attention(chosen, piece, device, dtype)
        elif type(piece) is IndexedAttention:
            key = ("masked_attention", piece.num_heads, piece.num_kv_heads, piece.head_dim)
            piece.masked_kernel = check(key, "Masked decode attention", "select_masked_attention", *key[1:], dtype,
                                        device)
        elif isinstance(piece, GatedDeltaNet) and max(piece.d.k_head_dim, piece.d.v_head_dim) <= MAX_DELTANET_HEAD_DIM:
            d = piece.d
            key = ("deltanet_decode", d.num_k_heads, d.num_v_heads, d.k_head_dim, d.v_head_dim, piece.activation,
                   dtype, piece.norm.dtype)
            piece.decode_kernel = check(key, "DeltaNet decode", "select_deltanet_decode", *key[1:], device)
        elif type(piece) is MlaMixer:           # DsaMixer's attention reads the indexer's selection: it keeps torch
            s = piece.attention.shape
            key = ("mla_decode", s.num_heads, s.kv_lora_rank, s.qk_rope_head_dim)
            piece.attention.decode_kernel = check(key, "MLA decode", "select_mla_decode", *key[1:], dtype, device)


def _attach_cpu_int8(packed: list[Packed], warn: Warn) -> None:
    """The CPU's int8 dense kernel on each int8 dense weight whose shape it passes its check at (one check a shape),
    all of them sharing one prompt tile: the model's layers run one at a time."""
    from kernels import cpu_gemm, cpu_gemv
    if not cpu_gemv.available():
        return
    kernel = functools.partial(cpu_gemv.int8_linear, tile=cpu_gemm.scratch())
    verdicts: dict[tuple, str | None] = {}
    for piece in packed:
        if piece.fmt != "int8":
            continue
        if piece.shape not in verdicts:
            verdicts[piece.shape] = cpu_gemv.check(*piece.shape)
            if verdicts[piece.shape] is not None:
                warn(f"int8 dense kernel disabled for {tuple(piece.shape)} on this CPU: {verdicts[piece.shape]}.")
        if verdicts[piece.shape] is None:
            piece.kernel = kernel


def attached_kernels(model: Model) -> dict[str, int]:
    """How many of the model's pieces run each kind of kernel, e.g. {"RmsNorm.kernel": 7, "Attention.rope_kernel": 3}
    ({} with none attached)."""
    counts: dict[str, int] = {}
    for piece in _pieces(model):
        for name in ("kernel", "rope_kernel", "attention_kernel", "decode_kernel", "masked_kernel"):
            if getattr(piece, name, None) is not None:
                key = f"{type(piece).__name__}.{name}"
                counts[key] = counts.get(key, 0) + 1
    return counts


def _pieces(root) -> Iterator[object]:
    """Every object of the model's own classes reachable from `root`: blocks, mixers, norms, routers, weights..."""
    seen, stack = set(), [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, torch.Tensor):
            continue
        seen.add(id(obj))
        if isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif type(obj).__module__.startswith("engine.model"):
            yield obj
            stack.extend(getattr(obj, "__dict__", {}).values())


def _once(chosen: dict, key: tuple, select: Callable[[], object]):
    if key not in chosen:
        chosen[key] = select()
    return chosen[key]


def _norm_kernel(chosen: dict, norm: RmsNorm, device, dtype):
    from kernels.selfcheck import select_rms_norm
    if norm.weight is None:                           # a norm without a scale (qwen4_exp's hyper-connections)
        return None
    width = norm.weight.shape[-1]
    if width > MAX_NORM_WIDTH:
        return None
    key = ("rms_norm", width, dtype, norm.weight.dtype)
    return _once(chosen, key, lambda: select_rms_norm(width, dtype, norm.weight.dtype, device)[0])


def _attach_attention(chosen: dict, attn, device, dtype) -> None:
    """An attention's rope (its tables in the compute dtype) and its decode-token kernel (checked with sinks where
    the attention has them)."""
    from kernels import decode_attention
    from kernels.selfcheck import select_decode_attention, select_rope
    heads = (attn.num_heads, attn.num_kv_heads, attn.head_dim)
    if attn.rope is not None and attn.rope.dtype == dtype:            # None: no position encoding (Nemotron-H)
        rotary = 2 * attn.rope.inv_freq.shape[0]
        attn.rope_kernel = _once(chosen, ("rope", *heads, rotary),
                                 lambda: select_rope(*heads, rotary, dtype, device)[0])
    window, has_sinks = getattr(attn, "window", None), getattr(attn, "sinks", None) is not None
    checked = _once(chosen, ("decode_attention", *heads, window, has_sinks),
                    lambda: select_decode_attention(*heads, dtype, window, device, sinks=has_sinks)[0])
    attn.attention_kernel = decode_attention.attention if checked is not None else None


def _checked(select: str, kind: str, what, warn: Warn, *args, **kw):
    """kernels.selfcheck's `select` for these arguments -> the kernel, or None with a warning naming `kind` and
    `what` (its shape) where its check failed."""
    from kernels import selfcheck
    fn, verdict = getattr(selfcheck, select)(*args, **kw)
    if not verdict.ok:
        warn(f"{kind} kernel disabled for {what} on this GPU: {verdict.reason}")
    return fn


def expert_kernels(model: Model, layout, top_k: int, device: torch.device, dtype: torch.dtype, options: Options,
                   warn: Warn) -> tuple[Callable | None, object | None, object | None]:
    """The routed experts' kernels -> (decode kernel, prefill kernel, the decode kernel's verdict): the decode
    kernel where the family's experts have one and it passes its check, the prefill kernel beside it where the
    format has one and it passes too; None where not. Ungated blocks (Nemotron-H's) take none: the kernels
    read a gate, so their experts run in torch on a GPU too."""
    if not attaches(options, device) or model.expert_kernel is None or not layout.is_gated:
        return None, None, None
    from kernels.selfcheck import select_moe_decode
    activation = model.expert_kernel
    shapes = (layout.fmt, {f.name: f.offset for f in layout.fields}, layout.block_bytes, layout.intermediate,
              layout.hidden, top_k, device)
    fn, verdict = select_moe_decode(*shapes, dtype=dtype, activation=activation)
    if not verdict.ok:
        warn(f"Fused expert kernel disabled on this GPU: {verdict.reason}")
        return None, None, verdict
    return functools.partial(fn, activation=activation), _prefill_kernel(shapes, dtype, activation, warn), verdict


def _prefill_kernel(shapes: tuple, dtype: torch.dtype, activation, warn: Warn):
    from kernels.moe_prefill import PREFILL_FORMATS, PrefillKernel, default_config
    from kernels.selfcheck import check_moe_prefill
    if shapes[0] not in PREFILL_FORMATS:
        return None
    verdict = check_moe_prefill(*shapes, dtype=dtype, activation=activation)
    if not verdict.ok:
        warn(f"Prefill expert kernel disabled on this GPU: {verdict.reason}")
        return None
    return PrefillKernel(default_config(dtype), activation)


class CandidateKernels:
    """Top-k sampling's candidates kernel for k's block size (kernels/top_candidates.py), checked at its first use
    in this process (a cached verdict after a machine's first); None: the host takes the row."""

    def __init__(self, vocab_size: int, device: torch.device, options: Options, warn: Warn):
        self.vocab_size, self.device, self.warn = vocab_size, device, warn
        self._chosen: dict[int, object] | None = {} if attaches(options, device) else None

    def __call__(self, k: int):
        if self._chosen is None or not 0 < k <= MAX_K:
            return None
        block = 1 << (k - 1).bit_length()
        if block not in self._chosen:
            from kernels.selfcheck import select_top_candidates
            self._chosen[block], verdict = select_top_candidates(self.vocab_size, k, self.device)
            if not verdict.ok:
                self.warn(f"Top-k sampling kernel disabled for k up to {block} on this GPU: {verdict.reason}")
        return self._chosen[block]
