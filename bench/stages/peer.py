"""llama.cpp, the peer: build llama-bench with CUDA, convert a preset's HF checkpoint to a Q8_0 GGUF, sweep -ncmoe.

The checkpoint is the one `sluice bench --via-repack` builds; each llama-bench run is under the regime's cgroup v2
cap with the page cache dropped first. The source comes from bench/fetch_llamacpp.sh (peer/llama.cpp).

    python -m bench peer all --regime fits-ram fits-vram-ram     # build beside convert, then bench
    python -m bench peer build                                   # ~280 s with 16 jobs
    python -m bench peer convert                                 # HF checkpoint + GGUF
    python -m bench peer bench --regime exceeds --ncmoe 13 16

JSON: OUT/llamacpp.json (kept across calls; each phase adds its part).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from bench import llamacpp
from bench.peer_runs import peer_line, sweep
from bench.regimes import REGIMES, describe, regime
from engine.errors import SluiceError

PHASES = ("build", "convert", "bench", "all")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("phase", choices=PHASES)
    p.add_argument("--src", type=Path, default=llamacpp.default_src(), help="llama.cpp source (default: peer/llama.cpp)")
    p.add_argument("--build-dir", type=Path, default=Path("/root/lcp-build"))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 16)
    p.add_argument("--cpu-only", action="store_true", help="build without CUDA (a check on a machine without nvcc)")
    p.add_argument("--preset", default="olmoe-1b-7b")
    p.add_argument("--gguf", type=Path, help="a GGUF to bench (default: the preset's, converted by `convert`)")
    p.add_argument("--regime", nargs="+", default=[], choices=list(REGIMES))
    p.add_argument("--ncmoe", type=int, nargs="+", help="-ncmoe values (default: the regime's list)")
    p.add_argument("--vram-budget", help="VRAM limit for choosing the best -ncmoe (default: the regime's)")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, help="decode tokens per repetition (default: 64, 16 in exceeds)")
    p.add_argument("--reps", type=int, help="repetitions (default: 2, 1 in exceeds)")
    p.add_argument("--timeout", type=float, help="seconds per llama-bench run (default: 240, 120 in exceeds)")
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--no-cgroup", action="store_true", help="budgets only: no memory cap")
    p.add_argument("--keep-page-cache", action="store_true", help="do not drop the page cache before each run")


def build(args, wait: bool = True):
    log_path = args.out / "llamacpp-build.log"
    start = time.perf_counter()
    proc = llamacpp.start_build(args.src, args.build_dir, args.jobs, log_path, cuda=not args.cpu_only)
    if proc is None:
        print(f"llama-bench already built: {llamacpp.bench_binary(args.build_dir)}", flush=True)
        return lambda: {"binary": str(llamacpp.bench_binary(args.build_dir)), "seconds": 0.0}
    print(f"building llama-bench in {args.build_dir} ({args.jobs} jobs; log {log_path})", flush=True)

    def finish() -> dict:
        rc = proc.wait()
        seconds = time.perf_counter() - start
        if rc != 0:
            tail = log_path.read_text()[-3000:]
            raise SluiceError(f"llama-bench build failed (exit {rc}) after {seconds:.0f} s:\n{tail}")
        print(f"llama-bench built in {seconds:.0f} s", flush=True)
        return {"binary": str(llamacpp.bench_binary(args.build_dir)), "seconds": seconds}
    return finish() if wait else finish


def convert(args) -> dict:
    import torch
    start = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gguf = llamacpp.convert_preset(args.preset, args.work_dir, args.src, device, log=lambda m: print(m, flush=True))
    return {"gguf": str(gguf), "bytes": gguf.stat().st_size, "seconds": time.perf_counter() - start}


def bench(args) -> dict:
    gguf = args.gguf or llamacpp.gguf_path(args.work_dir, args.preset)
    binary = llamacpp.bench_binary(args.build_dir)
    for path, what in ((gguf, "convert"), (binary, "build")):
        if not path.is_file():
            raise SluiceError(f"{path} is missing: run `python -m bench peer {what}` first.")
    results = {}
    for name in args.regime:
        r = regime(name)
        print(describe(r, capped=not args.no_cgroup and r.memory_cap_bytes is not None), flush=True)
        results[name] = sweep(binary, gguf, r, tuple(args.ncmoe) if args.ncmoe else None, args.vram_budget,
                              log=lambda m: print(m, flush=True), n_prompt=args.prompt_tokens,
                              threads=args.threads, n_gen=args.new_tokens, reps=args.reps, timeout_s=args.timeout,
                              use_cgroup=not args.no_cgroup, drop_cache=not args.keep_page_cache,
                              log_dir=args.out)
        best = results[name]["best"]
        print(f"best within {results[name]['vram_limit_bytes'] / 1e9:.2f} GB of VRAM: "
              + (f"-ncmoe {best['ncmoe']}, decode {best['decode_tok_s']:.2f} tok/s" if best else "none"), flush=True)
    return results


def run(args) -> int:
    if args.phase in ("bench", "all") and not args.regime:
        raise SluiceError(f"peer {args.phase} needs --regime (one or more of {', '.join(REGIMES)}).")
    path = args.out / "llamacpp.json"
    result = json.loads(path.read_text()) if path.is_file() else {}
    if args.phase == "build":
        result["build"] = build(args)
    elif args.phase == "convert":
        result["convert"] = convert(args)
    else:
        if args.phase == "all":
            finish = build(args, wait=False)         # compiles on the CPU cores while the checkpoint converts
            result["convert"] = convert(args)
            result["build"] = finish()
        result.setdefault("regimes", {}).update(bench(args))
    path.write_text(json.dumps(result, indent=1))
    print(f"JSON: {path}")
    _print_summary(result)
    return 0


def _print_summary(result: dict) -> None:
    """The summary last: a device call's output is read from its tail."""
    for name, res in result.get("regimes", {}).items():
        print(f"--- {name}: " + "; ".join(
            f"-ncmoe {r['ncmoe']} {r['decode_tok_s'] or 0:.2f}/{r['prefill_tok_s'] or 0:.0f} tok/s "
            f"{(r['vram_driver_bytes'] or 0) / 1e9:.2f} GB" for r in res["runs"]))
        print(f"    best: {peer_line(res['best']) if res['best'] else 'none within the VRAM limit'}")
