"""A/B switches read from the environment (SLUICE_PREFETCH_READS=N, ...): measured alternatives to a default."""
from __future__ import annotations

import os


def env_int(name: str) -> int | None:
    """The integer the variable holds, or None when it is unset or empty (the default applies)."""
    value = os.environ.get(name, "").strip()
    return int(value) if value else None


def cublas_free() -> bool:
    """SLUICE_CUBLAS_FREE=1: softmax top-k routers (kernels.router) and int8 dense weights' prompts
    (kernels.int8_linear.int8_gemm_kernel) in Triton, so no cuBLAS module (~81 MiB of host memory) loads.
    Off until measured on a GPU (gpu_check.py cublas-free-ab)."""
    return env_int("SLUICE_CUBLAS_FREE") == 1
