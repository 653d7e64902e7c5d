"""qwen4_exp's gated hyper-connections: the residual is n streams side by side, x [T, n * H].

Before a block the streams are normalised per stream (grouped RMSNorm, 1 + w) and mixed into its input by a
low-rank gate: input = mean_k(sigmoid(up(silu(down(x_n) / n)))[k] * x_n[k]). After it the block's output is
added to every stream with its own weight 2 * sigmoid(inject(x_n) / n). The model's last mixer has no inject.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.model.layers import linear


def offset_scale(weight: torch.Tensor) -> torch.Tensor:
    """An offset norm's scale (1 + w) in float32, made once at load."""
    return 1.0 + weight.float()


def grouped_offset_norm(x: torch.Tensor, scale: torch.Tensor, group: int, eps: float) -> torch.Tensor:
    """RMSNorm over each `group` dims of x [T, n * group] (float32), times scale (`offset_scale`), cast back."""
    x32 = x.float().unflatten(-1, (-1, group))
    x32 = (x32 * torch.rsqrt((x32 * x32).mean(-1, keepdim=True) + eps)).flatten(-2)
    return (x32 * scale).to(x.dtype)


@dataclass(frozen=True)
class GatedResidual:
    norm: torch.Tensor             # [n * H], 1 + w (offset_scale)
    down: torch.Tensor             # [R, n * H]
    up: torch.Tensor               # [n * H, R]
    inject: torch.Tensor | None    # [n, n * H]
    count: int                     # n
    hidden: int                    # H
    eps: float

    @classmethod
    def load(cls, w: dict, prefix: str, count: int, hidden: int, eps: float) -> "GatedResidual":
        return cls(offset_scale(w[prefix + "hc_norm.weight"]), w[prefix + "input_mix_weight_down.weight"],
                   w[prefix + "input_mix_weight_up.weight"], w.get(prefix + "block_inject_weight.weight"),
                   count, hidden, eps)

    def mix(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [T, n * H] -> block input [T, H] and per-stream output weights [T, n] (None for the last mixer)."""
        normed = grouped_offset_norm(x, self.norm, self.hidden, self.eps)
        gate = torch.sigmoid(linear(F.silu(linear(normed, self.down) / self.count), self.up))
        mixed = (gate.unflatten(-1, (self.count, self.hidden)) * normed.unflatten(-1, (self.count, self.hidden)))
        block_input = mixed.mean(dim=-2)
        if self.inject is None:
            return block_input, None
        return block_input, 2 * torch.sigmoid(linear(normed, self.inject) / self.count)


def inject(x: torch.Tensor, out: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Streams after a block: x [T, n * H] + out [T, H] weighted per stream by weights [T, n]."""
    return x + (out.unsqueeze(-2) * weights.unsqueeze(-1)).flatten(-2)
