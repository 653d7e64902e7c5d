"""RMS norm in plain torch (no Triton: the CPU app imports it): the core every family's RMS norm is built on, the
models' plain norm and the reference of its Triton kernel (kernels/rms_norm.py).

  x [..., N] -> x / sqrt(mean(x^2) + eps), computed in float32; each variant applies its weight and rounds
  as its reference does (here: rounded to x's dtype, then times weight [N])
"""
from __future__ import annotations

import torch

MAX_N = 16384          # kernels/rms_norm.py keeps a row in registers; wider rows keep this torch path


def inverse_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / sqrt(mean(x^2) + eps) over the last dim, in float32 [..., 1]."""
    # x * x, not pow(2): the same values (torch squares by a product on both devices), and one torch CUDA
    # module fewer (each one's first launch holds host memory for the process's life: pow's is 47 MiB)
    x32 = x.float()
    return torch.rsqrt((x32 * x32).mean(-1, keepdim=True) + eps)


def rms_normalized(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x divided by its root mean square, in float32."""
    x32 = x.float()
    return x32 * inverse_rms(x32, eps)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * rms_normalized(x, eps).to(x.dtype)


def grouped_norm_ref(x: torch.Tensor, scale: torch.Tensor, group: int, eps: float) -> torch.Tensor:
    """RMS norm over each `group` dims of x [..., n * group], times scale [n * group] (float32), rounded once to
    x's dtype (qwen4_exp's hyper-connection and PLE norms, whose scale is 1 + w)."""
    normed = rms_normalized(x.unflatten(-1, (-1, group)), eps).flatten(-2)
    return (normed * scale).to(x.dtype)
