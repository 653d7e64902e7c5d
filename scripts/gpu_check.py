"""The one script run on the GPU box: kernel correctness and speed at real shapes, GPU tests,
bf16-vs-fp32 logits, decode profiles, and the `sluice bench` runs (some under a cgroup v2 memory cap,
page cache included). Stages: the STAGES table at the bottom (default: all). Prints a short table
per stage; JSON goes to $OUT.

    PYTHONUNBUFFERED=1 SLUICE_BENCH_DIR=/tmp/sb python3 scripts/gpu_check.py tests profile-stream bench-olmoe-cap
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = Path(os.environ.get("OUT", "/tmp/gpu_check_out"))
OUT.mkdir(parents=True, exist_ok=True)
WORK = Path(os.environ.get("SLUICE_BENCH_DIR", "/tmp/sluice-bench"))
os.environ.setdefault("SLUICE_KERNEL_CACHE", str(WORK / "kernel_verdicts.json"))
RESULTS: dict = {}
SUMMARY: list[str] = []        # one line per test stage and bench, printed last


def save():
    (OUT / "gpu_check.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def stage_kernels(models=("qwen3-30b-a3b", "olmoe-1b-7b"), fmts=("fp8", "nvfp4", "bf16")):
    import triton

    hbm = _kernel_env()
    shapes = {m: s for m, s in {"qwen3-30b-a3b": (768, 2048, 8), "olmoe-1b-7b": (1024, 2048, 8),
                                "gpt-oss-120b": (2880, 2880, 4)}.items() if m in models}
    rows = []
    for model, shape in shapes.items():
        for fmt in fmts:
            rows.append(_kernel_row(model, shape, fmt, hbm))
            save()
    RESULTS["kernels"] = rows
    RESULTS["triton"] = triton.__version__


def _kernel_env() -> float:
    """Record the device, its copy bandwidths and the host sync time; returns the HBM copy rate."""
    import torch
    from triton.testing import do_bench

    from kernels.selfcheck import device_fingerprint
    from engine.plan.bandwidth import h2d_bps, hbm_copy_bps
    hbm, h2d = hbm_copy_bps(), h2d_bps()
    RESULTS["env"] = {"fingerprint": device_fingerprint("cuda"), "hbm_copy_bps": hbm, "h2d_bps": h2d,
                      "sm_count": torch.cuda.get_device_properties(0).multi_processor_count}
    print(f"env: {RESULTS['env']['fingerprint']}; HBM copy {hbm / 1e12:.2f} TB/s; h2d {h2d / 1e9:.1f} GB/s")
    ids = torch.randint(0, 128, (1, 16), device="cuda")
    RESULTS["host_sync_us"] = do_bench(lambda: ids.tolist(), return_mode="median") * 1e3
    print(f"host sync (read 16 expert ids): {RESULTS['host_sync_us']:.1f} us")
    return hbm


def _sweep(fmt: str) -> list:
    """Kernel configs tried for a format: a wide sweep for one-byte weights, a short one for the rest."""
    from kernels.moe_decode import DecodeConfig as C, default_config
    if fmt in ("fp8", "int8"):
        return [default_config(fmt),
                C(8, 4, 1024, 4), C(8, 4, 1024, 4, True), C(8, 8, 1024, 4, True), C(4, 4, 2048, 4, True),
                C(16, 8, 512, 4, True), C(8, 16, 512, 4, True), C(4, 8, 1024, 2, True), C(4, 4, 1024, 2, True),
                C(16, 16, 256, 4), C(8, 8, 2048, 8, True), C(2, 8, 2048, 4, True), C(4, 16, 2048, 8, True),
                C(8, 16, 512, 4, True, num_stages=1), C(16, 32, 512, 4, fused=True), C(8, 16, 512, 4, fused=True),
                C(2, 4, 1024, 2, True), C(4, 4, 2048, 2, True), C(2, 2, 1024, 1, True), C(4, 4, 1024, 1, True),
                C(2, 4, 2048, 2, True), C(8, 4, 1024, 2, True), C(4, 4, 512, 2, True), C(8, 16, 512, 4, True),
                C(2, 4, 1024, 2, fused=True), C(4, 4, 1024, 2, fused=True)]
    return [default_config(fmt),
            C(16, 8, 512, 4), C(16, 8, 512, 4, True), C(8, 4, 1024, 4, True), C(8, 8, 512, 4, True),
            C(4, 8, 512, 2, True), C(4, 8, 512, 4, fused=True), C(16, 16, 512, 4, fused=True)]


def _kernel_row(model: str, shape: tuple, fmt: str, hbm: float) -> dict:
    """One model's expert shapes in one format: correctness, the config sweep, eager and torch times."""
    import torch
    from triton.testing import do_bench

    from kernels.formats import make_offsets, random_bank
    from kernels.moe_decode import moe_decode, moe_decode_ref
    from kernels.selfcheck import select_moe_decode
    inter, hidden, top_k = shape
    offsets, block_bytes = make_offsets(fmt, inter, hidden)
    small = random_bank(16, block_bytes, fmt, offsets, inter, hidden, generator=torch.Generator().manual_seed(1))
    num_slots = max(16, (768 << 20) // block_bytes // 16 * 16)       # ~768 MB of slots: >> 60 MB L2
    bank = small.cuda().repeat(num_slots // 16, 1)
    gen = torch.Generator().manual_seed(2)
    sets = [torch.randperm(num_slots, generator=gen)[:top_k].int().view(1, top_k).cuda() for _ in range(64)]
    weights = torch.rand(1, top_k, device="cuda")
    x = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)
    errs = _kernel_errors(bank, num_slots, shape, fmt, offsets, gen)
    weight_bytes = top_k * sum(n for n in _field_bytes(fmt, inter, hidden))
    run = lambda cfg: lambda i: moe_decode(x, bank, sets[i], weights, fmt, offsets, inter, config=cfg)  # noqa: E731
    cfg, t_graph = _best_config(run, len(sets), f"{model} {fmt}", weight_bytes, hbm, _sweep(fmt))
    i = iter(range(10 ** 9))
    t_eager = do_bench(lambda: moe_decode(x, bank, sets[next(i) % 64], weights, fmt, offsets, inter, config=cfg),
                       return_mode="median") * 1e-3
    t_torch = do_bench(lambda: moe_decode_ref(x, bank, sets[next(i) % 64], weights, fmt, offsets, inter),
                       return_mode="median") * 1e-3
    row = {"model": model, "fmt": fmt, "rel_err_T1": errs[0], "rel_err_T4": errs[1], "best_config": cfg.__dict__,
           "weight_bytes": weight_bytes, "graph_us": t_graph * 1e6, "eager_us": t_eager * 1e6,
           "torch_ref_us": t_torch * 1e6, "graph_bw_frac_of_hbm_copy": weight_bytes / t_graph / hbm,
           "eager_bw_frac_of_hbm_copy": weight_bytes / t_eager / hbm}
    print(f"{model:14s} {fmt:6s} err {errs[0]:.1e}/{errs[1]:.1e}  {weight_bytes / 1e6:6.1f} MB  "
          f"graph {t_graph * 1e6:7.1f} us ({row['graph_bw_frac_of_hbm_copy']:.0%} of HBM copy)  "
          f"eager {t_eager * 1e6:7.1f} us ({row['eager_bw_frac_of_hbm_copy']:.0%})  torch {t_torch * 1e6:8.1f} us  "
          f"best {_config_name(cfg)}", flush=True)
    fn, verdict = select_moe_decode(fmt, offsets, block_bytes, inter, hidden, top_k, "cuda")
    row["selfcheck"] = {"ok": verdict.ok, "reason": verdict.reason}
    return row


def _kernel_errors(bank, num_slots: int, shape: tuple, fmt: str, offsets, gen) -> list[float]:
    """Relative error against the torch reference on fresh data, for 1 and 4 tokens (inf on NaN)."""
    import torch

    from kernels.moe_decode import moe_decode, moe_decode_ref
    inter, hidden, top_k = shape
    errs = []
    for t in (1, 4):
        xs = torch.randn(t, hidden, device="cuda", dtype=torch.float32)
        sl = torch.stack([torch.randperm(num_slots, generator=gen)[:top_k] for _ in range(t)]).int().cuda()
        ws = torch.rand(t, top_k, device="cuda")
        ref = moe_decode_ref(xs, bank, sl, ws, fmt, offsets, inter).double()
        out = moe_decode(xs, bank, sl, ws, fmt, offsets, inter).double()
        errs.append(((out - ref).norm() / ref.norm()).item() if torch.isfinite(out).all() else float("inf"))
    return errs


def _best_config(run, num_sets: int, label: str, weight_bytes: int, hbm: float, configs: list):
    """The fastest config by CUDA-graph replay time (configs that do not compile are skipped)."""
    best = None
    for cfg in configs:
        try:
            t_graph = _graph_time(run(cfg), num_sets)
        except Exception as exc:      # noqa: BLE001 - a config that does not compile is skipped
            print(f"  {label} {cfg}: failed {type(exc).__name__}")
            continue
        if best is None or t_graph < best[1]:
            best = (cfg, t_graph)
        print(f"  {label} {_config_name(cfg)}: {t_graph * 1e6:.1f} us ({weight_bytes / t_graph / hbm:.0%})")
    return best


def _config_name(cfg) -> str:
    return (f"{cfg.block_i}/{cfg.block_h}/{cfg.block_k}/w{cfg.num_warps}"
            f"{'/split' if cfg.split_down else ''}{'/fused' if cfg.fused else ''}")


def _field_bytes(fmt, inter, hidden):
    from kernels.formats import part_specs, proj_shapes
    import torch
    for out_f, in_f in proj_shapes(inter, hidden).values():
        for _, dt, shape in part_specs(fmt, out_f, in_f):
            yield torch.Size(shape).numel() * torch.empty((), dtype=dt).element_size()


def _graph_time(call, n):
    """Seconds per call: n calls (rotating slot sets) captured in one CUDA graph, replays timed."""
    import torch
    for i in range(n):
        call(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n):
            call(i)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / n)
    return sorted(times)[len(times) // 2]


def stage_kernels_dense(shapes=((2048, 2048), (1024, 2048), (50304, 2048), (4096, 4096), (151936, 2048))):
    """The int8 dense linear at one token (decode) against the bf16 weight through torch (cuBLAS), both
    inside a CUDA graph, per config: error against the reference and time (OLMoE, Qwen3 heads)."""
    import torch
    from kernels.cpu_linear import int8_linear_ref
    from kernels.int8_linear import LinearConfig, int8_linear_kernel
    from kernels.selfcheck import rel_error
    configs = [LinearConfig(n, k, w) for n, k, w in ((8, 512, 4), (4, 512, 4), (16, 256, 4), (8, 1024, 4),
                                                      (4, 1024, 2), (16, 512, 8), (2, 1024, 2))]
    rows = []
    for n, k in shapes:
        gen = torch.Generator().manual_seed(0)
        q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8).cuda()
        scale = (torch.rand(n, generator=gen) / k ** 0.5 / 64).to("cuda", torch.bfloat16)
        xs = [torch.randn(1, k, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
        w16 = (q.float() * scale.float()[:, None]).bfloat16()
        t_bf16 = _graph_time(lambda i: torch.nn.functional.linear(xs[i], w16), 8)
        del w16
        best = None
        for cfg in configs:
            try:
                err = rel_error(int8_linear_kernel(xs[0], q, scale, cfg), int8_linear_ref(xs[0], q, scale))
                t = _graph_time(lambda i, cfg=cfg: int8_linear_kernel(xs[i], q, scale, cfg), 8)
            except Exception as exc:      # noqa: BLE001 - a config that does not compile is skipped
                print(f"  {n}x{k} {cfg}: failed {type(exc).__name__}")
                continue
            print(f"  {n}x{k} bn{cfg.block_n}/bk{cfg.block_k}/w{cfg.num_warps}: {t * 1e6:.1f} us "
                  f"({n * k / t / 1e9:.0f} GB/s), err {err:.1e}")
            if best is None or t < best[1]:
                best = (cfg, t, err)
        rows.append({"shape": [n, k], "bf16_us": t_bf16 * 1e6, "int8_us": best[1] * 1e6, "err": best[2],
                     "config": str(best[0])})
        SUMMARY.append(f"int8 linear {n}x{k}: {best[1] * 1e6:.1f} us ({n * k / best[1] / 1e9:.0f} GB/s, "
                       f"{best[0]}) vs bf16 torch {t_bf16 * 1e6:.1f} us; err {best[2]:.1e}")
    RESULTS["kernels_dense"] = rows
    save()


PREFILL_SHAPES = {"olmoe-1b-7b": ((1024, 2048, 8), 64), "gpt-oss-120b": ((2880, 2880, 4), 128)}   # (I, H, K), experts


def stage_prefill_kernel():
    """The prefill kernel's tests on the GPU (the token-exact streaming ones included), then its time for
    one layer of a 512-token prefill in a few configs, against the torch path: every format at olmoe-1b-7b's
    shapes, the fp4 formats (what huge checkpoints ship in) at gpt-oss-120b's too."""
    stage_tests(("tests/kernels/test_moe_prefill.py", "tests/streaming/test_prefill_kernel.py"), ())
    for fmt in ("int8", "fp8", "bf16", "nvfp4", "mxfp4"):
        _prefill_kernel_times(fmt, "olmoe-1b-7b")
    for fmt in ("mxfp4", "nvfp4"):
        _prefill_kernel_times(fmt, "gpt-oss-120b")


def _prefill_kernel_times(fmt: str, model: str, num_tokens=512) -> None:
    """Every expert of one `model` layer resident (one bank), bf16 activations: the kernel pair alone (routing
    made before), the routing alone, and the torch path's per-expert loop (dequantise, three matmuls, index_add_)."""
    import torch
    from triton.testing import do_bench

    from engine.model.model import swiglu_expert
    from engine.runtime.token_groups import token_groups
    from kernels.formats import dequantize_block, make_offsets, random_bank
    from kernels.moe_prefill import PrefillConfig as C, PrefillKernel, moe_prefill_ref
    from kernels.selfcheck import rel_error
    (inter, hidden, top_k), num_experts = PREFILL_SHAPES[model]
    offsets, block_bytes = make_offsets(fmt, inter, hidden)
    gen = torch.Generator().manual_seed(3)
    bank = random_bank(num_experts, block_bytes, fmt, offsets, inter, hidden, device="cuda", generator=gen)
    x = torch.randn(num_tokens, hidden, generator=gen).to("cuda", torch.bfloat16)
    slots = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(num_tokens)]).cuda()
    weights = torch.rand(num_tokens, top_k, generator=gen).cuda()
    routed, routed_dev = slots.flatten().tolist(), slots.flatten()
    experts = sorted(set(routed))
    ref = moe_prefill_ref(x, bank, slots, weights, fmt, offsets, inter)
    out = torch.zeros(num_tokens, hidden, device="cuda")
    rows = []
    for cfg in (C(), C(64, 64, 64, 4), C(32, 64, 64, 4), C(32, 64, 64, 8), C(64, 128, 64, 8), C(128, 64, 64, 8),
                C(64, 64, 128, 8), C(64, 64, 64, 8, 2), C(64, 64, 64, 8, 4), C(16, 64, 128, 4)):
        kernel = PrefillKernel(cfg)
        routing = kernel.route(routed, routed_dev, experts, top_k)
        call = lambda: kernel(x, bank, routing, {e: e for e in experts}, weights, fmt, offsets, inter,  # noqa: E731
                              out.zero_())
        try:
            err = rel_error(call(), ref)
            t_kernel = do_bench(call, return_mode="median") * 1e-3
            t_route = do_bench(lambda: kernel.route(routed, routed_dev, experts, top_k), return_mode="median") * 1e-3
        except Exception as exc:          # noqa: BLE001 - a config the GPU refuses: report it, try the next
            print(f"prefill kernel {fmt} {model} {cfg}: FAILED {type(exc).__name__}: {str(exc)[:200]}")
            continue
        rows.append({"config": cfg.__dict__, "rel_err": err, "kernel_us": t_kernel * 1e6, "route_us": t_route * 1e6})
        print(f"prefill kernel {fmt} {model} {cfg}: {t_kernel * 1e6:8.1f} us a layer (+ routing {t_route * 1e6:6.1f} us), "
              f"err {err:.1e}", flush=True)

    def torch_path():
        groups = token_groups(routed, routed_dev, top_k)
        out.zero_()
        for expert in experts:
            token_idx, k_idx = groups[expert]
            w = dequantize_block(bank[expert], fmt, offsets, inter, hidden, torch.bfloat16)
            y = swiglu_expert(x[token_idx], w)
            out.index_add_(0, token_idx, (y * weights[token_idx, k_idx, None]).float())
    t_torch = do_bench(torch_path, return_mode="median") * 1e-3
    best = min(rows, key=lambda r: r["kernel_us"]) if rows else None
    RESULTS.setdefault("prefill_kernel", {}).setdefault(model, {})[fmt] = {"configs": rows, "torch_path_us": t_torch * 1e6}
    SUMMARY.append(f"prefill kernel {fmt}, {model} layer of {num_tokens} tokens: torch path {t_torch * 1e6:.0f} us, "
                   + (f"best kernel {best['kernel_us']:.0f} us + routing {best['route_us']:.0f} us ({best['config']})"
                      if best else "no kernel config ran"))
    save()


