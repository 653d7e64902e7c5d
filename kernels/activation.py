"""How an expert turns its gate and up projections into h, for the MoE kernels and their torch references.

  silu            h = silu(gate) * up                                   (most families)
  clamped_swiglu  g = min(gate, limit), u = clamp(up, -limit, limit)   (gpt-oss)
                  h = (u + 1) * g * sigmoid(alpha * g)
  clamped_silu    h = silu(g) * u, g and u clamped as above             (DeepSeek-V4)
  relu2           h = relu(up)^2, no gate                               (Nemotron-H's ungated experts)
gate and up here already include their biases (added after the row scale) where a block has them.
No Triton here: the engine imports this to declare its families' activations (tiles.activate is the
kernels' side; it has no ungated activation: the GPU expert kernels are not attached for ungated blocks).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

ACTIVATION_IDS = {"silu": 0, "clamped_swiglu": 1, "clamped_silu": 2, "relu2": 3}   # the kernels' ACT constexpr
UNGATED = ("relu2",)        # activations of up alone: their experts' blocks have no gate


@dataclass(frozen=True)
class Activation:
    name: str = "silu"
    alpha: float = 1.0        # clamped_swiglu: the sigmoid's slope
    limit: float = 0.0        # clamped_*: the clamp

    def __post_init__(self):
        if self.name not in ACTIVATION_IDS:
            raise ValueError(f"unknown expert activation {self.name!r} (known: {', '.join(ACTIVATION_IDS)})")

    @property
    def kernel_id(self) -> int:
        return ACTIVATION_IDS[self.name]

    @property
    def is_gated(self) -> bool:
        return self.name not in UNGATED

    def __call__(self, gate: torch.Tensor | None, up: torch.Tensor) -> torch.Tensor:
        """The torch specification (as engine.model.gptoss.clamped_swiglu_expert and engine.model.dsv4.moe.clamped_swiglu
        compute it; relu2 as transformers' ReLUSquaredActivation, gate None)."""
        if self.name == "relu2":
            return torch.square(torch.relu(up))
        if self.name == "silu":
            return torch.nn.functional.silu(gate) * up
        gate, up = gate.clamp(max=self.limit), up.clamp(min=-self.limit, max=self.limit)
        if self.name == "clamped_silu":
            return torch.nn.functional.silu(gate) * up
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))


SILU = Activation()
RELU2 = Activation("relu2")


def clamped_swiglu(alpha: float, limit: float) -> Activation:
    return Activation("clamped_swiglu", float(alpha), float(limit))


def clamped_silu(limit: float) -> Activation:
    return Activation("clamped_silu", limit=float(limit))


def biased(y: torch.Tensor, w: dict[str, torch.Tensor], bias: str) -> torch.Tensor:
    """y plus the dequantized block's bias of that name (formats.dequantize_block), if it has one: the
    references' side of tiles.bias_rows."""
    return y + w[bias] if bias in w else y
