"""A/B switches read from the environment (SLUICE_PREFETCH_READS=N, ...): measured alternatives to a default."""
from __future__ import annotations

import os


def env_int(name: str) -> int | None:
    """The integer the variable holds, or None when it is unset or empty (the default applies)."""
    value = os.environ.get(name, "").strip()
    return int(value) if value else None


# The model pieces' kernels (RMS norms, one decode token's attention), on unless set to 0: on the H200 box they
# took 80 MiB off the process (611 -> 531 MiB anonymous besides the RAM cache) at the same decode speed
# (BENCHMARKS.md run 60).
NORM_KERNEL, ATTN_KERNEL = "SLUICE_NORM_KERNEL", "SLUICE_ATTN_KERNEL"
# A step's queries and keys rotated in one launch (kernels/rope.py), not ten (session 17).
ROPE_KERNEL = "SLUICE_ROPE_KERNEL"


def piece_on(name: str) -> bool:
    return env_int(name) != 0


def piece_kernels() -> list[str]:
    """The model pieces' kernel switches that are on (engine.model.layers.checked_kernel reads each)."""
    return [name for name in (NORM_KERNEL, ATTN_KERNEL, ROPE_KERNEL) if piece_on(name)]


def cublas_free() -> bool:
    """On unless SLUICE_CUBLAS_FREE=0: softmax top-k routers (kernels.router) and int8 dense weights'
    prompts (kernels.int8_linear.int8_gemm_kernel) in Triton, so no cuBLAS, topk or softmax module loads
    on the model's path (BENCHMARKS.md run 56: 610 MiB of anonymous memory besides the RAM cache against
    747, and the memory freed went to the caches: decode 43.9 against 32.9 tok/s under the 4 GiB cap)."""
    return env_int("SLUICE_CUBLAS_FREE") != 0


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
