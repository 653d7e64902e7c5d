"""qwen4_exp's gated hyper-connections: the residual is n streams side by side, x [T, n * H].

Before a block the streams are normalised per stream (grouped RMSNorm, 1 + w) and mixed into its input by a
low-rank gate: input = mean_k(sigmoid(up(silu(down(x_n) / n)))[k] * x_n[k]). After it the block's output is
added to every stream with its own weight 2 * sigmoid(inject(x_n) / n). The model's last mixer has no inject.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.model.layers import linear
from kernels.hyper_ref import TORCH_STEPS, HyperSteps
from kernels.norms import grouped_norm_ref


class GroupedNorm:
    """RMSNorm over each `group` dims of x [T, n * group] in float32, times (1 + w) (made once at load), cast back;
    `kernel` (kernels/rms_norm.grouped_norm_kernel) where engine.runtime.attach set it."""

    def __init__(self, weight: torch.Tensor, group: int, eps: float):
        self.scale, self.group, self.eps = 1.0 + weight.float(), group, eps
        self.kernel = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (self.kernel or grouped_norm_ref)(x, self.scale, self.group, self.eps)


class MixSteps:
    """A GatedResidual's elementwise steps: `kernel` (kernels/hyper_mix.py's, one launch a step) where
    engine.runtime.attach set it, else None: torch (kernels/hyper_ref.py)."""

    def __init__(self):
        self.kernel: HyperSteps | None = None

    @property
    def run(self) -> HyperSteps:
        return self.kernel or TORCH_STEPS


@dataclass(frozen=True)
class GatedResidual:
    norm: GroupedNorm              # over each stream
    down: torch.Tensor             # [R, n * H]
    up: torch.Tensor               # [n * H, R]
    inject: torch.Tensor | None    # [n, n * H]
    count: int                     # n
    hidden: int                    # H
    steps: MixSteps = field(default_factory=MixSteps, compare=False)

    @classmethod
    def load(cls, w: dict, prefix: str, count: int, hidden: int, eps: float) -> "GatedResidual":
        return cls(GroupedNorm(w[prefix + "hc_norm.weight"], hidden, eps), w[prefix + "input_mix_weight_down.weight"],
                   w[prefix + "input_mix_weight_up.weight"], w.get(prefix + "block_inject_weight.weight"),
                   count, hidden)

    def mix(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [T, n * H] -> block input [T, H] and per-stream output weights [T, n] (None for the last mixer);
        R = the gate's rank."""
        steps = self.steps.run
        normed = self.norm(x)                                                           # [T, n * H]
        rank_in = steps.scaled_silu(linear(normed, self.down), self.count)              # [T, R]
        block_input = steps.gated_mean(linear(rank_in, self.up), normed, self.count)    # [T, H]
        if self.inject is None:
            return block_input, None
        return block_input, steps.stream_weights(linear(normed, self.inject), self.count)   # [T, n]

    def add(self, x: torch.Tensor, out: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Streams after a block: x [T, n * H] + out [T, H] weighted per stream by this mix's weights [T, n]."""
        return self.steps.run.inject(x, out, weights)
