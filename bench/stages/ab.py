"""Alternated `sluice bench` runs on one machine: option settings against each other, or this tree against an
older checkout, round after round (every other round in reverse order), one summary line a run.

    python -m bench ab --regime fits-ram --rounds 2 --variant - --variant "prefetch_copies=8" \
        -- --preset olmoe-1b-7b --quant int8 --dense-quant int8 --prompt-tokens 512 --new-tokens 128
    git worktree add /tmp/old-tree <commit>          (or: git archive <commit> | tar -x -C /tmp/old-tree)
    python -m bench ab --regime fits-ram --rounds 3 --tree /tmp/old-tree -- --preset olmoe-1b-7b ...

A variant is "-" (the defaults) or space-separated KEY=VALUE settings of engine/options.py, each passed to
`sluice bench` as --set KEY=VALUE. Each --tree adds an older checkout's own defaults as one more variant.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from bench.common import run_sluice_bench, save_json, summary_line
from bench.regimes import REGIMES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--variant", action="append", default=[], metavar="'KEY=VALUE ...'",
                   help="option settings of one variant, '-' for the defaults; repeat for each")
    p.add_argument("--tree", type=Path, action="append", default=[],
                   help="an older checkout, run with its own defaults as one more variant; repeat for each")
    p.add_argument("--rounds", type=int, default=2, help="rounds of every variant in turn (default 2)")
    p.add_argument("--warmup", action="store_true", help="one unreported run first (a fresh machine's first run is slow)")
    p.add_argument("--regime", choices=list(REGIMES), help="run each in this regime (python -m bench regime)")
    p.add_argument("--no-cgroup", action="store_true", help="with --regime: the cap as budgets only")
    p.add_argument("--keep-page-cache", action="store_true", help="with --regime: do not drop the page cache")


def variants(args) -> list[tuple[str, list[str], Path | None]]:
    """(label, extra sluice bench flags, tree or None for this one) for each variant, in the order they run."""
    out = [("defaults", [], None) if setting == "-" else
           (setting, [flag for item in setting.split() for flag in ("--set", item)], None)
           for setting in args.variant or ["-"]]
    return out + [(f"tree {tree}", [], tree.resolve()) for tree in args.tree]


def run(args) -> int:
    from engine.options import Options
    for setting in args.variant:
        if setting != "-":
            Options.parse(setting.split())             # a typo: one sentence before any run
    runs = variants(args)
    if args.warmup:
        _one(args, runs[0][1], runs[0][2])
    results = []
    for round_ in range(1, args.rounds + 1):
        for label, flags, tree in runs if round_ % 2 else runs[::-1]:     # ABBA: no variant always runs first
            r = _one(args, flags, tree)
            results.append({"round": round_, "variant": label, "result": r})
            print(f"round {round_} [{label}]: {summary_line(r)}", flush=True)
    save_json(args.out, "ab", results)
    return 0


def _one(args, flags: list[str], tree: Path | None) -> dict:
    bench_args = [*args.bench_args, *flags]
    if not args.regime:
        return run_sluice_bench(bench_args, args.work_dir, args.out, **({"tree": tree} if tree else {}))
    from bench.stages.regime import measure_in_regime
    in_regime = argparse.Namespace(**vars(args), llama_bench=None, llama_gguf=None)
    return measure_in_regime(in_regime, bench_args, tree)
