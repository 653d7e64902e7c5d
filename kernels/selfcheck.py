"""Trust no kernel: before a fast kernel is used on this GPU, it is run against its plain-torch
reference on random data of the loaded model's real shapes. A kernel that raises (e.g. asks for more
shared memory than the device has), returns NaN/inf or misses the tolerance is not used: the caller
gets the reference instead, and a warning goes to stderr and to `warnings_seen()` (for telemetry
and the GUI). Verdicts are cached per GPU, driver, Triton version, kernel version and shape in the
user cache dir, so the check costs one run per machine, not one per start.
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import torch

_lock = threading.Lock()
_warnings: list[str] = []


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str          # "" when ok, else one sentence: what failed
    cached: bool


def warnings_seen() -> list[str]:
    """Warnings of kernels that failed their check in this process (oldest first)."""
    with _lock:
        return list(_warnings)


def cache_path() -> Path:
    """The verdicts' file: in SLUICE_DATA_DIR's `cache` folder where that is set (the app's data folder: tests,
    a portable install), else in the user's cache folder."""
    data_dir = os.environ.get("SLUICE_DATA_DIR")
    if data_dir:
        return Path(data_dir) / "cache" / "kernel_verdicts.json"
    try:
        import platformdirs
        return Path(platformdirs.user_cache_dir("sluice")) / "kernel_verdicts.json"
    except ImportError:        # a bare environment (e.g. a GPU box's image): the XDG default
        return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sluice" / "kernel_verdicts.json"


def device_fingerprint(device: torch.device | str) -> str:
    device = torch.device(device)
    try:
        import triton
        triton_version, interpreting = triton.__version__, bool(triton.knobs.runtime.interpret)
    except ImportError:
        triton_version, interpreting = "none", False
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        driver = _driver_version()
    else:
        name, driver = "cpu-interpreter" if interpreting else "cpu", "-"
    return f"{name}|driver {driver}|triton {triton_version}|torch {torch.__version__}"


