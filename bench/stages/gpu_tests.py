"""pytest on the GPU box, by named group; the output goes to OUT/pytest.txt and its tail is printed.

    python -m bench gpu-tests [GROUP ...] [--timeout 500]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench.common import ROOT, append_log

GROUPS = {
    "default": (("tests/kernels", "tests/streaming"), ("-k", "not bench")),
    "families": (("tests/families",), ("-m", "gpu")),
    "prefill": (("tests/kernels/test_moe_prefill.py", "tests/streaming/test_prefill_kernel.py"), ()),
    "activations": (("tests/kernels/test_moe_activations.py", "tests/streaming/test_activation_kernels.py"), ()),
    "dense": (("tests/kernels/test_int8_linear.py", "tests/streaming/test_dense_int8.py",
               "tests/streaming/test_pieces.py"), ()),
    "warmup": (("tests/engine/test_kernel_warmup.py",), ("-m", "gpu")),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("groups", nargs="*", default=["default"], metavar="GROUP",
                   help="; ".join(f"{name}: {' '.join(paths + extra)}" for name, (paths, extra) in GROUPS.items()))
    p.add_argument("--timeout", type=int, help="seconds for each group (pytest's children stop with it)")


def run(args) -> int:
    from engine.errors import SluiceError
    if unknown := [g for g in args.groups if g not in GROUPS]:
        raise SluiceError(f"Unknown test group {', '.join(unknown)}: choose among {', '.join(GROUPS)}.")
    worst = 0
    for name in args.groups:
        paths, extra = GROUPS[name]
        cmd = [sys.executable, "-m", "pytest", *paths, "-q", "-p", "no:cacheprovider", *extra]
        start = time.perf_counter()
        proc = subprocess.run(["timeout", str(args.timeout), *cmd] if args.timeout else cmd, cwd=ROOT,
                              capture_output=True, text=True)
        append_log(args.out, "pytest.txt", f"===== {name}: {' '.join(cmd[3:])}\n{proc.stdout[-200000:]}\n"
                                           f"{proc.stderr[-20000:]}\n")
        tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
        print(f"--- {name}: rc {proc.returncode} in {time.perf_counter() - start:.0f} s\n{tail}", flush=True)
        worst = max(worst, proc.returncode)
    return worst