def stage_tests(paths=("tests/kernels", "tests/streaming"), extra=("-k", "not bench"), timeout=None):
    """pytest on the GPU; `timeout` (s): pytest's own children are stopped with it, and the stage records
    what it printed so far (-x stops at the first failure either way)."""
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", *paths, "-q", "-p", "no:cacheprovider", *extra]
    if timeout:
        cmd = ["timeout", str(timeout), *cmd]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    with open(OUT / "pytest.txt", "a") as log:        # one file for every test stage ($OUT brings back 8 files)
        log.write(f"===== {' '.join(paths)} {' '.join(extra)}\n" + proc.stdout[-200000:] + "\n" + proc.stderr[-20000:])
    tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
    RESULTS.setdefault("tests", {})[" ".join(paths + extra)] = {
        "rc": proc.returncode, "tail": tail, "stderr": proc.stderr[-2000:], "seconds": time.perf_counter() - start}
    print(f"pytest {' '.join(paths)} on GPU: rc {proc.returncode} in {time.perf_counter() - start:.0f} s")
    print(tail)
    SUMMARY.append(f"pytest {' '.join(paths + extra)}: rc {proc.returncode}; {tail.splitlines()[-1] if tail else ''}")
    save()


def stage_logits():
    """bf16 compute vs float32 compute on the GPU (same model, same path): logits of a decode run."""
    import tempfile

    import torch

    import engine
    from engine.tools.demo import build_hf_model
    from engine.format.repack import repack
    rows = []
    for family in ("qwen3_moe", "mixtral", "olmoe", "qwen2_moe"):
        tmp = Path(tempfile.mkdtemp())
        build_hf_model(family, tmp / "hf", num_layers=3, with_tokenizer=False, seed=5)
        repack(tmp / "hf", tmp / "sl", quant="bf16")
        logits, tokens, prompt = {}, None, list(range(3, 40, 3))
        for dtype in ("float32", "bfloat16"):        # the same tokens fed to both (fp32's greedy run)
            eng = engine.load(tmp / "sl", device="cuda", dtype=dtype, max_context=64)
            with torch.inference_mode():
                first = eng.runner.prefill(prompt)
                tokens = tokens or [int(first.argmax())] + [3, 11, 29]
                logits[dtype] = torch.stack([eng.runner.decode(tok, len(prompt) + i).clone()
                                             for i, tok in enumerate(tokens)])
            eng.close()
        a, b = logits["float32"].double(), logits["bfloat16"].double()
        rel = ((a - b).norm() / a.norm()).item()
        hf = _hf_bf16_error(tmp / "hf", prompt + tokens)
        rows.append({"family": family, "rel_err_bf16_vs_fp32": rel, "transformers_bf16_vs_fp32": hf})
        print(f"logits {family:10s} bf16 vs fp32 rel err: sluice {rel:.2e}, transformers itself {hf:.2e}")
    RESULTS["logits"] = rows
    save()


