"""The speeds hybrid execution measures at load (an expert on the CPU, a block over PCIe), kept per machine.

Measuring the CPU's expert means loading its fused kernel (kernels.cpu_moe), and numba then holds 35-130 MiB
of the process for its whole life (its import, the compiled loops, LLVM's heap) even where the measurement
says copying is faster and the CPU computes nothing (the H200 box: BENCHMARKS.md session 20). So the speeds
are kept on disk beside the kernel verdicts, and a later load that finds them saying "copying is faster" does
not build the CPU's share at all. The first load on a machine measures in the kernel warm-up child
(engine/runtime/kernel_warmup.py), so even the app's first start stays lean. The key holds what the speeds
depend on: the GPU, driver and libraries, the CPU and its threads, the block's format and shape.
"""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch


def speeds_path() -> Path:
    from kernels.selfcheck import cache_path
    return cache_path().with_name("placement_speeds.json")


def speeds_key(device: torch.device, layout, activation, dtype: torch.dtype, threads: int) -> str:
    from kernels.selfcheck import device_fingerprint
    return "|".join([device_fingerprint(device), _cpu_name(), f"{threads} threads", layout.fmt,
                     f"{layout.intermediate}x{layout.hidden}", f"{layout.block_bytes} bytes",
                     getattr(activation, "name", "none"), str(dtype).removeprefix("torch."),
                     os.environ.get("SLUICE_FUSED_CPU_EXPERTS", "")])


def recall(key: str) -> dict | None:
    try:
        found = json.loads(speeds_path().read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    ok = isinstance(found, dict) and all(isinstance(found.get(k), (int, float)) for k in ("cpu_expert_s", "copy_s"))
    return found if ok else None


def remember(key: str, speeds: dict) -> None:
    path = speeds_path()
    try:
        known = json.loads(path.read_text())
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    known[key] = speeds
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass           # an unwritable cache only means the speeds are measured again at the next load


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