def _driver_version() -> str:
    try:
        first_line = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
        match = re.search(r"\b(\d+\.\d+(?:\.\d+)?)\b", first_line)     # "... Kernel Module for x86_64  580.159.04 ..."
        if match:
            return match.group(1)
    except (OSError, IndexError):
        pass
    try:
        import pynvml
        pynvml.nvmlInit()
        return str(pynvml.nvmlSystemGetDriverVersion())
    except Exception:      # noqa: BLE001 - no NVML is fine, the key just says so
        return f"cuda {torch.version.cuda}"


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; inf when out is not finite."""
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check(name: str, version: int, shape_key: str, device, run_kernel: Callable[[], torch.Tensor],
          run_ref: Callable[[], torch.Tensor], rtol: float, num_trials: int = 2) -> Verdict:
    """Run kernel and reference `num_trials` times (callers draw fresh inputs per call), compare,
    cache and return the verdict. A failing verdict is also warned about."""
    key = f"{device_fingerprint(device)}|{name} v{version}|{shape_key}"
    path = cache_path()
    with _lock:
        verdicts = load_json(path)
    if key in verdicts:
        verdict = Verdict(verdicts[key]["ok"], verdicts[key]["reason"], cached=True)
    else:
        verdict = _run(name, run_kernel, run_ref, rtol, num_trials)
        with _lock:
            verdicts = load_json(path)
            verdicts[key] = {"ok": verdict.ok, "reason": verdict.reason}
            save_json(path, verdicts)
    if not verdict.ok:
        _warn(f"Kernel {name} ({shape_key}) is not used on this GPU: {verdict.reason} "
              f"Sluice runs the slower reference path instead.")
    return verdict


def _run(name, run_kernel, run_ref, rtol, num_trials) -> Verdict:
    try:
        for _ in range(num_trials):
            # Poison-free by construction: each call allocates its output; NaN/inf fails below.
            err = rel_error(run_kernel(), run_ref())
            if err > rtol:
                what = "it returned NaN or inf." if err == float("inf") else f"its error {err:.2e} exceeds {rtol:.0e}."
                return Verdict(False, what[0].upper() + what[1:], cached=False)
    except Exception as exc:       # noqa: BLE001 - any failure of a kernel means "do not use it"
        return Verdict(False, f"It failed to run ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}).",
                       cached=False)
    return Verdict(True, "", cached=False)


def _warn(message: str) -> None:
    with _lock:
        if message in _warnings:
            return
        _warnings.append(message)
    print(f"sluice: warning: {message}", file=sys.stderr)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def load_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def save_json(path: Path, verdicts: Mapping) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(verdicts, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass    # an unwritable cache only means the check runs again next start


# ---------------------------------------------------------------- per-kernel selection

def _moe_cases(fmt: str, offsets: Mapping[str, int], block_bytes: int, intermediate: int, hidden: int, top_k: int,
               device: torch.device, dtype: torch.dtype, num_slots: int, seed: int, token_counts, hot_counts=()):
    """The MoE kernels' check inputs: a bank of random blocks, then for each count of tokens x, the slots of
    its top_k experts and their routing weights (the kernels' argument order). The cases of `hot_counts`
    follow, skewed as real prompts are: every token's first choice is slot 0 (in prefill, one expert's
    rows span several kernel blocks while the others get a few)."""
    from .formats import random_bank
    gen = torch.Generator().manual_seed(seed)
    bank = random_bank(num_slots, block_bytes, fmt, offsets, intermediate, hidden, device=device, generator=gen)
    for num_tokens, hot in [(n, False) for n in token_counts] + [(n, True) for n in hot_counts]:
        x = torch.randn(num_tokens, hidden, generator=gen).to(device, dtype)
        if hot:
            others = torch.stack([1 + torch.randperm(num_slots - 1, generator=gen)[:top_k - 1] for _ in range(num_tokens)])
            slots = torch.cat([torch.zeros(num_tokens, 1, dtype=others.dtype), others], dim=1)
        else:
            slots = torch.stack([torch.randperm(num_slots, generator=gen)[:top_k] for _ in range(num_tokens)])
        slots = slots.int().to(device)
        weights = torch.rand(num_tokens, top_k, generator=gen).to(device)
        yield x, bank, slots, weights, fmt, offsets, intermediate


def select_moe_decode(fmt: str, offsets: Mapping[str, int], block_bytes: int, intermediate: int, hidden: int,
                      top_k: int, device, kernel: Callable | None = None, dtype: torch.dtype = torch.bfloat16,
                      activation=None):
    """The MoE decode function to use for this model on this device: the Triton kernel if it passes
    its check (or a cached pass), else the torch reference. `kernel` injects a variant (tests).
    `activation`: the experts' (kernels.activation, default silu); biases where `offsets` has them.
    Returns (fn, verdict); fn has moe_decode's signature (the caller passes it `activation`)."""
    from .activation import SILU
    from .moe_decode import KERNEL_VERSION, moe_decode, moe_decode_ref

    activation = activation or SILU

    kernel = kernel or moe_decode
    device = torch.device(device)
    cases = _moe_cases(fmt, offsets, block_bytes, intermediate, hidden, top_k, device, dtype, num_slots=max(top_k + 1, 4),
                       seed=1234, token_counts=(1, 1, 3, 3))
    run_kernel, run_ref = _runners(cases, kernel, moe_decode_ref, activation=activation)
    rtol = 2e-2 if dtype == torch.bfloat16 else 1e-3
    shape_key = f"{fmt} I={intermediate} H={hidden} K={top_k} block={block_bytes} {dtype}{_extras(offsets, activation)}"
    verdict = check("moe_decode", KERNEL_VERSION, shape_key, device, run_kernel, run_ref, rtol, num_trials=4)
    return (kernel if verdict.ok else moe_decode_ref), verdict


def _runners(cases, kernel: Callable, ref: Callable, **kw) -> tuple[Callable, Callable]:
    """`check`'s pair of calls: the kernel on the next case's arguments, then the reference on the same."""
    current: list = []

    def run_kernel():
        current[:] = [next(cases)]
        return kernel(*current[0], **kw)

    def run_ref():
        return ref(*current[0], **kw)

    return run_kernel, run_ref