def _hf_bf16_error(hf_dir, ids):
    """The yardstick: transformers' own bf16-vs-fp32 logits error on the same tokens (last 4)."""
    import torch
    from transformers import AutoModelForCausalLM
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype).cuda()
        with torch.inference_mode():
            out[dtype] = model(torch.tensor([ids], device="cuda")).logits[0, -4:].double()
    a, b = out[torch.float32], out[torch.bfloat16]
    return ((a - b).norm() / a.norm()).item()


def _sampled(max_new_tokens: int):
    from engine import GenerationParams
    return GenerationParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=0, ignore_eos=True)


def stage_profile_stream(quant="fp8", budgets=("4GB",)):
    """Where a decode token's time goes while experts stream (OLMoE, 4 GB VRAM, RAM unconstrained),
    through Engine.generate: telemetry per token and cProfile (host). More budgets (e.g. one that holds
    every expert) are timed the same way first, without the profile."""
    for budget in budgets[1:]:
        _profile_stream(quant, budget, profile=False)
    _profile_stream(quant, budgets[0], profile=True)


def _profile_stream(quant: str, budget: str, profile: bool):
    import cProfile
    import io
    import pstats
    import random

    import engine
    from engine.runtime.telemetry import delta
    from engine.tools.bench import _timed_generate
    from engine.tools.presets import write_sluice_dir
    path = write_sluice_dir("olmoe-1b-7b", WORK / f"olmoe-1b-7b-{quant}", quant)
    eng = engine.load(path, device="cuda", vram_budget=budget, ram_cache="16GB", max_context=1024)
    rng = random.Random(0)
    prompt = [rng.randrange(50000) for _ in range(512)]
    _timed_generate(eng, prompt, _sampled(96))                         # fill RAM and banks
    t = _timed_generate(eng, prompt[:64], _sampled(64))
    before, after = t.after_prefill, eng.telemetry()                 # decode only
    ms = t.decode_s / 63 * 1e3
    print(f"{quant}, VRAM budget {budget}: decode {ms:.2f} ms/token ({1e3 / ms:.1f} tok/s); slots/bank {eng.plan.slots_per_bank}, "
          f"RAM slots {eng.runner.cache.num_slots}")
    d = lambda *path: delta(after, before, *path)                 # noqa: E731 - per-run deltas
    print(f"  per token: VRAM hits {d('vram', 'hits') / 63:.1f} misses {d('vram', 'misses') / 63:.1f}, "
          f"RAM hits {d('ram_cache', 'hits') / 63:.1f}, h2d {d('h2d', 'bytes') / 63 / 1e6:.0f} MB, "
          f"d2h {d('d2h', 'bytes') / 63 / 1e6:.0f} MB, disk {d('disk', 'bytes_read') / 63 / 1e6:.0f} MB, "
          f"recall {d('speculation', 'correct') / max(d('speculation', 'predicted'), 1):.2f}, "
          f"prefetch used {d('prefetch', 'used')}/{d('prefetch', 'issued')}, "
          f"CPU experts {d('cpu', 'experts') / 63:.1f} ({d('cpu', 'busy_s') / 63 * 1e3:.2f} ms)")
    RESULTS.setdefault("profile_stream", {})[f"{quant}-{budget}"] = {"ms_per_token": ms}
    if not profile:
        eng.close()
        return
    prof = cProfile.Profile()
    prof.enable()
    _timed_generate(eng, prompt[:64], _sampled(32))
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(25)
    print("\n".join(line for line in text.getvalue().splitlines()[6:] if line.strip()))
    eng.close()
    save()


def stage_gpu_timeline(budgets=("4GB", "40GB"), tokens=48):
    """What the GPU runs in a decode token (torch.profiler's CUDA activity): kernels and copies per token
    by total time, and the GPU's busy time against the token's wall time, OLMoE int8 (int8 dense), RAM free."""
    import random

    import engine
    from torch.profiler import ProfilerActivity, profile

    from engine.tools.bench import _timed_generate
    from engine.tools.presets import write_sluice_dir
    path = write_sluice_dir("olmoe-1b-7b", WORK / "olmoe-1b-7b-int8", "int8")
    for budget in budgets:
        eng = engine.load(path, device="cuda", vram_budget=budget, ram_cache="16GB", max_context=1024,
                          dense_quant="int8")
        rng = random.Random(0)
        prompt = [rng.randrange(50000) for _ in range(512)]
        _timed_generate(eng, prompt, _sampled(96))                     # fill RAM and banks
        _timed_generate(eng, prompt[:8], _sampled(tokens))            # warm
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t = _timed_generate(eng, prompt[:8], _sampled(tokens))
        n = t.new_tokens
        rows = [(e.key, e.count, e.self_device_time_total) for e in prof.key_averages() if e.self_device_time_total > 0]
        busy = sum(r[2] for r in rows) / n
        wall = (t.prefill_s + t.decode_s) / n * 1e6
        print(f"--- GPU timeline, VRAM budget {budget}: {n} tokens (8-token prompt), wall {wall:.0f} us a token, "
              f"GPU kernels + copies {busy:.0f} us a token ({busy / wall:.0%}), decode {t.decode_s / (n - 1) * 1e3:.2f} ms/token")
        for key, count, total in sorted(rows, key=lambda r: -r[2])[:22]:
            print(f"  {total / n:8.1f} us/token  {count / n:6.1f}/token  {key[:110]}")
        print(f"  kernels + copies a token: {sum(r[1] for r in rows) / n:.0f}")
        eng.close()


def stage_trace(budget="4GB", tokens=8):
    """A few decode tokens through Engine.generate under torch.profiler (CPU and CUDA activity), OLMoE int8 (int8
    dense), RAM free, each generation its own random prompt (a repeated one routes alike and hits more): the Chrome
    trace, gzipped into $OUT, for scripts/trace_summary.py (host syncs, copies issued and run, idle gaps)."""
    import gzip
    import random
    import shutil

    import engine
    from torch.profiler import ProfilerActivity, profile

    from engine.tools.bench import _timed_generate
    from engine.tools.presets import write_sluice_dir
    path = write_sluice_dir("olmoe-1b-7b", WORK / "olmoe-1b-7b-int8", "int8")
    eng = engine.load(path, device="cuda", vram_budget=budget, ram_cache="16GB", max_context=1024, dense_quant="int8")
    rng = random.Random(1)
    prompt = lambda n: [rng.randrange(50000) for _ in range(n)]          # noqa: E731
    _timed_generate(eng, prompt(512), _sampled(96))                     # fill RAM and banks
    _timed_generate(eng, prompt(16), _sampled(64))                      # warm
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = _timed_generate(eng, prompt(8), _sampled(tokens))
    print(f"--- trace, VRAM budget {budget}: {t.new_tokens} tokens, decode {t.decode_s / max(1, t.new_tokens - 1) * 1e3:.2f} "
          f"ms/token under the profiler")
    raw = WORK / f"trace-{budget}.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(OUT / f"trace-{budget}.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    eng.close()


