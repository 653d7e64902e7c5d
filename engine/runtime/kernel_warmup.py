"""A machine's first load of a model checks and compiles its GPU kernels in a child process.

Before a fast kernel runs, kernels.selfcheck compares it with its torch reference on random data of the
model's shapes, and Triton compiles it. Both leave the process bigger for its whole life: the references'
CUDA operator modules (float64 norms, `index_add_`, `sort`, `unique`...) stay loaded, and the compiler's
heap stays fragmented: a first start held ~300 MiB more than later ones, and a RAM cache sized under a memory
cap after it was that much smaller for the process's life. The verdicts and compiled kernels are cached on
disk, so a child that loads the model, runs one prompt and exits leaves the parent only cache hits: its first
start is as lean as every later one.

One marker per machine, model and setting (kernel_warmups.json beside the verdicts) says it was done. A
child that fails (no memory, a crash, a timeout) costs nothing but its time: the parent checks in-process
as before, and the marker is written either way, so a failing child is not retried at every start.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from engine.options import Options

PROMPT_TOKENS = 16         # more than kernels.int8_linear.MAX_KERNEL_TOKENS: the prompt paths are compiled too
TIMEOUT_S = 900
MESSAGE = "checking the GPU kernels on this machine (once)"
CHILD_MODULE = "engine.tools.kernel_warmup"    # the child loads through the public API, an edge above the runtime


def marker_path() -> Path:
    from kernels.selfcheck import cache_path
    return cache_path().with_name("kernel_warmups.json")


def warmup_key(model_path: Path, device: torch.device, dtype: torch.dtype, dense_quant: str | None) -> str:
    """What the child's verdicts and compiled kernels depend on: this GPU, driver and Triton, the kernels'
    versions, the model and the settings that choose kernels."""
    from kernels.selfcheck import device_fingerprint
    versions = []
    for name in ("kernels.moe_decode", "kernels.moe_prefill", "kernels.int8_linear", "kernels.router",
                 "kernels.top_candidates", "kernels.rms_norm", "kernels.decode_attention", "kernels.rope",
                 "kernels.mla_decode", "kernels.deltanet_decode", "kernels.hyper_mix"):
        try:
            versions.append(str(__import__(name, fromlist=["KERNEL_VERSION"]).KERNEL_VERSION))
        except ImportError:                       # no Triton: no kernels to warm
            versions.append("none")
    return "|".join([device_fingerprint(device), str(Path(model_path).resolve()), str(dtype).removeprefix("torch."),
                     dense_quant or "none", ".".join(versions)])


def _marked() -> dict:
    try:
        return json.loads(marker_path().read_text())
    except (OSError, ValueError):
        return {}


def _mark(key: str, outcome: str) -> None:
    marks = _marked()
    marks[key] = outcome
    path = marker_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(marks, indent=1))
        tmp.replace(path)
    except OSError:
        pass                                      # a read-only cache: the child runs again next time


def ensure_warm(model_path: Path, device: torch.device, dtype: torch.dtype, dense_quant: str | None,
                options: Options = Options(), progress=None) -> str | None:
    """Run the child once per key (never with options.kernel_warmup off). Returns what happened: "warmed",
    "failed: ..." or None when nothing was run. `progress` is called every half second while the child
    runs; whatever it raises (the app's load cancelled) stops the child and goes on up, nothing marked."""
    if not options.kernel_warmup:
        return None
    key = warmup_key(model_path, device, dtype, dense_quant)
    if key in _marked():
        return None
    cmd = [sys.executable, "-m", CHILD_MODULE, str(model_path), "--device", str(device),
           "--dtype", str(dtype).removeprefix("torch.")] + (["--dense-quant", dense_quant] if dense_quant else [])
    cmd += child_settings(options)
    with tempfile.TemporaryFile("w+") as errors:          # a file, not a pipe: a chatty child cannot block on it
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errors, text=True)
        except OSError as exc:
            outcome = f"failed: {exc}"
        else:
            outcome = _wait(proc, errors, progress)
    _mark(key, outcome)
    return outcome


def child_settings(options: Options) -> list[str]:
    """The child's argv for the parent's options (`--set KEY=VALUE` each), its own warm-up off."""
    child = options.replace(kernel_warmup=False)
    return [arg for f in dataclasses.fields(child) for arg in ("--set", f"{f.name}={getattr(child, f.name)}")]


def _wait(proc: subprocess.Popen, errors, progress) -> str:
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while proc.poll() is None:
            if progress is not None:               # no total: the app shows a busy bar with the message
                progress(0, 0, MESSAGE)
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                return f"failed: it took longer than {TIMEOUT_S} s"
            try:
                proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if proc.returncode == 0:
        return "warmed"
    errors.seek(0)
    last = (errors.read().strip().splitlines() or [f"exit status {proc.returncode}"])[-1]    # the error's sentence
    return f"failed: {last}"