def _extras(offsets: Mapping[str, int], activation) -> str:
    """What a verdict's shape key adds for experts other than plain silu ones without biases."""
    bias = " biases" if any(name.endswith("_bias.b") for name in offsets) else ""
    act = "" if activation.name == "silu" else f" {activation.name}(alpha={activation.alpha}, limit={activation.limit})"
    return bias + act


def select_int8_linear(out_features: int, in_features: int, device, dtype: torch.dtype = torch.bfloat16,
                       kernel: Callable | None = None, prompts: bool = False):
    """The int8 dense linear to use for an [out, in] weight on this device: the Triton kernel if it passes
    its check against the torch reference (one and a few tokens), else None (the caller keeps the
    reference). `prompts`: prompts too, through the GEMM kernel (int8_linear_any; checked on a prompt's
    rows as well). `kernel` injects a variant (tests). Returns (fn or None, verdict)."""
    from .cpu_linear import int8_linear_ref
    from .int8_linear import KERNEL_VERSION, MAX_KERNEL_TOKENS, int8_linear_any, int8_linear_kernel

    kernel = kernel or (int8_linear_any if prompts else int8_linear_kernel)
    device = torch.device(device)
    gen = torch.Generator().manual_seed(4321)
    codes = torch.randint(-127, 128, (out_features, in_features), generator=gen, dtype=torch.int8).to(device)
    scale = (torch.rand(out_features, generator=gen) * in_features ** -0.5 / 64).to(device, torch.bfloat16)
    cases = iter([(torch.randn(n, in_features, generator=gen).to(device, dtype), codes, scale)
                  for n in (1, 1, MAX_KERNEL_TOKENS) + ((100,) if prompts else ())])
    run_kernel, run_ref = _runners(cases, kernel, int8_linear_ref)

    rtol = 1e-2 if dtype == torch.bfloat16 else 1e-4        # the sums' order differs (bf16: and its rounded weights)
    shape_key = f"N={out_features} K={in_features} {dtype}" + (" prompts" if prompts else "")
    verdict = check("int8_linear", KERNEL_VERSION, shape_key, device, run_kernel, run_ref, rtol,
                    num_trials=4 if prompts else 3)
    return (kernel if verdict.ok else None), verdict


def select_router(num_experts: int, hidden: int, top_k: int, renormalize: bool, device,
                  dtype: torch.dtype = torch.bfloat16, kernel: Callable | None = None, topk_first: bool = False):
    """The router kernel (router.py) for this shape, if it routes as its torch reference does (one token, a
    prompt's 100): softmax top-k, or with topk_first gpt-oss's top-k softmax of biased logits. Compared: the
    kernel's weights, and what the reference's scores give the experts the kernel chose, against the
    reference's top k. An expert swapped at a near-tie (the logits' last bit) costs ~nothing; a wrong choice
    costs its whole weight. `kernel` injects a variant (tests). Returns (fn or None, verdict)."""
    import torch.nn.functional as F
    from .router import KERNEL_VERSION, router_kernel, router_ref, topk_softmax_ref

    kernel = kernel or router_kernel
    device = torch.device(device)
    gen = torch.Generator().manual_seed(5432)
    weight = (torch.randn(num_experts, hidden, generator=gen) * hidden ** -0.5).to(device, dtype)
    bias = torch.randn(num_experts, generator=gen).to(device, dtype) if topk_first else None
    cases = iter([(torch.randn(n, hidden, generator=gen).to(device, dtype),) for n in (1, 1, 100)])

    def chosen(h):                # the kernel's weights, then the reference's scores of its experts
        weights, ids = kernel(h, weight, top_k, renormalize, **({"bias": bias, "topk_first": True} if topk_first
                                                                 else {}))
        if topk_first:
            given = torch.softmax(F.linear(h, weight, bias).float().gather(1, ids), dim=-1)
        else:
            given = torch.softmax(F.linear(h, weight), dim=-1, dtype=torch.float32).gather(1, ids)
            given = given / given.sum(dim=-1, keepdim=True) if renormalize else given
        return torch.cat([weights.float(), given], dim=1)

    def expected(h):
        if topk_first:
            weights, _ = topk_softmax_ref(h, weight, bias, top_k)
            top = torch.topk(F.linear(h, weight, bias).float(), top_k, dim=-1).values
            return torch.cat([weights.float(), torch.softmax(top, dim=-1)], dim=1)
        weights, _ = router_ref(h, weight, top_k, renormalize)
        return torch.cat([weights, weights], dim=1)

    run_kernel, run_ref = _runners(cases, chosen, expected)
    rtol = 1e-2 if dtype != torch.float32 else 1e-4
    how = "topk-softmax bias" if topk_first else f"renorm={renormalize}"
    shape_key = f"E={num_experts} H={hidden} K={top_k} {how} {dtype}"
    verdict = check("router", KERNEL_VERSION, shape_key, device, run_kernel, run_ref, rtol, num_trials=3)
    return (kernel if verdict.ok else None), verdict


