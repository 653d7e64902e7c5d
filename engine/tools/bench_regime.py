"""`sluice bench --regime NAME`: the bench run inside the regime's memory cap, and llama.cpp beside it.

The cap is a cgroup v2 `memory.max` on a child `sluice bench` (this same command, with the same options and
`--json`), which counts the process and its page cache; the model is built before, uncapped, and the page
cache is dropped so that the child starts cold. Where no cgroup can be made the run keeps budgets only and
says so. With `--llama-bench PATH`, llama-bench runs next, in the same regime, on a GGUF of the same HF
checkpoint, and the ratios are printed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from engine.errors import SluiceError
from engine.sizes import format_size, parse_size
from engine.tools.cgroup import CgroupUnavailable, MemoryCap, drop_page_cache, own_cap
from engine.tools.regimes import Regime, describe, regime_budgets


def wants_cap(reg: Regime | None, opts) -> bool:
    """A regime with a cap, asked for with a cgroup, and not yet inside one (the child is)."""
    return bool(reg and reg.memory_cap_bytes and not opts.no_cgroup and own_cap() is None)


def child_argv(args, opts, work: Path) -> list[str]:
    """This bench again, for the child inside the cap: same options, JSON out, no peer (the parent runs it)."""
    argv = [sys.executable, "-m", "engine.tools.cli", "bench", "--preset", args.preset, "--quant", args.quant,
            "--device", args.device, "--prompt-tokens", str(args.prompt_tokens), "--new-tokens", str(args.new_tokens),
            "--json", "--work-dir", str(work), "--regime", opts.regime, "--dtype", opts.dtype,
            "--baseline-new-tokens", str(opts.baseline_new_tokens), "--top-k", str(opts.top_k), "--top-p", str(opts.top_p)]
    for flag, value in (("--vram-budget", args.vram_budget), ("--ram-cache", args.ram_cache), ("--baseline", args.baseline),
                        ("--dense-quant", opts.dense_quant)):
        if value is not None:
            argv += [flag, str(value)]
    return argv + [flag for flag, on in (("--via-repack", opts.via_repack), ("--eager", opts.eager),
                                         ("--keep-page-cache", opts.keep_page_cache)) if on]


def measure_capped(args, opts, reg: Regime, work: Path, log) -> tuple[dict | None, str | None]:
    """(result, None) from the child run inside a fresh cap, or (None, why) where no cap can be made."""
    try:
        cap = MemoryCap.create(f"sluice-bench-{os.getpid()}", reg.memory_cap_bytes)
    except CgroupUnavailable as exc:
        return None, str(exc)
    dropped = not opts.keep_page_cache and drop_page_cache()
    log(f"{describe(reg, capped=True)}: running the bench inside {cap.path}")
    try:
        proc = subprocess.run(cap.command(child_argv(args, opts, work)), stdout=subprocess.PIPE, text=True,
                              env=cap.env(), cwd=os.getcwd())
        peak = cap.peak_bytes()
    finally:
        cap.remove()
    if proc.returncode != 0:
        killed = proc.returncode in (-9, 137)
        raise SluiceError(f"The bench run inside the {reg.memory_cap_bytes / 2**30:.2f} GiB cap "
                          + ("was killed, most likely by the cap's out-of-memory killer: give it a smaller --ram-cache."
                             if killed else f"failed (exit {proc.returncode}); its messages are above."))
    result = json.loads(proc.stdout)
    result["regime"]["memory_cap"].update(peak_bytes=peak, page_cache_dropped=dropped)
    return result, None


def apply_regime(args, opts, reg: Regime, why_no_cap: str | None) -> dict:
    """Set the regime's budgets on `args` (the user's flags win) and describe how the cap was applied."""
    inside = own_cap()
    args.vram_budget, args.ram_cache = regime_budgets(reg, args.vram_budget, args.ram_cache, capped=inside is not None)
    if reg.memory_cap_bytes is None:
        cap = {"method": "none (RAM unconstrained)"}
    elif inside is not None:
        cap = {"method": "cgroup v2 memory.max (process + page cache)", **inside}
    else:
        cap = {"method": "budgets only", "why": why_no_cap or "--no-cgroup", "ram_cache": args.ram_cache}
    if inside is None and not opts.keep_page_cache:
        cap["page_cache_dropped"] = drop_page_cache()
    return {"name": reg.name, "summary": reg.summary, "cap_bytes": reg.memory_cap_bytes, "vram_budget": args.vram_budget,
            "memory_cap": cap}


def regime_lines(r: dict) -> list[str]:
    g = r.get("regime")
    if not g:
        return []
    cap = g["memory_cap"]
    line = f"regime       {g['name']}: {g['summary']}; memory cap: {cap['method']}"
    if cap.get("peak_bytes"):
        line += f", cgroup peak {cap['peak_bytes'] / 2**30:.2f} of {g['cap_bytes'] / 2**30:.2f} GiB"
    if cap.get("why"):
        ram = format_size(parse_size(cap["ram_cache"])) if cap["ram_cache"] else "the engine's default"
        line += f" ({cap['why']}; RAM cache {ram})"
    return [line]
