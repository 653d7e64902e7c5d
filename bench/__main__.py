"""`python -m bench STAGE ...`: the bench tree's one entry point."""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from engine.errors import SluiceError

# stage -> (module in bench/stages with add_arguments(parser) and run(args) -> exit code, what it measures)
STAGES = {
    "kernels": ("kernels", "batch-1 expert kernels (and the int8 dense linear) against HBM copy bandwidth"),
    "prefill-kernel": ("prefill_kernel", "the grouped-GEMM prefill kernel against the torch path; ptxas offline"),
    "gpu-tests": ("gpu_tests", "pytest groups on the GPU box"),
    "logits": ("logits", "bf16 against float32 logits, transformers' own difference as the yardstick"),
    "families": ("families", "`sluice bench` of each family's preset at its budgets"),
    "regime": ("regime", "`sluice bench` inside a memory regime's cgroup cap, llama.cpp beside it"),
    "ab": ("ab", "alternated runs of option settings (--set) or of an older tree"),
    "peer": ("peer", "llama.cpp: build llama-bench, convert a preset to GGUF, sweep -ncmoe"),
    "matrix": ("matrix", "each family in each regime, Sluice against llama.cpp on the same checkpoint, one table"),
    "profile": ("profile", "where a decode token's time goes: py-spy, torch.profiler trace, GPU timeline"),
    "host-calls": ("host_calls", "what each host call of a streaming decode layer costs"),
    "cpu-experts": ("cpu_experts", "how fast this host computes routed experts from the RAM cache"),
    "gui-stream": ("gui_stream", "how smooth the chat window stays while a long answer streams"),
}
PASSES_BENCH_FLAGS = {"families", "regime", "ab", "matrix"}     # stages that hand unknown flags on to `sluice bench`


def build_parser(stage: str | None) -> argparse.ArgumentParser:
    """The entry point's parser; only the chosen stage's module is imported (some import torch at once)."""
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "/tmp/bench-out"),
                   help="where JSON and logs go (default: $OUT, else /tmp/bench-out)")
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/sb"),
                   help="where the bench's models are built and kept (default /tmp/sb)")
    sub = p.add_subparsers(dest="stage", required=True, metavar="STAGE")
    for name, (module, summary) in STAGES.items():
        if name != stage:
            sub.add_parser(name, help=summary)
            continue
        mod = importlib.import_module(f"bench.stages.{module}")
        parser = sub.add_parser(name, help=summary, description=mod.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(parser)
        parser.set_defaults(run=mod.run)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(next((a for a in argv if a in STAGES), None))
    args, rest = parser.parse_known_args(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if rest and args.stage not in PASSES_BENCH_FLAGS:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.bench_args = rest
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        return args.run(args)
    except SluiceError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
