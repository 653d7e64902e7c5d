"""RMS norm in plain torch (no Triton: the CPU app imports it): the models' path (engine.model.layers.rms_norm)
and the reference of its Triton kernel (kernels/rms_norm.py).

  x [..., N] -> x / sqrt(mean(x^2) + eps), computed in float32, rounded to x's dtype, times weight [N]
"""
from __future__ import annotations

import torch

MAX_N = 16384          # kernels/rms_norm.py keeps a row in registers; wider rows keep this torch path


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # x * x, not pow(2): the same values (torch squares by a product on both devices), and one torch CUDA
    # module fewer (each one's first launch holds host memory for the process's life: pow's is 47 MiB)
    x32 = x.float()
    x32 = x32 * torch.rsqrt((x32 * x32).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)
