"""The model pieces' kernel switches, read from the environment until the model code takes its kernels from the
options (engine/options.py) at load: the last environment switches of the engine."""
from __future__ import annotations

import os


def env_int(name: str) -> int | None:
    """The integer the variable holds, or None when it is unset or empty (the default applies)."""
    value = os.environ.get(name, "").strip()
    return int(value) if value else None


# The model pieces' kernels (RMS norms, one decode token's attention, the rotation of queries and keys), on
# unless set to 0.
NORM_KERNEL, ATTN_KERNEL = "SLUICE_NORM_KERNEL", "SLUICE_ATTN_KERNEL"
ROPE_KERNEL = "SLUICE_ROPE_KERNEL"


def piece_on(name: str) -> bool:
    return env_int(name) != 0


def piece_kernels() -> list[str]:
    """The model pieces' kernel switches that are on (engine.model.layers.checked_kernel reads each)."""
    return [name for name in (NORM_KERNEL, ATTN_KERNEL, ROPE_KERNEL) if piece_on(name)]


def cublas_free() -> bool:
    """On unless SLUICE_CUBLAS_FREE=0: softmax top-k routers (kernels.router) and int8 dense weights' prompts
    (kernels.int8_linear.int8_gemm_kernel) in Triton, so no cuBLAS, topk or softmax module loads on the model's
    path (less anonymous memory, which the caches then get)."""
    return env_int("SLUICE_CUBLAS_FREE") != 0
