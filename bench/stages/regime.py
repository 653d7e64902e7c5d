"""`sluice bench` inside a memory regime's cap, and llama.cpp's llama-bench beside it.

    python -m bench regime --regime fits-vram-ram [--llama-bench PATH] -- --preset olmoe-1b-7b --quant int8 \
        --dense-quant int8 --prompt-tokens 512 --new-tokens 128 [--copy-rate-gbps 25] [--set KEY=VALUE ...]

The model is built first, uncapped; then the page cache is dropped and `sluice bench --json` runs in a child
inside a fresh cgroup v2 `memory.max` (process and page cache). Where no cgroup can be made, the child runs with
budgets only and the report says why. With --llama-bench, llama-bench runs next in the same regime on a GGUF of
the same HF checkpoint, and the ratios are printed.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from bench.cgroup import CgroupUnavailable, MemoryCap, StatPoller, drop_page_cache
from bench.common import run_sluice_bench
from bench.origin import origin_lines, origin_projection
from bench.peer_runs import peer_lines
from bench.regimes import REGIMES, Regime, describe, regime, regime_budgets
from engine.errors import SluiceError
from engine.sizes import format_size, parse_size


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--regime", required=True, choices=list(REGIMES),
                   help="; ".join(f"{r.name}: {r.summary}" for r in REGIMES.values()))
    p.add_argument("--no-cgroup", action="store_true", help="the cap as budgets only (no cgroup v2 memory.max)")
    p.add_argument("--keep-page-cache", action="store_true", help="do not drop the page cache before the runs")
    p.add_argument("--llama-bench", help="llama.cpp's llama-bench binary: run it after Sluice in the same regime")
    p.add_argument("--llama-gguf", help="the GGUF llama-bench runs (default: converted from the preset's HF checkpoint)")
    p.add_argument("--llama-src", help="llama.cpp source with convert_hf_to_gguf.py (default: peer/llama.cpp)")
    p.add_argument("--llama-ncmoe", type=int, nargs="+", help="llama-bench -ncmoe values (default: the regime's)")
    p.add_argument("--llama-threads", type=int, default=16, help="llama-bench -t (default 16)")
    p.add_argument("--json", action="store_true", help="print the JSON result instead of the report")


def run(args) -> int:
    from engine.tools.bench import report
    result = measure_in_regime(args, args.bench_args)
    result["origin"] = origin_projection(result)          # a model the project's origin ran: its speed there, computed
    print(json.dumps(result, indent=1) if args.json else "\n".join([*regime_lines(result), report(result),
                                                                      *cap_stat_lines(result), *peer_lines(result),
                                                                      *origin_lines(result)]))
    return 0


def measure_in_regime(args, bench_args: list[str], tree: Path | None = None) -> dict:
    """One `sluice bench` in the regime (from `tree`, another checkout, when given), and the peer when asked."""
    bench = parse_bench_args(bench_args)
    reg = regime(args.regime)
    if args.llama_bench or args.llama_gguf:
        check_llama_options(args)
    # the peer runs a GGUF of the HF checkpoint, so Sluice runs that checkpoint's repack (the same weights)
    result = sluice_in_regime(reg, bench_args, args, via_repack=bool(args.llama_bench), tree=tree)
    if args.llama_bench:
        result["llama_cpp"] = run_llama_side(result, bench, args, reg)
    return result


def sluice_in_regime(reg: Regime, bench_args: list[str], args, via_repack: bool = False, tree: Path | None = None) -> dict:
    """One `sluice bench` in regime `reg`: its model built first, uncapped, then the child inside a fresh cap (args:
    work_dir, out, no_cgroup, keep_page_cache)."""
    from engine.tools.bench import build_apart
    bench = parse_bench_args(bench_args)
    via_repack = via_repack or bench.via_repack
    build_apart(bench.preset, bench.quant, args.work_dir, via_repack, bench.device, to_stderr=True)
    cap, why = _make_cap(args, reg)
    flags = regime_flags(bench, reg, bench_args, via_repack, capped=cap is not None)
    return _run_in_cap(cap, why, args, reg, flags, tree)


def parse_bench_args(bench_args: list[str]):
    """`sluice bench`'s own flags, read as the CLI reads them (the child gets them unchanged)."""
    from engine.tools.cli import build_parser
    return build_parser().parse_args(["bench", *bench_args])


def regime_flags(bench, reg: Regime, bench_args: list[str], via_repack: bool, capped: bool) -> list[str]:
    """The child's flags: the user's, plus the regime's budgets where the user gave none."""
    vram, ram = regime_budgets(reg, bench.vram_budget, bench.ram_cache, capped=capped)
    flags = list(bench_args)
    if bench.vram_budget is None:
        flags += ["--vram-budget", vram]
    if bench.ram_cache is None and ram is not None:
        flags += ["--ram-cache", ram]
    return flags + (["--via-repack"] if via_repack and "--via-repack" not in flags else [])