def select_grouped_router(num_experts: int, hidden: int, routing, has_bias: bool, device,
                          dtype: torch.dtype = torch.bfloat16, kernel: Callable | None = None):
    """The grouped router kernel (router.py) for this shape and routing (a softmax_topk.GroupedRouting), if it
    routes as routing.route does (one token, a prompt's 100). Compared: the kernel's weights against what the
    reference weighs the experts it chose with, and the reference's choice scores of those experts in the
    kernel's order against the reference's top k best first. An expert swapped at a near-tie of the choice costs
    ~nothing; a wrong choice, a wrong order or a wrong weighing costs its whole score. `kernel` injects a variant
    (tests). Returns (fn or None, verdict)."""
    from .router import KERNEL_VERSION, grouped_router_kernel

    kernel = kernel or grouped_router_kernel
    device = torch.device(device)
    gen = torch.Generator().manual_seed(6543)
    weight = (torch.randn(num_experts, hidden, generator=gen) * hidden ** -0.5).to(device, dtype)
    bias = (0.3 * torch.randn(num_experts, generator=gen)).to(device) if has_bias else None
    cases = iter([(torch.randn(n, hidden, generator=gen).to(device, dtype),) for n in (1, 1, 100)])
    kernel_ids: list[torch.Tensor] = []

    def chosen(h):                # the kernel's weights, then the reference's choice of its experts in its order
        weights, ids = kernel(h, weight, bias, routing)
        kernel_ids[:] = [ids]
        choice = routing.choice(routing.scores(h, weight), bias).gather(1, ids)
        return torch.cat([weights.float(), choice.nan_to_num(neginf=0.0)], dim=1)   # outside the kept groups: 0

    def expected(h):              # the reference's weights of the kernel's experts, its own top k choice
        scores = routing.scores(h, weight)
        top = torch.topk(routing.choice(scores, bias), routing.top_k, dim=-1).values
        return torch.cat([routing.weights(scores, kernel_ids[0]), top], dim=1)

    run_kernel, run_ref = _runners(cases, chosen, expected)
    rtol = 1e-3                   # float32 logits, scores and weights: only the sums' order differs
    how = ",".join(f"{name}={value}" for name, value in vars(routing).items())
    shape_key = f"E={num_experts} H={hidden} {how}{' bias' if has_bias else ''} {dtype}"
    verdict = check("grouped_router", KERNEL_VERSION, shape_key, device, run_kernel, run_ref, rtol, num_trials=3)
    return (kernel if verdict.ok else None), verdict


def select_rms_norm(width: int, dtype: torch.dtype, weight_dtype: torch.dtype, device, kernel: Callable | None = None):
    """The RMS norm kernel (rms_norm.py) for rows of `width` on this device, if it matches the torch path on
    one row, one row again and a prompt's 37. Returns (fn or None, verdict)."""
    from .rms_norm import KERNEL_VERSION, rms_norm_kernel, rms_norm_ref

    kernel = kernel or rms_norm_kernel
    device = torch.device(device)
    gen = torch.Generator().manual_seed(7654)
    weight = (1 + 0.2 * torch.randn(width, generator=gen)).to(device, weight_dtype)
    cases = iter([((torch.randn(n, width, generator=gen) * 3).to(device, dtype), weight, 1e-6) for n in (1, 1, 37)])
    run_kernel, run_ref = _runners(cases, kernel, rms_norm_ref)
    rtol = 1e-5 if torch.float32 in (dtype, weight_dtype) and dtype == weight_dtype else 1e-2
    verdict = check("rms_norm", KERNEL_VERSION, f"N={width} {dtype} weight {weight_dtype}", device, run_kernel, run_ref,
                    rtol, num_trials=3)
    return (kernel if verdict.ok else None), verdict


