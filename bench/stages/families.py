"""`sluice bench` of each family's preset at its budgets: decode, cold and warm prefill, roofline efficiency and
where the time goes, one report each (the per-family matrix of issue 37 grows here).

    python -m bench families [NAME ...] [-- extra sluice bench flags, e.g. --set KEY=VALUE]

NAME is a run below (default: all); each is the `sluice bench` command printed before its report.
"""
from __future__ import annotations

import argparse

from bench.common import run_sluice_bench, save_json, summary_line

EIGHT = ["--vram-budget", "8GB", "--ram-cache", "8GB"]       # a desktop GPU's VRAM and a RAM cache beside it
RUNS = {
    "olmoe-1b-7b": ["--preset", "olmoe-1b-7b", "--quant", "int8", "--dense-quant", "int8", *EIGHT,
                    "--prompt-tokens", "512", "--new-tokens", "128"],
    "qwen3-30b-a3b": ["--preset", "qwen3-30b-a3b", "--quant", "fp8", "--vram-budget", "7GiB", "--ram-cache", "2GiB",
                      "--prompt-tokens", "2048", "--new-tokens", "24"],
    "gpt-oss-120b": ["--preset", "gpt-oss-120b", "--quant", "mxfp4", *EIGHT, "--prompt-tokens", "512",
                     "--new-tokens", "64"],
    "qwen3.5-35b-a3b": ["--preset", "qwen3.5-35b-a3b", "--quant", "nvfp4", *EIGHT, "--prompt-tokens", "512",
                        "--new-tokens", "32"],
    "deepseek-v2-lite": ["--preset", "deepseek-v2-lite", "--quant", "fp8", "--vram-budget", "6GB", "--ram-cache", "8GB",
                         "--prompt-tokens", "512", "--new-tokens", "64"],
    "deepseek-v4-flash-4l": ["--preset", "deepseek-v4-flash-4l", "--quant", "mxfp4", *EIGHT, "--prompt-tokens", "256",
                             "--new-tokens", "32"],
    # int8 dense weights: the whole model's are ~9.9 GB in bf16
    "qwen3.8-flash-next-4l": ["--preset", "qwen3.8-flash-next-4l", "--quant", "nvfp4", "--dense-quant", "int8",
                              *EIGHT, "--prompt-tokens", "512", "--new-tokens", "64"],
    # the same HF checkpoint in transformers + accelerate under the same budgets
    "olmoe-vs-accelerate": ["--preset", "olmoe-1b-7b", "--quant", "fp8", "--vram-budget", "4GiB", "--ram-cache", "2GiB",
                            "--prompt-tokens", "32", "--new-tokens", "64", "--baseline", "accelerate",
                            "--baseline-new-tokens", "6"],
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", metavar="NAME", help=f"runs: {', '.join(RUNS)} (default: all)")


def run(args) -> int:
    from engine.errors import SluiceError
    from engine.tools.bench import report
    unknown = [name for name in args.names if name not in RUNS]
    if unknown:
        raise SluiceError(f"Unknown run {', '.join(unknown)}: choose among {', '.join(RUNS)}.")
    results, failed = {}, 0
    for name in args.names or list(RUNS):
        flags = [*RUNS[name], *args.bench_args]
        print(f"--- {name}: sluice bench {' '.join(flags)}", flush=True)
        try:
            results[name] = run_sluice_bench(flags, args.work_dir, args.out)
        except SluiceError as exc:                 # one family failing leaves the others to run
            print(f"{name}: {exc}", flush=True)
            failed += 1
            continue
        print(report(results[name]) + f"\nsummary      {summary_line(results[name])}", flush=True)
        save_json(args.out, "families", results)
    return 1 if failed else 0
