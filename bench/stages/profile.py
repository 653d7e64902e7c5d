"""Where a decode token's time goes in a preset's model (default OLMoE int8), int8 dense weights, RAM free, through
Engine.generate:
  py-spy    the decode thread sampled at 1000 Hz (no tracing overhead; --phase prefill: warm prefills)
  trace     a few decode tokens under torch.profiler (CPU and CUDA), the Chrome trace gzipped into OUT and summed up
  timeline  what the GPU runs in a decode token: kernels and copies by total time, GPU busy against wall time
  host      per-token telemetry and cProfile of the host
  bookkeeping  the decode's host bookkeeping a layer on the CPU, no GPU (bench/stages/bookkeeping.py; --tree)
  spans     the decode thread's wall time a token by section (set_step, layer replays, the layers' host syncs, the
            rest of the experts' host work, the deferred work, the head), timed around the calls themselves

    python -m bench profile --mode py-spy [--budgets 4GB,40GB] [--tokens 256]
    python -m bench profile --mode timeline --preset qwen3.8-flash-next-4l --quant nvfp4 --budgets 8GB
"""
from __future__ import annotations

import argparse
import gzip
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

from bench.common import ROOT, append_log, bench_model, sampled

MODES = ("py-spy", "trace", "timeline", "host", "spans", "bookkeeping")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=MODES, default="py-spy")
    p.add_argument("--budgets", default="4GB,40GB", help="VRAM budgets, comma-separated (40GB: every expert resident)")
    p.add_argument("--tokens", type=int, default=256, help="tokens decoded (py-spy: prompt tokens with --phase prefill)")
    p.add_argument("--phase", choices=("decode", "prefill"), default="decode", help="py-spy: what is sampled")
    p.add_argument("--preset", default="olmoe-1b-7b", help="the bench preset whose model is profiled")
    p.add_argument("--quant", default="int8", help="its experts' format")
    p.add_argument("--tree", type=Path, help="bookkeeping: an older checkout, measured alternately with this one")
    p.add_argument("--ram-cache", default="16GB", help="the RAM budget ('default': the engine's own, as the bench's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="spans: an engine option (engine/options.py) for the run, e.g. ram_fill=false")
    p.add_argument("--switch-interval", type=float,
                   help="spans: sys.setswitchinterval (seconds) for the run, against Python's 0.005 (a GIL held by "
                        "another thread shows as a shorter wait at the syncs)")


def run(args) -> int:
    if args.mode == "bookkeeping":
        from bench.stages import bookkeeping
        return bookkeeping.run(args)
    path = bench_model(args.work_dir, args.preset, args.quant)
    for budget in args.budgets.split(","):
        {"py-spy": py_spy, "trace": trace, "timeline": timeline, "host": host, "spans": spans}[args.mode](args, path, budget)
    return 0


def _warm_engine(path, budget: str, seed: int = 0, ram_cache: str = "16GB", settings: tuple[str, ...] = ()):
    """The engine with its RAM cache and banks filled by a long prompt, then warmed by a short generation
    (`settings`: engine options as KEY=VALUE)."""
    import engine
    from engine.options import Options
    from engine.tools.bench import timed_generate
    eng = engine.load(path, device="cuda", vram_budget=budget, ram_cache=None if ram_cache == "default" else ram_cache,
                      max_context=1024, dense_quant="int8", options=Options.parse(list(settings)))
    rng = random.Random(seed)
    prompt = lambda n: [rng.randrange(eng.spec.vocab_size) for _ in range(n)]   # noqa: E731 - a fresh prompt routes anew
    timed_generate(eng, prompt(512), sampled(96))
    timed_generate(eng, prompt(16), sampled(64))
    return eng, prompt


def py_spy(args, path, budget: str) -> None:
    spy = shutil.which("py-spy") or "/tmp/site/bin/py-spy"
    raw = args.work_dir / f"{args.phase}-{budget}.raw"
    env = {**os.environ, "PROFILE_PHASE": args.phase}
    proc = subprocess.run([spy, "record", "--nonblocking", "-r", "1000", "-f", "raw", "-o", str(raw), "--",
                           sys.executable, "-m", "bench.profile_decode", "run", str(path), budget, str(args.tokens)],
                          cwd=ROOT, capture_output=True, text=True, env=env)
    text = subprocess.run([sys.executable, "-m", "bench.profile_decode", "summary", str(raw)], cwd=ROOT,
                          capture_output=True, text=True, env=env)
    print(f"--- {args.phase} profile, VRAM budget {budget}:\n{proc.stdout[-800:]}"
          f"{proc.stderr[-1500:] if proc.returncode else ''}{text.stdout[-6000:]}{text.stderr[-2000:]}", flush=True)
    append_log(args.out, "profile.txt", f"===== {budget}\n{proc.stdout}\n{text.stdout}\n")
    if raw.exists():                        # the decode's stacks, gzipped, for a look by line afterwards
        with open(raw) as src, gzip.open(args.out / f"{raw.name}.gz", "wt") as dst:
            dst.writelines(line for line in src if "runner.py" in line)


def trace(args, path, budget: str) -> None:
    from torch.profiler import ProfilerActivity, profile

    from engine.tools.bench import timed_generate
    eng, prompt = _warm_engine(path, budget, seed=1)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = timed_generate(eng, prompt(8), sampled(min(args.tokens, 8)))
    syncs = 1 + sum(1 for b in eng.runner.model.blocks if b.is_moe)        # a MoE layer's own and the token's
    eng.close()
    print(f"--- trace, VRAM budget {budget}: {t.new_tokens} tokens, decode "
          f"{t.decode_s / max(1, t.new_tokens - 1) * 1e3:.2f} ms/token under the profiler", flush=True)
    raw = args.work_dir / f"trace-{budget}.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(args.out / f"trace-{budget}.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    subprocess.run([sys.executable, "-m", "bench.trace_summary", str(raw), "2", str(syncs)], cwd=ROOT)


def timeline(args, path, budget: str) -> None:
    from torch.profiler import ProfilerActivity, profile

    from engine.tools.bench import timed_generate
    eng, prompt = _warm_engine(path, budget)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = timed_generate(eng, prompt(8), sampled(args.tokens))
    eng.close()
    n = t.new_tokens
    rows = [(e.key, e.count, e.self_device_time_total) for e in prof.key_averages() if e.self_device_time_total > 0]
    busy, wall = sum(r[2] for r in rows) / n, (t.prefill_s + t.decode_s) / n * 1e6
    print(f"--- GPU timeline, VRAM budget {budget}: {n} tokens, wall {wall:.0f} us a token, GPU kernels + copies "
          f"{busy:.0f} us a token ({busy / wall:.0%}), {sum(r[1] for r in rows) / n:.0f} of them a token")
    for key, count, total in sorted(rows, key=lambda r: -r[2])[:22]:
        print(f"  {total / n:8.1f} us/token  {count / n:6.1f}/token  {key[:110]}")


def host(args, path, budget: str) -> None:
    import cProfile
    import io
    import pstats

    from engine.runtime.telemetry import delta
    from engine.tools.bench import timed_generate
    eng, prompt = _warm_engine(path, budget)
    t = timed_generate(eng, prompt(64), sampled(64))
    d = lambda *key: delta(eng.telemetry(), t.after_prefill, *key) / (t.new_tokens - 1)       # noqa: E731
    print(f"--- host, VRAM budget {budget}: decode {t.decode_s / (t.new_tokens - 1) * 1e3:.2f} ms/token; per token "
          f"VRAM hits {d('vram', 'hits'):.1f}, misses {d('vram', 'misses'):.1f}, RAM hits {d('ram_cache', 'hits'):.1f}, "
          f"h2d {d('h2d', 'bytes') / 1e6:.0f} MB, disk {d('disk', 'bytes_read') / 1e6:.0f} MB, CPU experts "
          f"{d('cpu', 'experts'):.1f}")
    prof = cProfile.Profile()
    prof.enable()
    timed_generate(eng, prompt(64), sampled(32))
    prof.disable()
    eng.close()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    print("\n".join(line for line in text.getvalue().splitlines()[6:] if line.strip()))


SPANS = ("engine.runtime.runner:Runner._decode", "engine.runtime.decode_step:DecodeStep.set_step",
         "engine.runtime.decode_step:DecodeStep.run_layer", "engine.runtime.decode_step:DecodeStep.run_head",
         "engine.runtime.experts:_host_ids", "engine.runtime.experts:Experts.run",
         "engine.runtime.experts:Experts._find",
         "engine.runtime.experts:Experts._compute", "engine.runtime.experts:Experts._bring_in",
         "engine.runtime.experts:Experts.run_deferred", "engine.runtime.experts:Experts._prefetch",
         "engine.runtime.expert_compute:LayerCompute.launch", "engine.runtime.reads:DiskReads.finish",
         "engine.format.file_table:FileTable.rows", "engine.format.file_table:FileTable.row_into",
         "engine.runtime.sampling:TokenSampler.__call__",
         "engine.detokenize:IncrementalDetokenizer.push", "engine.model.model:Model.before_step",
         "engine.model.model:Model.before_layer")


def spans(args, path, budget: str) -> None:
    """Each SPANS function (module:owner.name) wrapped in a wall-clock timer from the first decode step to the end
    of one generation (the step's own sections and what the engine does between steps: sampling, detokenising);
    nested spans count in both (`run` holds `_host_ids`). A family's own hooks are timed where its model class
    defines them (`before_layer` of qwen4_exp)."""
    import importlib
    import time

    import torch

    from engine.tools.bench import timed_generate
    eng, prompt = _warm_engine(path, budget, ram_cache=args.ram_cache, settings=tuple(args.set))
    totals: dict[str, list] = {}
    decoding = [False]
    gpu_marks: list = []            # (start, end) CUDA events around each decode step, on the compute stream

    def timed(name, fn):
        def wrapper(*a, **kw):
            decoding[0] = decoding[0] or name == "Runner._decode"
            if not decoding[0]:
                return fn(*a, **kw)
            start = time.perf_counter()
            if name == "Runner._decode" and torch.cuda.is_available():
                gpu_marks.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
                gpu_marks[-1][0].record()
            try:
                return fn(*a, **kw)
            finally:
                if name == "Runner._decode" and torch.cuda.is_available():
                    gpu_marks[-1][1].record()
                entry = totals.setdefault(name, [0.0, 0])
                entry[0] += time.perf_counter() - start
                entry[1] += 1
        return wrapper
    for spec in SPANS:
        module, _, attr = spec.partition(":")
        owner, _, name = attr.rpartition(".")
        target = importlib.import_module(module)
        target = getattr(target, owner) if owner else target
        if owner == "Model":                                      # the family's class, where it overrides the hook
            target = type(eng.runner.model)
        setattr(target, name, timed(attr if owner != "Model" else f"{target.__name__}.{name}", getattr(target, name)))
    interval = sys.getswitchinterval()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    try:
        t = timed_generate(eng, prompt(64), sampled(args.tokens))
    finally:
        sys.setswitchinterval(interval)
    decoding[0] = False
    eng.close()
    n = t.new_tokens - 1
    print(f"--- spans, VRAM budget {budget}, {' '.join(args.set) or 'default options'}, switch interval "
          f"{args.switch_interval or interval} s: decode "
          f"{t.decode_s / n * 1e6:.0f} us a token ({n} tokens)")
    if gpu_marks:         # the GPU's time from reaching a step's first work to its last (idle gaps included)
        steps = [a.elapsed_time(b) * 1e3 for a, b in gpu_marks[1:]]
        print(f"  {'the step on the GPU (events)':<36} {sum(steps) / len(steps):7.0f} us a token")
    for name, (total, count) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
        print(f"  {name:<36} {total / n * 1e6:7.0f} us a token {count / n:6.1f} calls {total / count * 1e6:8.1f} us a call")