def select_grouped_norm(group: int, count: int, dtype: torch.dtype, device, kernel: Callable | None = None):
    """The grouped RMS norm kernel (rms_norm.py) for rows of `count` groups of `group` on this device, if it matches
    the torch path on one row, one row again and a prompt's 37. Returns (fn or None, verdict)."""
    from .rms_norm import KERNEL_VERSION, grouped_norm_kernel, grouped_norm_ref

    kernel = kernel or grouped_norm_kernel
    device = torch.device(device)
    gen = torch.Generator().manual_seed(7655)
    scale = (1 + 0.2 * torch.randn(count * group, generator=gen)).to(device)
    cases = iter([((torch.randn(n, count * group, generator=gen) * 3).to(device, dtype), scale, group, 1e-6)
                  for n in (1, 1, 37)])
    run_kernel, run_ref = _runners(cases, kernel, grouped_norm_ref)
    verdict = check("grouped_norm", KERNEL_VERSION, f"G={group} n={count} {dtype}", device, run_kernel, run_ref,
                    1e-5 if dtype == torch.float32 else 1e-2, num_trials=3)
    return (kernel if verdict.ok else None), verdict


def select_hyper_steps(count: int, hidden: int, rank: int, dtype: torch.dtype, device, steps=None):
    """qwen4_exp's hyper-connection steps (hyper_mix.py) for n = `count` streams of `hidden` and a gate of `rank` on
    this device, if each matches its torch step on one token, one again and a prompt's 37. `steps` injects a variant
    (tests). Returns (the kernels' HyperSteps or None, the first failing verdict or the last one)."""
    from . import hyper_mix
    from .hyper_ref import HyperSteps

    steps = steps or HyperSteps(hyper_mix.scaled_silu, hyper_mix.gated_mean, hyper_mix.stream_weights,
                                hyper_mix.inject)
    device = torch.device(device)
    gen = torch.Generator().manual_seed(7656)

    def rows(n: int, width: int, spread: float = 3.0) -> torch.Tensor:
        return (torch.randn(n, width, generator=gen) * spread).to(device, dtype)

    counts = (1, 1, 37)
    checks = {"scaled_silu": [(rows(n, rank), count) for n in counts],
              "gated_mean": [(rows(n, count * hidden), rows(n, count * hidden, 1.0), count) for n in counts],
              "stream_weights": [(rows(n, count), count) for n in counts],
              "inject": [(rows(n, count * hidden), rows(n, hidden), rows(n, count, 1.0).sigmoid() * 2) for n in counts]}
    shape_key = f"n={count} H={hidden} R={rank} {dtype}"
    rtol = 1e-5 if dtype == torch.float32 else 1e-2
    for name, cases in checks.items():
        run_kernel, run_ref = _runners(iter(cases), getattr(steps, name), getattr(hyper_mix, f"{name}_ref"))
        verdict = check(f"hyper_{name}", hyper_mix.KERNEL_VERSION, shape_key, device, run_kernel, run_ref, rtol,
                        num_trials=3)
        if not verdict.ok:
            return None, verdict
    return steps, verdict


