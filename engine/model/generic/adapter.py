"""The module that stands in for a family's routed experts, and one expert's math in the family's own terms.

transformers calls experts(hidden [T, H], top_k_index [T, K], top_k_weights [T, K]) -> [T, H]; the adapter
passes the same to the model's passes (model.Passes.run_experts), which run them on Sluice's streaming
experts. What differs between families (the activation, a custom gate, expert biases, gate and up
interleaved, no gate at all) is adapted here, in `expert_math`, from the family's own experts class.
"""
from __future__ import annotations

from typing import Callable

import torch

from engine.model.layers import linear
from engine.model.model import swiglu_expert
from kernels.activation import RELU2, SILU, Activation


class StreamedExperts(torch.nn.Module):
    """A layer's routed experts, served by the runtime (no weights of its own)."""

    def __init__(self, layer: int, run: Callable):
        super().__init__()
        self.layer, self._run = layer, run

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        return self._run(self.layer, hidden_states, top_k_index, top_k_weights)


class StreamedScaledExperts(torch.nn.Module):
    """Llama 4's routed experts (every expert's copy of the tokens, scaled by its routing score), served by the
    runtime."""

    def __init__(self, layer: int, run: Callable):
        super().__init__()
        self.layer, self._run = layer, run

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._run(self.layer, hidden_states)


def expert_math(experts: torch.nn.Module, is_concatenated: bool) -> tuple[Callable, Activation | None]:
    """One expert's math from a family's experts module (its weights need not exist: only `act_fn` and
    `_apply_gate` are used) -> (expert_mlp(x, w) for the runtime, the GPU kernels' activation or None).
    The plain SwiGLU of most families is Sluice's own (its kernels apply); anything else is the family's gate, or
    for ungated experts (Nemotron-H's) the family's activation of up alone."""
    from transformers.integrations.moe import _default_apply_gate
    if not getattr(experts, "has_gate", True):
        return _ungated_expert(experts)
    gate_fn = getattr(type(experts), "_apply_gate", _default_apply_gate)     # Llama 4's: act(gate) * up
    is_silu = type(getattr(experts, "act_fn", None)).__name__ in ("SiLUActivation", "SiLU")
    if gate_fn is _default_apply_gate and is_silu and not getattr(experts, "has_bias", False):
        return swiglu_expert, SILU

    def apply_gate(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        # gate, up [T, I] -> [T, 2I] in the layout the family's gate reads
        gate_up = torch.cat([gate, up], dim=-1) if is_concatenated else torch.stack([gate, up], dim=-1).flatten(-2)
        return gate_fn(experts, gate_up)

    def family_expert(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
        # x [T, H] -> [T, H]; w: gate, up [I, H], down [H, I] (and their biases where the family has them)
        gate, up = linear(x, w["gate"], w.get("gate_bias")), linear(x, w["up"], w.get("up_bias"))
        return linear(apply_gate(gate, up), w["down"], w.get("down_bias"))
    return family_expert, None


def _ungated_expert(experts: torch.nn.Module) -> tuple[Callable, Activation | None]:
    """down(act(up x)) with the family's activation -> (expert_mlp, RELU2 where it is relu^2 without biases: the
    fused CPU kernel's, kernels.cpu_moe; no GPU kernel takes an ungated block)."""
    act = experts.act_fn
    is_relu2 = type(act).__name__ == "ReLUSquaredActivation" and not getattr(experts, "has_bias", False)

    def ungated_expert(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
        # x [T, H] -> [T, H]; w: up [I, H], down [H, I] (and their biases where the family has them)
        return linear(act(linear(x, w["up"], w.get("up_bias"))), w["down"], w.get("down_bias"))
    return ungated_expert, RELU2 if is_relu2 else None
