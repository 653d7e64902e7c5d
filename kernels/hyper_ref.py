"""qwen4_exp's gated hyper-connections' elementwise steps in plain torch (no Triton: the CPU app imports it): the
models' path and the references of their one-launch kernels (kernels/hyper_mix.py). n = streams, H = hidden,
R = the gate's rank, T = tokens; every tensor is in the compute dtype, each step rounds where its torch ops do.

  scaled_silu_ref:    down's output d [T, R] -> silu(d / n)                                 (the up linear's input)
  gated_mean_ref:     up's output u [T, n * H], the normed streams [T, n * H] -> mean_k(sigmoid(u)[k] * normed[k]) [T, H]
  stream_weights_ref: inject's output i [T, n] -> 2 * sigmoid(i / n)                        (each stream's weight)
  inject_ref:         streams x [T, n * H], a block's out [T, H], weights [T, n] -> x + out * weights[k] per stream
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


def scaled_silu_ref(d: torch.Tensor, count: int) -> torch.Tensor:
    return F.silu(d / count)


def gated_mean_ref(u: torch.Tensor, normed: torch.Tensor, count: int) -> torch.Tensor:
    gate = torch.sigmoid(u)
    return (gate.unflatten(-1, (count, -1)) * normed.unflatten(-1, (count, -1))).mean(dim=-2)


def stream_weights_ref(i: torch.Tensor, count: int) -> torch.Tensor:
    return 2 * torch.sigmoid(i / count)


def inject_ref(x: torch.Tensor, out: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return x + (out.unsqueeze(-2) * weights.unsqueeze(-1)).flatten(-2)


@dataclass(frozen=True)
class HyperSteps:
    """The four steps, as torch runs them (TORCH_STEPS) or as kernels (kernels/hyper_mix.py's, once checked)."""
    scaled_silu: Callable[[torch.Tensor, int], torch.Tensor]
    gated_mean: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
    stream_weights: Callable[[torch.Tensor, int], torch.Tensor]
    inject: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


TORCH_STEPS = HyperSteps(scaled_silu_ref, gated_mean_ref, stream_weights_ref, inject_ref)