def select_deltanet_decode(num_k_heads: int, num_v_heads: int, k_dim: int, v_dim: int, activation: str,
                           dtype: torch.dtype, weight_dtype: torch.dtype, device, kernel: Callable | None = None):
    """Gated DeltaNet's one-token kernel (deltanet_decode.py, its gated norm fused) for these heads, if it matches the
    torch path over two steps from a random state (the second reads the state the first wrote), with decays from
    ~e^-15 to 1 formed from the token's a and b. Returns (fn or None, verdict)."""
    from .deltanet_decode import KERNEL_VERSION, deltanet_decode, deltanet_decode_ref

    kernel = kernel or deltanet_decode
    device = torch.device(device)
    gen = torch.Generator().manual_seed(6789)
    weight = (1 + 0.2 * torch.randn(v_dim, generator=gen)).to(device, weight_dtype)

    rand = lambda *shape, scale=1.0: (scale * torch.randn(*shape, generator=gen)).to(device, dtype)   # noqa: E731
    a_log = (torch.rand(num_v_heads, generator=gen) * 2.7).log().to(device, dtype)      # decay rates up to ~e^1
    dt_bias = rand(num_v_heads)

    def token():                  # q, k, v, a, b, gate (a spread wide: decays from ~e^-15 to 1)
        return (rand(1, num_k_heads, k_dim), rand(1, num_k_heads, k_dim), rand(1, num_v_heads, v_dim),
                rand(1, num_v_heads, scale=4.0), rand(1, num_v_heads), rand(1, num_v_heads, v_dim))

    cases = iter([(token(), token(), (0.3 * torch.randn(num_v_heads, k_dim, v_dim, generator=gen)).to(device))
                  for _ in range(3)])

    def two_steps(fn):
        def run(first, second, state):
            state = state.clone()
            return torch.cat([fn(*t[:5], a_log, dt_bias, state, t[5], weight, 1e-6, activation).flatten()
                              for t in (first, second)])
        return run

    run_kernel, run_ref = _runners(cases, two_steps(kernel), two_steps(deltanet_decode_ref))
    rtol = 1e-2 if dtype != torch.float32 else 1e-4
    shape_key = f"Hk={num_k_heads} Hv={num_v_heads} Dk={k_dim} Dv={v_dim} {activation} {dtype} weight {weight_dtype}"
    verdict = check("deltanet_decode", KERNEL_VERSION, shape_key, device, run_kernel, run_ref, rtol, num_trials=3)
    return (kernel if verdict.ok else None), verdict


