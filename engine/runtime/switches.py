"""A/B switches read from the environment (SLUICE_PREFETCH_READS=N, ...): measured alternatives to a default."""
from __future__ import annotations

import os


def env_int(name: str) -> int | None:
    """The integer the variable holds, or None when it is unset or empty (the default applies)."""
    value = os.environ.get(name, "").strip()
    return int(value) if value else None


NORM_KERNEL, ATTN_KERNEL = "SLUICE_NORM_KERNEL", "SLUICE_ATTN_KERNEL"      # model pieces' kernels, off until measured


def piece_kernels() -> list[str]:
    """The model pieces' kernel switches set to 1 (engine.model.layers.checked_kernel reads each)."""
    return [name for name in (NORM_KERNEL, ATTN_KERNEL) if env_int(name) == 1]


def cublas_free() -> bool:
    """On unless SLUICE_CUBLAS_FREE=0: softmax top-k routers (kernels.router) and int8 dense weights'
    prompts (kernels.int8_linear.int8_gemm_kernel) in Triton, so no cuBLAS, topk or softmax module loads
    on the model's path (BENCHMARKS.md run 56: 610 MiB of anonymous memory besides the RAM cache against
    747, and the memory freed went to the caches: decode 43.9 against 32.9 tok/s under the 4 GiB cap)."""
    return env_int("SLUICE_CUBLAS_FREE") != 0