def _make_cap(args, reg: Regime) -> tuple[MemoryCap | None, str | None]:
    """(a fresh cap, None), or (None, why there is none) for a regime with a cap."""
    if reg.memory_cap_bytes is None:
        return None, None
    if args.no_cgroup:
        return None, "--no-cgroup"
    try:
        return MemoryCap.create(f"sluice-bench-{os.getpid()}", reg.memory_cap_bytes), None
    except CgroupUnavailable as exc:
        return None, str(exc)


def _run_in_cap(cap: MemoryCap | None, why: str | None, args, reg: Regime, flags: list[str], tree) -> dict:
    """The child inside `cap` (or with budgets only), the page cache dropped first; the cap described."""
    dropped = not args.keep_page_cache and drop_page_cache()
    _progress(describe(reg, capped=cap is not None))
    poller = StatPoller(cap) if cap else None
    try:
        with poller or contextlib.nullcontext():
            result = run_sluice_bench(flags, args.work_dir, args.out, cap=cap, **({"tree": tree} if tree else {}))
        memory_cap = {**_cap_info(reg, cap, why, result), "page_cache_dropped": dropped,
                      "peak_bytes": cap.peak_bytes() if cap else None}
    finally:
        if cap:
            cap.remove()
    result["cgroup_stat"] = poller.at_peak if poller else None
    result["regime"] = {"name": reg.name, "summary": reg.summary, "cap_bytes": reg.memory_cap_bytes,
                        "memory_cap": memory_cap}
    return result


def _cap_info(reg: Regime, cap: MemoryCap | None, why: str | None, result: dict) -> dict:
    if reg.memory_cap_bytes is None:
        return {"method": "none (RAM unconstrained)"}
    if cap is not None:
        return {"method": "cgroup v2 memory.max (process + page cache)", "cgroup": str(cap.path)}
    return {"method": "budgets only", "why": why, "ram_cache": str(result["ram_cache_bytes"])}


def check_llama_options(args) -> None:
    """Before anything is measured: the paths the peer run needs."""
    for flag, path in (("--llama-bench", args.llama_bench), ("--llama-gguf", args.llama_gguf)):
        if path and not Path(path).is_file():
            raise SluiceError(f"{flag} {path} is not a file: give the path of llama.cpp's "
                              + ("llama-bench (python -m bench peer build makes one)." if flag == "--llama-bench"
                                 else "GGUF of this preset (python -m bench peer convert makes one), or leave it out."))


def run_llama_side(sluice: dict, bench, args, reg: Regime) -> dict:
    """llama-bench over the regime's -ncmoe values at the VRAM the driver showed for Sluice (or its budget)."""
    from bench import llamacpp
    from bench.peer_runs import ratios, sweep
    gguf = Path(args.llama_gguf) if args.llama_gguf else llamacpp.convert_preset(
        bench.preset, args.work_dir, Path(args.llama_src) if args.llama_src else llamacpp.default_src(), bench.device,
        _progress)
    vram_limit = max(sluice["vram_budget_bytes"], sluice.get("vram_driver_bytes") or 0)
    peer = sweep(Path(args.llama_bench), gguf, reg, tuple(args.llama_ncmoe) if args.llama_ncmoe else None,
                 vram_budget=str(vram_limit), log=_progress, n_prompt=bench.prompt_tokens,
                 threads=args.llama_threads, use_cgroup=not args.no_cgroup, drop_cache=not args.keep_page_cache,
                 log_dir=args.out)
    peer["gguf"] = str(gguf)
    peer["ratio"] = ratios(sluice, peer)
    return peer


def regime_lines(r: dict) -> list[str]:
    g = r.get("regime")
    if not g:
        return []
    cap = g["memory_cap"]
    line = f"regime       {g['name']}: {g['summary']}; memory cap: {cap['method']}"
    if cap.get("peak_bytes"):
        line += f", cgroup peak {cap['peak_bytes'] / 2**30:.2f} of {g['cap_bytes'] / 2**30:.2f} GiB"
    if cap.get("why"):
        line += f" ({cap['why']}; RAM cache {format_size(parse_size(cap['ram_cache']))})"
    return [line]


def cap_stat_lines(r: dict) -> list[str]:
    size = {key: format_size(n) for key, n in (r.get("cgroup_stat") or {}).items()}
    return [f"cap holds    anonymous {size.get('anon')}, page cache {size.get('file')} (of which shared memory, the "
            f"RAM cache: {size.get('shmem')}; active {size.get('active_file')}), kernel {size.get('kernel')} "
            f"(at the cap's highest use)"] if size else []


def _progress(msg: str) -> None:
    """Progress to stderr: stdout holds the report or the JSON."""
    print(msg, file=sys.stderr, flush=True)