def select_rope(num_q_heads: int, num_kv_heads: int, head_dim: int, rotary: int, dtype: torch.dtype, device,
                kernel: Callable | None = None):
    """The rotary kernel (rope.py) for these heads, if it gives the torch path's values (each product rounded
    to the dtype, then the sum: exact where the GPU rounds as torch does) for one token at two positions and
    a prompt's 37. Returns (fn or None, verdict)."""
    from .rope import KERNEL_VERSION, rope_pair, rope_pair_ref

    kernel = kernel or rope_pair
    device = torch.device(device)
    gen = torch.Generator().manual_seed(9876)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary, 2, dtype=torch.float32) / rotary))

    def case(positions):
        freqs = torch.tensor(positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return (torch.randn(len(positions), num_q_heads, head_dim, generator=gen).to(device, dtype),
                torch.randn(len(positions), num_kv_heads, head_dim, generator=gen).to(device, dtype),
                emb.cos().to(device, dtype), emb.sin().to(device, dtype))

    cases = iter([case([0]), case([1234]), case(list(range(37)))])
    flat = lambda fn: (lambda *args: torch.cat([t.reshape(-1) for t in fn(*args)]))    # noqa: E731
    run_kernel, run_ref = _runners(cases, flat(kernel), flat(rope_pair_ref))
    shape_key = f"Hq={num_q_heads} Hkv={num_kv_heads} D={head_dim} R={rotary} {dtype}"
    verdict = check("rope", KERNEL_VERSION, shape_key, device, run_kernel, run_ref, 1e-6, num_trials=3)
    return (kernel if verdict.ok else None), verdict


def select_decode_attention(num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                            window: int | None, device, kernel: Callable | None = None, sinks: bool = False):
    """The one-token attention kernel (decode_attention.py) for these heads, if it matches the torch path
    over a KV buffer longer than what is held: the first position, one in the middle (past the window,
    where there is one) and the buffer's last. `sinks`: each case with random sink logits [Hq] too.
    Returns (fn or None, verdict)."""
    from .decode_attention import KERNEL_VERSION, attention_ref, decode_attention

    kernel = kernel or decode_attention
    device = torch.device(device)
    gen = torch.Generator().manual_seed(8765)
    held = 300
    cases = iter([_one_query(gen, num_q_heads, num_kv_heads, head_dim, held, device, dtype)
                  + (torch.tensor([position]).to(device), window)
                  + (((torch.randn(num_q_heads, generator=gen) * 2).to(device, dtype),) if sinks else ())
                  for position in (0, 137, held - 1)])
    sinks_last = lambda fn: (lambda *args: fn(*args[:-1], sinks=args[-1])) if sinks else fn    # noqa: E731
    run_kernel, run_ref = _runners(cases, sinks_last(kernel), sinks_last(attention_ref))
    rtol = 1e-2 if dtype != torch.float32 else 1e-4
    shape_key = f"Hq={num_q_heads} Hkv={num_kv_heads} D={head_dim} window={window} {dtype}{' sinks' if sinks else ''}"
    verdict = check("decode_attention", KERNEL_VERSION, shape_key, device, run_kernel, run_ref, rtol, num_trials=3)
    return (kernel if verdict.ok else None), verdict


def _one_query(gen, num_q_heads: int, num_kv_heads: int, head_dim: int, held: int, device, dtype) -> tuple:
    """A decode token's random q [1, Hq, D] and a KV buffer's k, v [held, Hkv, D]."""
    return (torch.randn(1, num_q_heads, head_dim, generator=gen).to(device, dtype),
            torch.randn(held, num_kv_heads, head_dim, generator=gen).to(device, dtype),
            torch.randn(held, num_kv_heads, head_dim, generator=gen).to(device, dtype))


def select_masked_attention(num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device,
                            kernel: Callable | None = None):
    """The one-token attention kernel over a mask of gathered rows (decode_attention.masked_attention, qwen4_exp's
    QSA) for these heads, if it matches the torch path: a sparse mask, one whose first splits are all dropped, and
    a full one (the last row always seen, as a query sees itself). Returns (fn or None, verdict)."""
    from .decode_attention import KERNEL_VERSION, masked_attention, masked_attention_ref

    kernel = kernel or masked_attention
    device = torch.device(device)
    gen = torch.Generator().manual_seed(8767)
    held = 300

    def mask(keep: float, dropped: int) -> torch.Tensor:
        visible = torch.rand(1, held, generator=gen) < keep
        visible[0, :dropped], visible[0, -1] = False, True
        return visible.to(device)
    cases = iter([_one_query(gen, num_q_heads, num_kv_heads, head_dim, held, device, dtype) + (mask(keep, dropped),)
                  for keep, dropped in ((0.2, 0), (0.5, 200), (1.0, 0))])
    run_kernel, run_ref = _runners(cases, kernel, masked_attention_ref)
    rtol = 1e-2 if dtype != torch.float32 else 1e-4
    shape_key = f"Hq={num_q_heads} Hkv={num_kv_heads} D={head_dim} {dtype}"
    verdict = check("masked_attention", KERNEL_VERSION, shape_key, device, run_kernel, run_ref, rtol, num_trials=3)
    return (kernel if verdict.ok else None), verdict


def select_mla_decode(num_heads: int, kv_lora_rank: int, rope_dim: int, dtype: torch.dtype, device,
                      kernel: Callable | None = None):
    """MLA's one-token latent attention kernel (mla_decode.py) for these heads and widths, if it matches the torch
    path's math over a latent buffer longer than what is held: the first position, one in the middle and the
    buffer's last. Returns (fn or None, verdict)."""
    from .attention_ref import mla_decode_ref
    from .mla_decode import KERNEL_VERSION, mla_decode

    kernel = kernel or mla_decode
    device = torch.device(device)
    gen = torch.Generator().manual_seed(8766)
    held = 300
    cases = iter([tuple(torch.randn(*shape, generator=gen).to(device, dtype) for shape in
                        ((num_heads, kv_lora_rank), (num_heads, rope_dim), (held, kv_lora_rank), (held, rope_dim)))
                  + (torch.tensor([position]).to(device), (kv_lora_rank + rope_dim) ** -0.5)
                  for position in (0, 137, held - 1)])

    def exact(q_latent, q_rope, kv_latent, k_rope, where, scale):
        """The reference in float32 on the same inputs: in bf16 it rounds the scores before the softmax (an error
        of ~1e-2 at r = 512, about twice the kernel's, which keeps them in float32)."""
        latents = (t.float() for t in (q_latent, q_rope, kv_latent, k_rope))
        return mla_decode_ref(*latents, where, scale).to(dtype)

    run_kernel, run_ref = _runners(cases, kernel, exact)
    rtol = 1e-2 if dtype != torch.float32 else 1e-4
    shape_key = f"H={num_heads} r={kv_lora_rank} dr={rope_dim} {dtype}"
    verdict = check("mla_decode", KERNEL_VERSION, shape_key, device, run_kernel, run_ref, rtol, num_trials=3)
    return (kernel if verdict.ok else None), verdict


def select_top_candidates(vocab: int, k: int, device, kernel: Callable | None = None):
    """The top-candidates kernel (top_candidates.py) for k's block size on this vocabulary, if each chunk's
    k largest and their ids match its numpy reference: bf16-rounded logits (many ties), and one chunk
    holding every large logit. Compared on the host, so the check itself loads no CUDA operator. `kernel`
    injects a variant (tests). Returns (fn or None, verdict)."""
    import triton

    from .top_candidates import KERNEL_VERSION, top_candidates, top_candidates_ref

    kernel = kernel or top_candidates
    device = torch.device(device)
    block = triton.next_power_of_2(k)
    gen = torch.Generator().manual_seed(6543)
    rows = [(torch.randn(vocab, generator=gen) * 4).to(torch.bfloat16).float() for _ in range(2)]
    rows[1][:min(vocab, 3 * block)] += 40.0                             # one chunk holds all the top ones
    cases = iter([(row.to(device), kk) for row in rows for kk in sorted({block, block // 2 + 1})])

    def comparable(table: torch.Tensor) -> torch.Tensor:        # padding (-inf, its ids unused) set alike
        table = table.cpu().clone()
        pad = ~torch.isfinite(table[0])
        table[0][pad], table[1][pad] = -1e30, 0.0
        return table

    run_kernel, run_ref = _runners(cases, lambda *a: comparable(kernel(*a)), lambda *a: comparable(top_candidates_ref(*a)))
    verdict = check("top_candidates", KERNEL_VERSION, f"V={vocab} BLOCK_K={block}", device, run_kernel, run_ref,
                    0.0, num_trials=4 if block > 1 else 2)
    return (kernel if verdict.ok else None), verdict


def check_moe_prefill(fmt: str, offsets: Mapping[str, int], block_bytes: int, intermediate: int, hidden: int,
                      top_k: int, device, dtype: torch.dtype = torch.bfloat16, kernel: Callable | None = None,
                      config=None, activation=None) -> Verdict:
    """Whether the MoE prefill kernel (moe_prefill.py, in `config`) computes this model's expert shapes
    right on this device, against its torch reference: a prompt whose experts span several blocks with
    padded tails, a short one, and a skewed one (one expert in every token's choices). A failure is
    warned about; the caller keeps the torch path. `kernel` injects a variant with moe_prefill_bank's signature (tests).
    `activation`: the experts' (kernels.activation, default silu); biases where `offsets` has them."""
    from .activation import SILU
    from .moe_prefill import KERNEL_VERSION, default_config, moe_prefill_bank, moe_prefill_ref

    config = config or default_config(dtype)
    activation = activation or SILU
    kernel = kernel or (lambda *args, **kw: moe_prefill_bank(*args, config=config, **kw))
    device = torch.device(device)
    # 128 * K pairs over 10 slots: several blocks an expert at BM 64; then 100 tokens all choosing slot 0
    cases = _moe_cases(fmt, offsets, block_bytes, intermediate, hidden, top_k, device, dtype,
                       num_slots=max(top_k + 2, 10), seed=2345, token_counts=(128, 7), hot_counts=(100,))
    run_kernel, run_ref = _runners(cases, kernel, moe_prefill_ref, activation=activation)
    rtol = 2e-2 if dtype != torch.float32 else 1e-4
    shape_key = f"{fmt} I={intermediate} H={hidden} K={top_k} block={block_bytes} {dtype} {config}{_extras(offsets, activation)}"
    return check("moe_prefill", KERNEL_VERSION, shape_key, device, run_kernel, run_ref, rtol, num_trials=3)
