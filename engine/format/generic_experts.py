"""A generic family's experts as its checkpoint stores them (engine.model.generic): one expert's gate, up and
down per tensor (the Hub's layout, `<experts>.<e>.gate_proj.weight`), or fused as transformers holds them
(`<experts>.gate_up_proj` [E, 2I, H], `<experts>.down_proj` [E, H, I]; transposed [E, H, 2I] and [E, I, H],
or gate and up interleaved, where the family's experts interface says so)."""
from __future__ import annotations

import torch

from engine.format.repack import ExpertSource


class GenericExpertSource(ExpertSource):
    def get(self, layer: int, expert: int) -> dict[str, torch.Tensor]:
        if self._name(layer, expert, "gate") in self.ckpt:
            return super().get(layer, expert)
        if self._fused is None or self._fused[0] != layer:
            gate_up_name, down_name = self.spec.fused_expert_names(layer)
            self._fused = (layer, self.ckpt.get_float(gate_up_name), self.ckpt.get_float(down_name))
        _, gate_up, down = self._fused
        interface = self.spec.generic
        gate_up, down = gate_up[expert], down[expert]
        if interface.is_transposed:                    # [H, 2I] and [I, H] -> [2I, H] and [H, I]
            gate_up, down = gate_up.T, down.T
        if interface.is_concatenated:
            gate, up = gate_up.chunk(2, dim=0)
        else:
            gate, up = gate_up[0::2], gate_up[1::2]
        return {"gate": gate.contiguous(), "up": up.contiguous(), "down": down.contiguous()}