def stage_profile_decode(budgets=("4GB", "40GB"), tokens=256, phase="decode"):
    """The decode thread sampled by py-spy (no tracing overhead) while decoding through Engine.generate,
    OLMoE int8 with RAM free: at a 4 GB VRAM budget (streaming) and at 40 GB (every expert resident).
    phase "prefill": warm prefills of `tokens` tokens instead (scripts/profile_decode.py)."""
    import shutil

    from engine.tools.presets import write_sluice_dir
    path = write_sluice_dir("olmoe-1b-7b", WORK / "olmoe-1b-7b-int8", "int8")
    spy = shutil.which("py-spy") or "/tmp/site/bin/py-spy"
    for budget in budgets:
        raw = WORK / f"{phase}-{budget}.raw"
        env = {**os.environ, "PROFILE_PHASE": phase}
        proc = subprocess.run([spy, "record", "--nonblocking", "-r", "1000", "-f", "raw", "-o", str(raw), "--",
                               sys.executable, "scripts/profile_decode.py", "run", str(path), budget, str(tokens)],
                              cwd=ROOT, capture_output=True, text=True, env=env)
        print(f"--- {phase} profile, VRAM budget {budget}:\n{proc.stdout[-800:]}{proc.stderr[-1500:] if proc.returncode else ''}")
        text = subprocess.run([sys.executable, "scripts/profile_decode.py", "summary", str(raw)], cwd=ROOT,
                              capture_output=True, text=True, env=env)
        print(text.stdout[-6000:] + text.stderr[-2000:])
        with open(OUT / "profile.txt", "a") as log:
            log.write(f"===== {budget}\n{proc.stdout}\n{text.stdout}\n")
        if raw.exists():                        # the decode's stacks, gzipped, for a look by line afterwards
            import gzip
            with open(raw) as src, gzip.open(OUT / f"{raw.name}.gz", "wt") as dst:
                dst.writelines(line for line in src if "Runner." in line)


def bench(name, argv, cgroup_bytes=None, env=None):
    """Run `sluice bench` (as a child, optionally inside a cgroup v2 memory cap incl. page cache;
    `env`: extra environment, e.g. SLUICE_CPU_EXPERTS for an A/B of hybrid execution)."""
    from engine.tools.cgroup import CgroupUnavailable, MemoryCap
    cmd = [sys.executable, "-m", "engine.tools.cli", "bench", *argv, "--json", "--work-dir", str(WORK)]
    cap = None
    if cgroup_bytes:
        try:
            cap = MemoryCap.create(f"sluice-{name}", cgroup_bytes)
        except CgroupUnavailable as exc:
            print(f"  cgroup cap unavailable: {exc}")
            RESULTS.setdefault("bench", {})[name] = {"error": f"cgroup: {exc}"}
            return
        cmd = cap.command(cmd)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})})
    with open(OUT / "bench.log", "a") as log:          # one file for every bench ($OUT brings back 8 files)
        log.write(f"===== {name}\n{proc.stderr[-20000:]}\n")
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        result = {"error": f"rc {proc.returncode}", "stderr": proc.stderr[-3000:]}
        print(f"bench {name}: FAILED rc {proc.returncode}\n{proc.stderr[-3000:]}")
    else:
        from engine.tools.bench import report
        print(f"--- bench {name} ({time.perf_counter() - start:.0f} s): sluice bench {' '.join(argv)}"
              + (f"  [cgroup memory.max {cgroup_bytes >> 20} MiB]" if cgroup_bytes else ""))
        print(report(result))
        per_tok = result.get("decode_bytes_per_token", {})
        SUMMARY.append(f"bench {name}: decode {result['decode_tok_s']:.2f} tok/s, disk {per_tok.get('disk', 0) / 1e9:.2f} "
                       f"GB/token, prefill {result['prefill_tok_s']:.0f} tok/s cold, warm "
                       f"{result.get('warm_prefill_tok_s', float('nan')):.0f}")
    result["argv"], result["cgroup_bytes"], result["env"] = argv, cgroup_bytes, env
    if cap is not None and cap.peak_bytes() is not None:
        result["cgroup_peak_bytes"] = cap.peak_bytes()
        print(f"  cgroup memory.peak {result['cgroup_peak_bytes'] / 2**30:.2f} GiB of {cgroup_bytes / 2**30:.2f} GiB")
    RESULTS.setdefault("bench", {})[name] = result
    save()


DISK_AB = [(0, "fits-ram", None)] + [(i, regime, reads) for i in (1, 2) for regime in ("exceeds", "fits-vram-ram")
                                     for reads in (None, "8")]
READS_AB = [("whole", {}), ("early", {"SLUICE_EARLY_READS": "1"}), ("pieces4", {"SLUICE_READ_PIECES": "4"}),
            ("early-pieces4", {"SLUICE_EARLY_READS": "1", "SLUICE_READ_PIECES": "4"})]
HYBRID_QUANTS = os.environ.get("HYBRID_QUANTS", "bf16").split(",")

def cap_ab(runs):
    """fits-vram-ram benches (OLMoE dims, int8 experts and dense weights, 4 GiB cap), one per (tag, env, tokens)."""
    for tag, env, tokens in runs:
        bench(f"olmoe-int8-fits-vram-ram-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", "fits-vram-ram",
                                                  "--prompt-tokens", "512", "--new-tokens", str(tokens), "--dense-quant",
                                                  "int8"], env=env)


PIECES = {"SLUICE_NORM_KERNEL": "1", "SLUICE_ATTN_KERNEL": "1"}
PIECES_OFF = {"SLUICE_NORM_KERNEL": "0", "SLUICE_ATTN_KERNEL": "0"}
COPIES8 = {"SLUICE_PREFETCH_COPIES": "8"}


def probe_ops(cold: bool, env: str = "", rows: int = 40) -> None:
    """scripts/probe_op_memory.py on the bench's OLMoE-dims int8 model (written first if missing): a cold run
    (filling the verdict and Triton caches) when asked, then the warm one every later start pays. `env`:
    assignments put before each run (e.g. "SLUICE_CUBLAS_FREE=1")."""
    probe = f"{env} {sys.executable} scripts/probe_op_memory.py {WORK}/olmoe-1b-7b-int8 cuda"
    print(subprocess.run(
        f"{sys.executable} -c \"from engine.tools.presets import write_sluice_dir; from pathlib import Path; "
        f"write_sluice_dir('olmoe-1b-7b', Path('{WORK}') / 'olmoe-1b-7b-int8', 'int8')\" && "
        + (f"{probe} 30 > {OUT}/probe-op-memory-cold.txt 2>&1; " if cold else "")
        + f"{probe} {rows} 2>&1 | tee {OUT}/probe-op-memory.txt", shell=True, cwd=ROOT, capture_output=True,
        text=True).stdout[-6000:])


