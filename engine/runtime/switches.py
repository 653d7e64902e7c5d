"""A/B switches read from the environment (SLUICE_PREFETCH_READS=N, ...): measured alternatives to a default."""
from __future__ import annotations

import os


def env_int(name: str) -> int | None:
    """The integer the variable holds, or None when it is unset or empty (the default applies)."""
    value = os.environ.get(name, "").strip()
    return int(value) if value else None


def fused_cpu_experts() -> int | None:
    """SLUICE_FUSED_CPU_EXPERTS: unset, the CPU's int8 experts go through kernels.cpu_moe where it matches the
    reference and is faster than the family's torch expert at load (CpuExperts.choose_kernel); 0 keeps torch
    (an A/B); 1 takes the fused kernel whenever it matches (tests)."""
    return env_int("SLUICE_FUSED_CPU_EXPERTS")


def cpu_live_factor() -> float | None:
    """SLUICE_CPU_LIVE_FACTOR: what an expert computed on the CPU while decoding is taken to cost, in multiples
    of its time at load (engine.runtime.placement.LIVE_FACTOR when unset); an A/B of the CPU's share
    (BENCHMARKS.md run 75: at 0.5 the share came on and cost 18% in fits-ram on the H200 box)."""
    value = os.environ.get("SLUICE_CPU_LIVE_FACTOR", "").strip()
    return float(value) if value else None
