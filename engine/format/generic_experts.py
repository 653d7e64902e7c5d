"""A generic family's experts as its checkpoint stores them (engine.model.generic): one expert's gate, up and
down per tensor (the Hub's layout, `<experts>.<e>.gate_proj.weight` or the family's own names), or fused as
transformers holds them (`<experts>.gate_up_proj` [E, 2I, H], `<experts>.down_proj` [E, H, I]; transposed
[E, H, 2I] and [E, I, H], or gate and up interleaved, where the family's experts interface says so).
Ungated experts (Nemotron-H's) have no gate: up alone in gate_up's place (`up_proj.weight`, or fused
`up_proj` [E, I, H]).
Names are matched after the family's renamings (Kimi-Linear's `block_sparse_moe.` is transformers' `mlp.`)."""
from __future__ import annotations

import torch

from engine.errors import SluiceError
from engine.format.checkpoint import Checkpoint
from engine.model.spec import ModelSpec, canonical_dense_name


def require_expert_tensors(ckpt: Checkpoint, needed: dict[str, tuple[int, ...]]) -> None:
    """Each expert tensor `needed` (name -> shape) is in the checkpoint with that shape, else one sentence."""
    for name, shape in needed.items():
        if name not in ckpt:
            raise SluiceError(f"The checkpoint has no expert tensor '{name}'; it is incomplete or not the "
                              "model its config says.")
        if tuple(ckpt.logical_shape(name)) != shape:
            raise SluiceError(f"The expert tensor '{name}' has shape {list(ckpt.logical_shape(name))} "
                              f"but the config implies {list(shape)}; the config does not belong to these weights.")


class RenamedExpertSource:
    """What the expert sources that find tensors by their renamed (canonical) names share: this one, Llama 4's and
    Nemotron-H's. Their blocks are quantised from the stored weights."""
    has_bias = False

    def __init__(self, ckpt: Checkpoint, spec: ModelSpec):
        self.ckpt, self.spec = ckpt, spec
        self._stored = {canonical_dense_name(spec.family, n): n for n in ckpt.names()}   # renamed -> stored

    def stored(self, name: str) -> str:
        """The checkpoint's own name of a renamed tensor (the name itself where none renames to it)."""
        return self._stored.get(name, name)

    def is_expert_tensor(self, name: str) -> bool:
        return ".experts." in name

    def native_parts(self, layer: int, expert: int, quant: str) -> None:
        return None


class GenericExpertSource(RenamedExpertSource):
    def __init__(self, ckpt: Checkpoint, spec: ModelSpec):
        super().__init__(ckpt, spec)
        self.projections = ("gate", "up", "down") if spec.has_expert_gate else ("up", "down")
        self._fused: tuple[int, torch.Tensor, torch.Tensor] | None = None

    def _name(self, layer: int, expert: int, proj: str) -> str:
        return self.stored(self.spec.expert_tensor_name(layer, expert, proj))

    def _fused_names(self, layer: int) -> tuple[str, str]:
        return tuple(self.stored(n) for n in self.spec.fused_expert_names(layer))

    def check(self) -> None:
        """Every expert tensor is there with the shape the config implies, in one layout or the other."""
        E, H, I = self.spec.num_experts, self.spec.hidden_size, self.spec.expert_intermediate
        transposed, rows = self.spec.generic.is_transposed, len(self.projections) - 1     # [2I] or [I] rows first
        for layer in self.spec.moe_layers:
            gate_up, down = self._fused_names(layer)
            if gate_up in self.ckpt:
                needed = {gate_up: (E, H, rows * I) if transposed else (E, rows * I, H),
                          down: (E, I, H) if transposed else (E, H, I)}
            else:
                needed = {self._name(layer, e, p): (H, I) if p == "down" else (I, H)
                          for e in range(E) for p in self.projections}
            require_expert_tensors(self.ckpt, needed)

    def get(self, layer: int, expert: int) -> dict[str, torch.Tensor]:
        """One expert's projections [out, in] float32: gate (where the experts have one), up and down."""
        if self._name(layer, expert, self.projections[0]) in self.ckpt:
            return {p: self.ckpt.get_float(self._name(layer, expert, p)) for p in self.projections}
        if self._fused is None or self._fused[0] != layer:
            gate_up_name, down_name = self._fused_names(layer)
            self._fused = (layer, self.ckpt.get_float(gate_up_name), self.ckpt.get_float(down_name))
        _, gate_up, down = self._fused
        interface = self.spec.generic
        gate_up, down = gate_up[expert], down[expert]
        if interface.is_transposed:                    # [H, 2I] and [I, H] -> [2I, H] and [H, I]
            gate_up, down = gate_up.T, down.T
        if not interface.has_gate:                     # up [I, H] alone
            return {"up": gate_up.contiguous(), "down": down.contiguous()}
        if interface.is_concatenated:
            gate, up = gate_up.chunk(2, dim=0)
        else:
            gate, up = gate_up[0::2], gate_up[1::2]
        return {"gate": gate.contiguous(), "up": up.contiguous(), "down": down.contiguous()}
