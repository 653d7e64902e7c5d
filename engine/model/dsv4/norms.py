"""DeepSeek-V4's RMS norms on the one core (kernels/norms.py): the weights are float32 and multiply before the
cast back; the unweighted norm multiplies x by its inverse RMS rounded to x's dtype, as the reference does."""
from __future__ import annotations

import torch

from engine.model.layers import RmsNorm
from kernels.norms import inverse_rms, rms_normalized


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return (weight * rms_normalized(x, eps)).to(x.dtype)


def unweighted_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * inverse_rms(x, eps).to(x.dtype)


class Dsv4RmsNorm(RmsNorm):
    """The model's final norm (float32 weight); no kernel."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
