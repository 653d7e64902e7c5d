"""Llama 4's experts as its checkpoints store them: fused per layer, transposed ([in, out]), gate columns then up.

  <text model>layers.<l>.feed_forward.experts.gate_up_proj [E, H, 2I]   (x @ gate_up: gate = [:, :I], up = [:, I:])
  <text model>layers.<l>.feed_forward.experts.down_proj    [E, I, H]
(the text model: `model.`, or `language_model.model.` in a llama4 checkpoint; matched by their canonical names).
"""
from __future__ import annotations

import torch

from engine.format.checkpoint import Checkpoint
from engine.format.generic_experts import RenamedExpertSource, require_expert_tensors
from engine.model.spec import ModelSpec


class Llama4ExpertSource(RenamedExpertSource):
    def __init__(self, ckpt: Checkpoint, spec: ModelSpec):
        super().__init__(ckpt, spec)
        self._layer: tuple[int, torch.Tensor, torch.Tensor] | None = None

    def _names(self, layer: int) -> tuple[str, str]:
        p = f"model.layers.{layer}.mlp.experts."
        return tuple(self.stored(p + n) for n in ("gate_up_proj", "down_proj"))

    def check(self) -> None:
        """Every expert tensor is there, with the shape the config implies."""
        E, H, I = self.spec.num_experts, self.spec.hidden_size, self.spec.expert_intermediate
        for layer in self.spec.moe_layers:
            require_expert_tensors(self.ckpt, dict(zip(self._names(layer), ((E, H, 2 * I), (E, I, H)))))

    def get(self, layer: int, expert: int) -> dict[str, torch.Tensor]:
        """One expert's gate, up [I, H] and down [H, I], float32 (one layer's fused tensors held at a time)."""
        if self._layer is None or self._layer[0] != layer:
            gate_up, down = self._names(layer)
            self._layer = (layer, self.ckpt.get_float(gate_up), self.ckpt.get_float(down))
        _, gate_up, down = self._layer
        gate, up = gate_up[expert].T.chunk(2, dim=0)                     # [2I, H] -> [I, H] x2
        return {"gate": gate.contiguous(), "up": up.contiguous(), "down": down[expert].T.contiguous()}
