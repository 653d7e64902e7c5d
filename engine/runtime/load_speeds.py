"""The speeds hybrid execution measures at load (an expert on the CPU, a block over PCIe), kept per machine.

Measuring the CPU's expert means loading its fused kernel (kernels.cpu_moe), and numba then holds 35-130 MiB
of the process for its whole life (its import, the compiled loops, LLVM's heap) even where the measurement
says copying is faster and the CPU computes nothing. So the speeds
are kept on disk beside the kernel verdicts, and a later load that finds them saying "copying is faster" does
not build the CPU's share at all. The first load on a machine measures in the kernel warm-up child
(engine/runtime/kernel_warmup.py), so even the app's first start stays lean. The key holds what the speeds
depend on: the GPU, driver and libraries, the CPU and its threads, the block's format and shape.
"""
from __future__ import annotations

from pathlib import Path

import torch

from engine.host import cpu_name
from kernels.selfcheck import cache_path, device_fingerprint, load_json, save_json


def speeds_path() -> Path:
    return cache_path().with_name("placement_speeds.json")


def speeds_key(device: torch.device, layout, activation, dtype: torch.dtype, threads: int, cpu_kernel: str,
               copy_rate_gbps: float | None = None) -> str:
    """(Copies paced to a simulated slower link, Options.copy_rate_gbps, are another machine's speeds.)"""
    paced = [f"copies paced to {copy_rate_gbps:g} GB/s"] if copy_rate_gbps is not None else []
    return "|".join([device_fingerprint(device), cpu_name(), f"{threads} threads", layout.fmt,
                     f"{layout.intermediate}x{layout.hidden}", f"{layout.block_bytes} bytes",
                     getattr(activation, "name", "none"), str(dtype).removeprefix("torch."),
                     f"cpu kernel {cpu_kernel}", *paced])


def recall(key: str) -> dict | None:
    found = _known().get(key)
    ok = isinstance(found, dict) and all(isinstance(found.get(k), (int, float)) for k in ("cpu_expert_s", "copy_s"))
    return found if ok else None


def remember(key: str, speeds: dict) -> None:
    """(An unwritable cache only means the speeds are measured again at the next load.)"""
    save_json(speeds_path(), {**_known(), key: speeds})


def _known() -> dict:
    known = load_json(speeds_path())            # {} when missing or damaged
    return known if isinstance(known, dict) else {}
