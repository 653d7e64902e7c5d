"""Nemotron-H's ungated experts as its checkpoints store them: up and down per expert (the Hub's layout,
`backbone.layers.<l>.mixer.experts.<e>.up_proj.weight` [I, H], `down_proj.weight` [H, I]), or fused as transformers
holds them (`mixer.experts.up_proj` [E, I, H], `mixer.experts.down_proj` [E, H, I]); matched by their canonical
names (`backbone.` or `model.`)."""
from __future__ import annotations

import torch

from engine.format.checkpoint import Checkpoint
from engine.format.generic_experts import RenamedExpertSource, require_expert_tensors
from engine.model.spec import ModelSpec

PROJECTIONS = ("up", "down")


class NemotronExpertSource(RenamedExpertSource):
    def __init__(self, ckpt: Checkpoint, spec: ModelSpec):
        super().__init__(ckpt, spec)
        self._fused: tuple[int, torch.Tensor, torch.Tensor] | None = None

    def _name(self, layer: int, expert: int | None, proj: str) -> str:
        """The stored name of one expert's projection, or with expert None of the layer's fused tensor."""
        name = f"model.layers.{layer}.mixer.experts." + (f"{proj}_proj" if expert is None else f"{expert}.{proj}_proj.weight")
        return self.stored(name)

    def check(self) -> None:
        """Every expert tensor is there with the shape the config implies, per expert or fused."""
        E, H, I = self.spec.num_experts, self.spec.hidden_size, self.spec.expert_intermediate
        for layer in self.spec.moe_layers:
            if self._name(layer, None, "up") in self.ckpt:
                needed = {self._name(layer, None, "up"): (E, I, H), self._name(layer, None, "down"): (E, H, I)}
            else:
                needed = {self._name(layer, e, p): (H, I) if p == "down" else (I, H)
                          for e in range(E) for p in PROJECTIONS}
            require_expert_tensors(self.ckpt, needed)

    def get(self, layer: int, expert: int) -> dict[str, torch.Tensor]:
        """One expert's up [I, H] and down [H, I], float32 (a layer's fused tensors held one layer at a time)."""
        if self._name(layer, expert, "up") in self.ckpt:
            return {p: self.ckpt.get_float(self._name(layer, expert, p)) for p in PROJECTIONS}
        if self._fused is None or self._fused[0] != layer:
            self._fused = (layer, *(self.ckpt.get_float(self._name(layer, None, p)) for p in PROJECTIONS))
        _, up, down = self._fused
        return {"up": up[expert].contiguous(), "down": down[expert].contiguous()}