STAGES = {
    "kernels": stage_kernels,
    "kernels-fp8": lambda: stage_kernels(fmts=("fp8",)),
    # int8 (int8 weights, bf16 row scales: what the CPU computes fast) beside fp8, both swept the same way
    "kernels-int8": lambda: stage_kernels(fmts=("int8", "fp8")),
    "tests-int8": lambda: stage_tests(("tests/kernels", "tests/families/test_families_gpu.py"), ("-k", "int8")),
    # mxfp4 at gpt-oss-120b's expert shapes (its native format), beside nvfp4 / bf16 at the same shapes
    "kernels-mxfp4": lambda: stage_kernels(models=("gpt-oss-120b",), fmts=("mxfp4", "nvfp4", "bf16")),
    "tests": stage_tests,
    "kernels-dense": stage_kernels_dense,
    "tests-dense": lambda: stage_tests(("tests/kernels/test_int8_linear.py", "tests/streaming/test_dense_int8.py",
                                        "tests/streaming/test_pieces.py"), ()),
    # the read-ahead variants on the GPU's copy stream and kernels: tokens still transformers', reads early / unused
    "tests-reads": lambda: stage_tests(("tests/streaming/test_runtime_equality.py", "tests/streaming/test_unused_reads.py",
                                        "tests/streaming/test_pieces.py"), ("-k", "early or unused or wrong or full or piece")),
    # dense weights as stored (bf16) against int8, alternated after a warm-up, then the other two regimes with int8
    # (exceeds at the regime's own 2 GB: the bf16 dense weights did not fit it beside the CUDA context)
    "dense-ab": lambda: [
        bench(f"olmoe-int8-{regime}-dense-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", regime,
                                                   "--prompt-tokens", "512", "--new-tokens", str(tokens)]
              + (["--dense-quant", "int8"] if tag.startswith("int8") else []) + extra)
        for regime, tag, tokens, extra in (
            ("fits-ram", "warmup", 16, []), ("fits-ram", "bf16-1", 128, []), ("fits-ram", "int8-1", 128, []),
            ("fits-ram", "bf16-2", 128, []), ("fits-ram", "int8-2", 128, []),
            ("exceeds", "int8", 32, ["--vram-budget", "2.5GB"]), ("exceeds", "int8-2GB", 32, []),
            ("fits-vram-ram", "int8", 64, []))],
    "tests-families": lambda: stage_tests(("tests/families",), ("-m", "gpu")),
    "prefill-kernel": stage_prefill_kernel,
    # warm prefill (fits-ram, int8 experts and dense weights) through the torch path's per-expert loop against the
    # grouped-GEMM kernel (SLUICE_PREFILL_KERNEL=1), alternated after a warm-up
    "prefill-ab": lambda: [
        bench(f"olmoe-int8-fits-ram-prefill-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", "fits-ram",
                                                     "--prompt-tokens", "512", "--new-tokens", "16", "--dense-quant", "int8"],
              env={"SLUICE_PREFILL_KERNEL": "1"} if tag.startswith("kernel") else {})
        for tag in ("warmup", "torch-1", "kernel-1", "torch-2", "kernel-2")],
    "logits": stage_logits,
    "profile-stream": stage_profile_stream,
    "profile-decode": stage_profile_decode,
    # what each host call of a streaming decode layer costs (scripts/probe_host_calls.py), then py-spy at 4 GB
    "host-calls": lambda: [subprocess.run([sys.executable, "scripts/probe_host_calls.py"], cwd=ROOT),
                           stage_profile_decode(budgets=("4GB",))],
    "profile-4GB": lambda: stage_profile_decode(budgets=("4GB",)),
    "gpu-timeline": stage_gpu_timeline,
    "trace": stage_trace,
    # warm prefills of 512 tokens sampled the same way (host-busy share against wall time: where prefill goes)
    "profile-prefill": lambda: stage_profile_decode(budgets=("3.7GB",), tokens=512, phase="prefill"),
    # int8 streaming at 4 GB against every expert resident (40 GB): the decode's floor without streaming
    "profile-int8": lambda: stage_profile_stream("int8", ("4GB", "40GB")),
    # gpt-oss-120b's dims (12 of 36 layers), its native mxfp4: 20 GB of experts, VRAM budget below them
    "bench-gpt-oss": lambda: [
        bench("gpt-oss-mxfp4-12g-8g", ["--preset", "gpt-oss-120b", "--quant", "mxfp4", "--vram-budget", "12GB",
                                       "--ram-cache", "8GB", "--prompt-tokens", "1024", "--new-tokens", "64"])],
    "bench-deepseek": lambda: [
        bench("deepseek-v2-lite-fp8-6g-8g", ["--preset", "deepseek-v2-lite", "--quant", "fp8", "--vram-budget", "6GB",
                                             "--ram-cache", "8GB", "--prompt-tokens", "512", "--new-tokens", "64"]),
        bench("deepseek-v4-flash-4l-nvfp4-8g-8g", ["--preset", "deepseek-v4-flash-4l", "--quant", "nvfp4", "--vram-budget",
                                                   "8GB", "--ram-cache", "8GB", "--prompt-tokens", "256", "--new-tokens", "32"])],
    "bench-olmoe": lambda: [
        bench("olmoe-fp8-4g-2g", ["--preset", "olmoe-1b-7b", "--quant", "fp8", "--vram-budget", "4GiB",
                                  "--ram-cache", "2GiB", "--prompt-tokens", "2048", "--new-tokens", "64"]),
        bench("olmoe-fp8-ram-unconstrained", ["--preset", "olmoe-1b-7b", "--quant", "fp8", "--vram-budget", "4GB",
                                              "--ram-cache", "16GB", "--prompt-tokens", "512", "--new-tokens", "128"]),
        bench("olmoe-fp8-cap4g", ["--preset", "olmoe-1b-7b", "--quant", "fp8", "--vram-budget", "4GB",
                                  "--ram-cache", "1536MiB", "--prompt-tokens", "512", "--new-tokens", "64"],
              cgroup_bytes=4 << 30)],
    "bench-olmoe-cap": lambda: [
        bench(f"olmoe-fp8-cap4g-ram{ram}", ["--preset", "olmoe-1b-7b", "--quant", "fp8", "--vram-budget", "4GB",
                                            "--ram-cache", ram, "--prompt-tokens", "512", "--new-tokens", "64"],
              cgroup_bytes=4 << 30) for ram in ("1536MiB", "2GiB", "2560MiB")],
    "bench-olmoe-cap2g": lambda: bench("olmoe-fp8-cap4g-ram2GiB", [
        "--preset", "olmoe-1b-7b", "--quant", "fp8", "--vram-budget", "4GB", "--ram-cache", "2GiB",
        "--prompt-tokens", "512", "--new-tokens", "64"], cgroup_bytes=4 << 30),
    "tests-hybrid": lambda: stage_tests(("tests/streaming",), ("-k", "hybrid or greedy or placement or embedding")),
    # the embedding table in host RAM (SLUICE_EMBED_IN_RAM=1) against on the device: VRAM for slots vs a row copy
    "embed-ab": lambda: [
        bench(f"olmoe-int8-fits-ram-embed-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", "fits-ram",
                                                   "--prompt-tokens", "512", "--new-tokens", "128"], env=env)
        for tag, env in (("device", {}), ("ram", {"SLUICE_EMBED_IN_RAM": "1"}))],
    # hybrid execution A/B: the same run with the CPU's share off and with the cost model deciding
    "hybrid-ab": lambda: [
        bench(f"olmoe-{q}-free-cpu-{mode}", ["--preset", "olmoe-1b-7b", "--quant", q, "--vram-budget", "4GB",
                                             "--ram-cache", "16GB", "--prompt-tokens", "512", "--new-tokens", "128"],
              env={"SLUICE_CPU_EXPERTS": mode}) for q in HYBRID_QUANTS for mode in ("off", "auto")],
    "bench-olmoe-int8": lambda: [
        bench(f"olmoe-{quant}-ram-unconstrained", ["--preset", "olmoe-1b-7b", "--quant", quant, "--vram-budget", "4GB",
                                                   "--ram-cache", "16GB", "--prompt-tokens", "512", "--new-tokens", "128"])
        for quant in ("int8", "fp8")],
    # the three memory regimes of the hybrid issue (sluice bench --regime: cgroup cap + budgets), int8 experts and
    # int8 dense weights (as llama.cpp's Q8_0), after a warm-up; exceeds at its own 2 GB and at 2.5 GB
    "regimes": lambda: [
        bench(f"olmoe-int8-{regime}-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", regime,
                                             "--prompt-tokens", "512", "--new-tokens", str(tokens),
                                             "--dense-quant", "int8"] + extra)
        for regime, tokens, tag, extra in (
            ("fits-ram", 16, "warmup", []),      # the first bench on a fresh machine also writes the model: discard
            ("fits-ram", 128, "int8-dense", []), ("fits-vram-ram", 64, "int8-dense", []),
            ("exceeds", 32, "int8-dense", []), ("exceeds", 32, "int8-dense-2.5GB", ["--vram-budget", "2.5GB"]))],
    # fits-ram alone (after llama.cpp's fits-ram run in the same call): a warm-up, then the measured run
    "regimes-fits-ram": lambda: [
        bench(f"olmoe-int8-fits-ram-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", "fits-ram",
                                             "--prompt-tokens", "512", "--new-tokens", str(tokens), "--dense-quant", "int8"])
        for tag, tokens in (("warmup", 16), ("int8-dense", 128), ("int8-dense-2", 128))],
    # fits-vram-ram with the RAM cache the engine now sizes under the cap itself (session 10: ~2.85 GiB), at the
    # regime's VRAM and at llama.cpp's -ncmoe 9 VRAM (after `scripts/peer/llamacpp.py bench --regime fits-vram-ram`)
    "regimes-fits-vram-ram": lambda: [
        bench(f"olmoe-int8-fits-vram-ram-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", "fits-vram-ram",
                                                  "--prompt-tokens", "512", "--new-tokens", "64", "--dense-quant", "int8"]
              + extra)
        for tag, extra in (("warmup", ["--new-tokens", "8"]), ("3.73GiB", []), ("4.1GiB", ["--vram-budget", "4.1GiB"]))],
    # Sluice beside the peer's run in the same machine (after `scripts/peer/llamacpp.py all --regime fits-vram-ram
    # fits-ram --ncmoe 9 10`): both capped-RAM points and both RAM-free points, at the regime's VRAM and at -ncmoe 9's
    "beside-peer": lambda: [
        bench(f"olmoe-int8-{regime}-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", regime,
                                             "--prompt-tokens", "512", "--new-tokens", str(tokens), "--dense-quant",
                                             "int8"] + extra)
        for regime, tag, tokens, extra in (("fits-vram-ram", "warmup", 8, []), ("fits-vram-ram", "3.73GiB", 64, []),
                                           ("fits-vram-ram", "4.1GiB", 64, ["--vram-budget", "4.1GiB"]),
                                           ("fits-ram", "3.73GiB", 128, []),
                                           ("fits-ram", "4.1GiB", 128, ["--vram-budget", "4.1GiB"]))],
    # under the 4 GiB cap: what the RAM cache leaves beside the process (192 MiB, the default, against 384), and the
    # embedding table loaded (SLUICE_EMBED_IN_RAM=0), alternated after a warm-up: warm prefill fell 2x in session 12
    "reserve-ab": lambda: cap_ab((("warmup", {}, 8), ("reserve-192-1", {}, 64),
                                  ("reserve-384-1", {"SLUICE_RAM_RESERVE_MIB": "384"}, 64),
                                  ("table-loaded", {"SLUICE_EMBED_IN_RAM": "0"}, 64), ("reserve-192-2", {}, 64),
                                  ("reserve-384-2", {"SLUICE_RAM_RESERVE_MIB": "384"}, 64),
                                  ("reserve-576", {"SLUICE_RAM_RESERVE_MIB": "576"}, 64))),
    # the table in the file, read at random with a prompt's pages asked for together (now), against the table loaded
    # (SLUICE_EMBED_IN_RAM=0), under the 4 GiB cap, alternated after a warm-up
    "table-ab": lambda: cap_ab((("warmup", {}, 8), ("table-file-1", {}, 64),
                                ("table-loaded-1", {"SLUICE_EMBED_IN_RAM": "0"}, 64), ("table-file-2", {}, 64),
                                ("table-loaded-2", {"SLUICE_EMBED_IN_RAM": "0"}, 64))),
    # a fresh machine's first start under the cap (Triton and verdict caches cold: the kernel warm-up child runs),
    # then later starts: fits-vram-ram, fits-ram, exceeds at 2.5 GB (the model is written by the first bench)
    "first-start": lambda: [
        bench(f"olmoe-int8-{regime}-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", regime,
                                             "--prompt-tokens", "512", "--new-tokens", str(tokens), "--dense-quant",
                                             "int8"] + extra)
        for regime, tag, tokens, extra in (("fits-vram-ram", "first-start", 64, []), ("fits-vram-ram", "later", 64, []),
                                           ("fits-ram", "later", 128, []),
                                           ("exceeds", "later-2.5GB", 32, ["--vram-budget", "2.5GB"]))],
    # the cuBLAS-free path (the default since run 56) against SLUICE_CUBLAS_FREE=0: the caches warmed with it (a
    # short bench: its kernel warm-up child), the operators probed with it, then one bench each way
    "cublas-free-ab2": lambda: [
        cap_ab((("warmup-free", {"SLUICE_CUBLAS_FREE": "1"}, 8),)),
        probe_ops(cold=False, env="SLUICE_CUBLAS_FREE=1"),
        cap_ab((("cublas-1", {"SLUICE_CUBLAS_FREE": "0"}, 64), ("cublas-free-1", {"SLUICE_CUBLAS_FREE": "1"}, 64)))],
    # session 13's defaults (cuBLAS-free; top-k sampling's candidates kernel): their GPU tests (token-exact for the
    # 13 families with int8 dense weights, the warm-up child), the operator probe (a reply sampled with the app's
    # defaults), then the three regimes for the README
    "defaults-13": lambda: [
        stage_tests(("tests/kernels/test_top_candidates.py", "tests/engine/test_kernel_warmup.py",
                     "tests/streaming/test_dense_int8.py"), ("-x",), timeout=200),
        probe_ops(cold=False),
        [bench(f"olmoe-int8-{regime}-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", regime,
                                              "--prompt-tokens", "512", "--new-tokens", str(tokens), "--dense-quant",
                                              "int8"] + extra)
         for regime, tag, tokens, extra in (("fits-vram-ram", "3.73GiB", 64, []),
                                            ("fits-vram-ram", "4.1GiB", 64, ["--vram-budget", "4.1GiB"]),
                                            ("fits-ram", "default", 128, []),
                                            ("exceeds", "2.5GB", 32, ["--vram-budget", "2.5GB"]))]],
    # what an app user's reply runs: the decode sampled with the app's top-k / top-p (the host finishes the draw),
    # against the bench's plain temperature-1 sampling, under the 4 GiB cap
    "app-sampling": lambda: cap_ab((("warmup", {}, 8),)) or [
        bench(f"olmoe-int8-fits-vram-ram-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime",
                                                  "fits-vram-ram", "--prompt-tokens", "512", "--new-tokens", "64",
                                                  "--dense-quant", "int8"] + extra)
        for tag, extra in (("plain-1", []), ("app-sampling-1", ["--top-k", "40", "--top-p", "0.95"]),
                           ("plain-2", []), ("app-sampling-2", ["--top-k", "40", "--top-p", "0.95"]))],
    # SLUICE_NORM_KERNEL=1 / SLUICE_ATTN_KERNEL=1 (RMS norms / one-token attention in Triton: no rsqrt, mean or
    # masked-SDPA CUDA modules): their GPU tests (token-exact, 13 families), the operator probe with both, then
    # fits-vram-ram off / on alternated after a warm-up
    "pieces-ab": lambda: [
        stage_tests(("tests/kernels/test_rms_norm.py", "tests/kernels/test_decode_attention.py",
                     "tests/streaming/test_dense_int8.py"), ("-k", "norm or attention or piece"), timeout=240),
        cap_ab((("warmup-pieces", PIECES, 8),)),
        probe_ops(cold=False, env="SLUICE_NORM_KERNEL=1 SLUICE_ATTN_KERNEL=1"),
        cap_ab((("pieces-off-1", PIECES_OFF, 64), ("pieces-on-1", PIECES, 64), ("pieces-off-2", PIECES_OFF, 64),
                ("pieces-on-2", PIECES, 64)))],
    # session 14: pieces-ab, the dsv4 flash tests (FP8 reference read dequantised), then fits-ram's floor (every
    # expert resident) and copies ahead for all 8 guesses against the better half (the default), alternated
    "session-14": lambda: [
        STAGES["pieces-ab"](),
        stage_tests(("tests/families/test_dsv4_engine.py",), ("-k", "flash"), timeout=90),
        [bench(f"olmoe-int8-fits-ram-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", "fits-ram",
                                              "--prompt-tokens", "512", "--new-tokens", "128", "--dense-quant", "int8"]
               + extra, env=env)
         for tag, extra, env in (("floor-40GB", ["--vram-budget", "40GB"], {}), ("copies8-1", [], COPIES8),
                                 ("default-1", [], {}), ("copies8-2", [], COPIES8), ("default-2", [], {}))]],
    # a decode step's prefetch issued behind the next layer's mixer (the default) against right after the layer's
    # launches (SLUICE_DEFER_PREFETCH=0): the GPU tests with this session's defaults (pieces on), then fits-ram
    # alternated after a warm-up, then fits-vram-ram once each way
    "defer-ab": lambda: [
        stage_tests(("tests/streaming/test_runtime_equality.py", "tests/streaming/test_dense_int8.py"), ("-x",),
                    timeout=150),
        [bench(f"olmoe-int8-{regime}-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", regime,
                                              "--prompt-tokens", "512", "--new-tokens", str(tokens), "--dense-quant",
                                              "int8"], env={"SLUICE_DEFER_PREFETCH": "0"} if "off" in tag else {})
         for regime, tag, tokens in (("fits-ram", "warmup", 16), ("fits-ram", "defer-on-1", 128),
                                     ("fits-ram", "defer-off-1", 128), ("fits-ram", "defer-on-2", 128),
                                     ("fits-ram", "defer-off-2", 128), ("fits-vram-ram", "defer-on", 64),
                                     ("fits-vram-ram", "defer-off", 64))]],
    # session 15's leftovers in one call: the gpt_oss / DSV4 engine tests on CUDA (not run since session 10), what
    # the GPU runs in a decode token now (rope once a step, the router split), the app's sampling with the warm
    # prefill drawing as the run does (run 69 timed torch's sampling modules loading there)
    "session-16": lambda: [STAGES["tests-activations-families"](), stage_gpu_timeline(budgets=("40GB",)),
                           STAGES["app-sampling"](), STAGES["fused-cpu-ab"]()],
    # a step's queries and keys rotated in one launch (kernels/rope.py, session 17; SLUICE_ROPE_KERNEL=0: torch's
    # ten): its GPU tests and every family token-exact with it on, what the GPU runs in a token (launches, busy
    # time), then fits-ram and its floor (every expert resident) off / on alternated after a warm-up
    "rope-ab": lambda: [
        stage_tests(("tests/kernels/test_rope.py", "tests/streaming/test_dense_int8.py",
                     "tests/streaming/test_runtime_equality.py"), ("-x",), timeout=300),
        stage_gpu_timeline(budgets=("40GB", "4GB")),
        [bench(f"olmoe-int8-fits-ram-rope-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", "fits-ram",
                                                   "--prompt-tokens", "512", "--new-tokens", "128", "--dense-quant", "int8"]
               + (["--vram-budget", "40GB"] if "floor" in tag else []),
               env={"SLUICE_ROPE_KERNEL": "0"} if "off" in tag else {})
         for tag in ("warmup", "off-1", "on-1", "floor-off", "floor-on", "off-2", "on-2")]],
    # the CPU's share on where its expert at load beats a copy (SLUICE_CPU_LIVE_FACTOR=1; the default 3 keeps it
    # off on the H200 box, whose fused expert took 101-116 us at load against a 121-131 us copy): a decode's
    # misses split between the CPU and the copy engine by the cost model, fits-ram and fits-vram-ram alternated
    "cpu-live-ab": lambda: [
        bench(f"olmoe-int8-{regime}-live-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", regime,
                                                  "--prompt-tokens", "512", "--new-tokens", "128", "--dense-quant", "int8"],
              env={"SLUICE_CPU_LIVE_FACTOR": "1"} if tag.startswith("one") else {})
        for regime, tag in (("fits-ram", "warmup"), ("fits-ram", "default-1"), ("fits-ram", "one-1"),
                            ("fits-vram-ram", "default-1"), ("fits-vram-ram", "one-1"), ("fits-ram", "default-2"),
                            ("fits-ram", "one-2"))],
    # the same with the factor at 0.5 (run 73 found the fused expert at load 126-205 us against a 124-135 us copy:
    # factor 1 left the share off), fits-ram alone, alternated after a warm-up
    "cpu-half-ab": lambda: [
        bench(f"olmoe-int8-fits-ram-half-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", "fits-ram",
                                                  "--prompt-tokens", "512", "--new-tokens", "128", "--dense-quant", "int8"],
              env={"SLUICE_CPU_LIVE_FACTOR": "0.5"} if tag.startswith("half") else {})
        for tag in ("warmup", "default-1", "half-1", "default-2", "half-2")],
    # the CPU's fused int8 experts (kernels/cpu_moe.py, session 16) on the box's 16 cores: its tests and the hybrid
    # ones on CUDA, then fits-ram and fits-vram-ram with it (the default where faster at load: the placement line
    # prints both kernels' load times) against torch's int8 kernel (SLUICE_FUSED_CPU_EXPERTS=0), alternated
    "fused-cpu-ab": lambda: [
        stage_tests(("tests/kernels/test_cpu_moe.py", "tests/streaming/test_fused_cpu_experts.py",
                     "tests/streaming/test_runtime_equality.py"), ("-k", "cpu_moe or fused or hybrid"), timeout=240),
        *[bench(f"olmoe-int8-{regime}-fused-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", regime,
                                                     "--prompt-tokens", "512", "--new-tokens", "64", "--dense-quant", "int8"],
                env={"SLUICE_FUSED_CPU_EXPERTS": "0"} if tag.startswith("torch") else {})
          for regime, tag in (("fits-ram", "warmup"), ("fits-ram", "torch-1"), ("fits-ram", "fused-1"),
                              ("fits-vram-ram", "torch-1"), ("fits-vram-ram", "fused-1"), ("fits-ram", "torch-2"),
                              ("fits-ram", "fused-2"))]],
    # a layer's CPU experts in one fused call (session 18): the CPU probe's fused rows (from DRAM, batched or not,
    # after other work, from a worker), its tests on the box, then the CPU's share forced on (factor 0.5) against the
    # default, fits-ram, alternated after a warm-up
    "batched-cpu": lambda: [
        print(subprocess.run([sys.executable, "scripts/probe_cpu_experts.py", "4", "fused"], cwd=ROOT,
                             capture_output=True, text=True).stdout[-3000:]),
        stage_tests(("tests/kernels/test_cpu_moe.py", "tests/streaming/test_fused_cpu_experts.py"), (), timeout=200),
        STAGES["cpu-half-ab"]()],
    # RAM hits copied ahead for the best 4 guesses (default), all 8 or 6, fits-ram, alternated after a warm-up (run 60
    # found 8 slower, before the deferral and the piece kernels)
    "copies-ab2": lambda: [
        bench(f"olmoe-int8-{regime}-copies-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", regime,
                                                    "--prompt-tokens", str(prompt), "--new-tokens", str(tokens),
                                                    "--dense-quant", "int8"] + extra,
              env={"SLUICE_PREFETCH_COPIES": copies} if copies else {})
        for regime, tag, copies, prompt, tokens, extra in (
            ("fits-ram", "warmup", None, 512, 16, []), ("fits-ram", "4-1", None, 512, 128, []),
            ("fits-ram", "8-1", "8", 512, 128, []), ("fits-ram", "6-1", "6", 512, 128, []),
            ("fits-ram", "4-2", None, 512, 128, []), ("fits-ram", "8-2", "8", 512, 128, []),
            ("fits-ram", "6-2", "6", 512, 128, []))],
    # the peer and Sluice on one machine in one call (a machine is given back 30 s after a call): llama.cpp built beside
    # the Q8_0 conversion, llama-bench fits-ram at -ncmoe 9 and 10, then `sluice bench` fits-ram at the regime's
    # VRAM and at 4.1 GiB (the peer's -ncmoe 9), after a warm-up
    "peer-fits-ram": lambda: [
        print(subprocess.run(["timeout", "400", sys.executable, "scripts/peer/llamacpp.py", "all", "--regime", "fits-ram",
                              "--ncmoe", "9", "10"], cwd=ROOT, capture_output=True, text=True).stdout[-2500:], flush=True),
        *[bench(f"olmoe-int8-fits-ram-beside-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", "fits-ram",
                                                      "--prompt-tokens", "512", "--new-tokens", str(tokens),
                                                      "--dense-quant", "int8"] + extra)
          for tag, tokens, extra in (("warmup", 16, []), ("3.73GiB", 128, []),
                                     ("4.1GiB", 128, ["--vram-budget", "4.1GiB"]), ("3.73GiB-2", 128, []))]],
    # reading RAM-resident experts in place from the decode kernel (pinned host memory over PCIe) against resident
    # and against a copy first (scripts/probe_in_place_reads.py), then the kernel tests that cover `bases`
    "in-place-reads": lambda: [
        print(subprocess.run([sys.executable, "scripts/probe_in_place_reads.py"], cwd=ROOT, capture_output=True,
                             text=True).stdout[-4000:]),
        stage_tests(("tests/kernels/test_moe_decode.py",), ("-k", "bases or in_place"), timeout=120)],
    "tests-warmup": lambda: stage_tests(("tests/engine/test_kernel_warmup.py",), ("-m", "gpu")),
    # a prefill's misses through a rotating pool of slots (the default) against recency eviction (SLUICE_SWEEP=0),
    # alternated after a warm-up: warm prefill (its copies and disk reads) and the decode after it
    "sweep-ab": lambda: [
        bench(f"olmoe-int8-{regime}-sweep-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", regime,
                                                   "--prompt-tokens", "512", "--new-tokens", "64", "--dense-quant", "int8"],
              env={"SLUICE_SWEEP": "0"} if tag.startswith("recency") else {})
        for regime, tag in (("fits-ram", "warmup"), ("fits-ram", "pool-1"), ("fits-ram", "recency-1"),
                            ("fits-vram-ram", "pool-1"), ("fits-vram-ram", "recency-1"),
                            ("fits-ram", "pool-2"), ("fits-ram", "recency-2"),
                            ("fits-vram-ram", "pool-2"), ("fits-vram-ram", "recency-2"))],
    # a prefill's reads queued at each layer's start and the next layer's behind them (SLUICE_PASS_READS=1) against
    # batch by batch, alternated after a warm-up: cold TTFT (every expert read once) and warm prefill, disk-bound regimes
    "pass-reads-ab": lambda: [
        bench(f"olmoe-int8-{regime}-pass-reads-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", regime,
                                                        "--prompt-tokens", "512", "--new-tokens", "16", "--dense-quant",
                                                        "int8"] + (["--vram-budget", "2.5GB"] if regime == "exceeds" else []),
              env={"SLUICE_PASS_READS": "1"} if tag.startswith("on") else {})
        for regime, tag in (("fits-ram", "warmup"), ("exceeds", "off-1"), ("exceeds", "on-1"), ("fits-vram-ram", "off-1"),
                            ("fits-vram-ram", "on-1"), ("exceeds", "off-2"), ("exceeds", "on-2"))],
    # gpt_oss's and DeepSeek-V4's experts (biases, clamped SwiGLU / silu) through the decode and prefill kernels:
    # kernel tests at gpt-oss-120b's expert shapes and token-exact streaming on CUDA, then the families' engine runs
    # (session 10: 31 passed in 106 s on the H200; the families' engine runs are their own stage: with every GPU test
    # of tests/kernels and test_runtime_equality they ran past a call's 600 s)
    "tests-activations": lambda: stage_tests(("tests/kernels/test_moe_activations.py",
                                              "tests/streaming/test_activation_kernels.py"), ()),
    "tests-activations-families": lambda: stage_tests(("tests/families/test_gpt_oss.py",
                                                       "tests/families/test_dsv4_engine.py"), ("-m", "gpu")),
    "probe-cpu": lambda: print(subprocess.run([sys.executable, "scripts/probe_cpu_experts.py", "6"], cwd=ROOT,
                                              capture_output=True, text=True).stdout[-3000:]),
    # where the memory besides the RAM cache comes from, phase by phase (the model is made in another process)
    "probe-memory": lambda: print(subprocess.run(
        f"{sys.executable} -c \"from engine.tools.presets import write_sluice_dir; from pathlib import Path; "
        f"write_sluice_dir('olmoe-1b-7b', Path('{WORK}') / 'olmoe-1b-7b-int8', 'int8')\" && "
        f"{sys.executable} scripts/probe_memory.py {WORK}/olmoe-1b-7b-int8 cuda", shell=True, cwd=ROOT,
        capture_output=True, text=True).stdout[-3000:]),
    # which torch operators' first call costs host memory on the real model (load, graphs, two prompts), int8 dense
    # weights: a first run fills the verdict and Triton caches (what every later start skips), then the table; bf16 dense
    "probe-op-memory": lambda: [probe_ops(cold=True), print(subprocess.run(
        f"{sys.executable} scripts/probe_op_memory.py {WORK}/olmoe-1b-7b-int8 cuda 40 none > {OUT}/probe-op-memory-bf16.txt 2>&1",
        shell=True, cwd=ROOT, capture_output=True, text=True).stdout)],
    # the disk with few reads in flight, and blocks in pieces (the exceeds regime's reads), on the bench's model
    "probe-disk": lambda: print(subprocess.run(
        f"{sys.executable} -c \"from engine.tools.presets import write_sluice_dir; from pathlib import Path; "
        f"write_sluice_dir('olmoe-1b-7b', Path('{WORK}') / 'olmoe-1b-7b-int8', 'int8')\" && "
        f"{sys.executable} scripts/probe_disk_reads.py {WORK}/olmoe-1b-7b-int8", shell=True,
        cwd=ROOT, capture_output=True, text=True).stdout[-3000:]),
    # exceeds (int8 dense, 2.5 GB): how the reads keep the disk busy. Blocks whole (the default) or in 4 pieces,
    # the next layer's read-ahead after this layer's reads landed (the default) or right behind them (early),
    # each combination twice, alternated after a warm-up
    "reads-ab": lambda: [
        bench(f"olmoe-int8-{regime}-reads-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", regime,
                                                   "--prompt-tokens", "512", "--new-tokens", str(tokens),
                                                   "--dense-quant", "int8"] + (["--vram-budget", "2.5GB"]
                                                                              if regime == "exceeds" else []),
              env=env)
        for regime, tag, env, tokens in [("fits-ram", "warmup", {}, 16)] + [
            ("exceeds", f"{tag}-{i}", env, 32) for i in (1, 2) for tag, env in READS_AB]],
    # which kernels' first run costs host memory, with CUDA's lazy module loading (torch's default) and eager
    "probe-first-use": lambda: [print(subprocess.run(
        f"CUDA_MODULE_LOADING={mode} {sys.executable} scripts/probe_first_use.py", shell=True, cwd=ROOT,
        capture_output=True, text=True).stdout[-3000:]) for mode in ("LAZY", "EAGER")],
    # the memory besides the RAM cache under glibc's and the CUDA driver's switches: freed heap kept (a fixed mmap
    # threshold returns large frees at once), module data loaded lazily; each in a fresh process, same model
    "probe-memory-variants": lambda: [print(f"=== {env or '(defaults)'}\n" + subprocess.run(
        f"{sys.executable} -c \"from engine.tools.presets import write_sluice_dir; from pathlib import Path; "
        f"write_sluice_dir('olmoe-1b-7b', Path('{WORK}') / 'olmoe-1b-7b-int8', 'int8')\" && "
        f"{env} {sys.executable} scripts/probe_memory.py {WORK}/olmoe-1b-7b-int8 cuda", shell=True, cwd=ROOT,
        capture_output=True, text=True).stdout[-3500:]) for env in (
            "", "MALLOC_MMAP_THRESHOLD_=131072 MALLOC_TRIM_THRESHOLD_=131072", "CUDA_MODULE_DATA_LOADING=LAZY",
            "MALLOC_ARENA_MAX=1 MALLOC_MMAP_THRESHOLD_=131072 MALLOC_TRIM_THRESHOLD_=131072 CUDA_MODULE_DATA_LOADING=LAZY")]
        + [print(subprocess.run(f"CUDA_MODULE_DATA_LOADING=LAZY {sys.executable} scripts/probe_first_use.py", shell=True,
                                cwd=ROOT, capture_output=True, text=True).stdout[-3000:])],
    # the same without CUDA graphs and Triton kernels: is the memory the graphs, or the kernels' first run?
    "probe-memory-eager": lambda: print(subprocess.run(
        f"SLUICE_EAGER=1 {sys.executable} scripts/probe_memory.py {WORK}/olmoe-1b-7b-int8 cuda", shell=True,
        cwd=ROOT, capture_output=True, text=True).stdout[-3000:]),
    # hybrid on/off alternated after a warm-up bench (the first bench of a fresh machine also writes the model)
    "hybrid-abab": lambda: [
        bench(f"olmoe-int8-fits-ram-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", "fits-ram",
                                             "--prompt-tokens", "512", "--new-tokens", "128"],
              env={"SLUICE_CPU_EXPERTS": mode}) for tag, mode in (
                  ("warmup", "off"), ("off-1", "off"), ("auto-1", "auto"), ("off-2", "off"), ("auto-2", "auto"))],
    # the disk-bound regimes with reads ahead for the better half of the guesses (now) and for all 8 (before),
    # alternated after a warm-up; the RAM cache's frequency-aware eviction is in both (compare run 33: 2.61)
    "disk-ab": lambda: [
        bench(f"olmoe-int8-{regime}-reads-{reads or 'half'}-{i}",
              ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", regime, "--prompt-tokens", "512",
               "--new-tokens", "32"] + (["--vram-budget", "2.5GB"] if regime == "exceeds" else []),
              env={"SLUICE_PREFETCH_READS": reads} if reads else {})
        for i, regime, reads in DISK_AB],
    # fits-ram: RAM hits copied ahead for every guess of the next layer (now) against the best 4, alternated
    "copies-ab": lambda: [
        bench(f"olmoe-int8-fits-ram-copies-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", "fits-ram",
                                                    "--prompt-tokens", "512", "--new-tokens", str(tokens)],
              env={"SLUICE_PREFETCH_COPIES": copies} if copies else {})
        for tag, copies, tokens in (("warmup", None, 16), ("all", "8", 128), ("4", "4", 128))],
    # the default (copies ahead for the better half) against copies for all 8, alternated, then exceeds
    "copies-confirm": lambda: [
        bench(f"olmoe-int8-{regime}-copies-{tag}", ["--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", regime,
                                                    "--prompt-tokens", "512", "--new-tokens", str(tokens)] +
              (["--vram-budget", "2.5GB"] if regime == "exceeds" else []),
              env={"SLUICE_PREFETCH_COPIES": copies} if copies else {})
        for regime, tag, copies, tokens in (("fits-ram", "warmup", None, 16), ("fits-ram", "half-1", None, 128),
                                            ("fits-ram", "all", "8", 128), ("fits-ram", "half-2", None, 128),
                                            ("exceeds", "half", None, 32))],
    # exceeds with the VRAM budget raised to what Sluice needs on the H200 (its CUDA context is ~0.85 GB)
    "exceeds-2g5": lambda: bench("olmoe-int8-exceeds-2.5GB", [
        "--preset", "olmoe-1b-7b", "--quant", "int8", "--regime", "exceeds", "--vram-budget", "2.5GB",
        "--prompt-tokens", "512", "--new-tokens", "32"]),
    "bench-olmoe-free": lambda: bench("olmoe-fp8-ram-unconstrained", [
        "--preset", "olmoe-1b-7b", "--quant", "fp8", "--vram-budget", "4GB", "--ram-cache", "16GB",
        "--prompt-tokens", "512", "--new-tokens", "128"]),
    "bench-olmoe-4g": lambda: bench("olmoe-fp8-4g-2g", ["--preset", "olmoe-1b-7b", "--quant", "fp8", "--vram-budget",
                                                          "4GiB", "--ram-cache", "2GiB", "--prompt-tokens", "2048",
                                                          "--new-tokens", "64"]),
    "bench-qwen3": lambda: bench("qwen3-fp8-streaming", [
        "--preset", "qwen3-30b-a3b", "--quant", "fp8", "--vram-budget", "7GiB", "--ram-cache", "2GiB",
        "--prompt-tokens", "2048", "--new-tokens", "24"]),
    "rm-qwen3": lambda: [__import__("shutil").rmtree(p, ignore_errors=True) for p in WORK.glob("qwen3-*")],
    # accelerate and Sluice under one cgroup cap (page cache included); the checkpoint is built uncapped first
    "baseline-cap": lambda: [
        bench("olmoe-build-hf", ["--preset", "olmoe-1b-7b", "--quant", "fp8", "--via-repack", "--vram-budget", "4GB",
                                 "--ram-cache", "1536MiB", "--prompt-tokens", "32", "--new-tokens", "8"]),
        bench("olmoe-fp8-vs-accelerate-cap4g", [
            "--preset", "olmoe-1b-7b", "--quant", "fp8", "--vram-budget", "4GB", "--ram-cache", "1536MiB",
            "--prompt-tokens", "32", "--new-tokens", "64", "--baseline", "accelerate", "--baseline-new-tokens", "4"],
            cgroup_bytes=4 << 30)],
    "baseline": lambda: bench("olmoe-fp8-vs-accelerate", [
        "--preset", "olmoe-1b-7b", "--quant", "fp8", "--vram-budget", "4GiB", "--ram-cache", "2GiB",
        "--prompt-tokens", "32", "--new-tokens", "64", "--baseline", "accelerate", "--baseline-new-tokens", "6"]),
}

if __name__ == "__main__":
    for stage in sys.argv[1:] or list(STAGES):
        t0 = time.perf_counter()
        try:
            STAGES[stage]()
        except Exception as exc:          # noqa: BLE001 - report and go on to the next stage
            import traceback
            traceback.print_exc()
            RESULTS.setdefault("errors", {})[stage] = repr(exc)
            save()
        print(f"[stage {stage}: {time.perf_counter() - t0:.0f} s]", flush=True)
    print("\n===== summary\n" + "\n".join(SUMMARY))
