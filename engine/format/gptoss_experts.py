"""gpt-oss experts as checkpoints store them: fused per layer, gate and up interleaved, with biases.

  bf16 (transformers' save_pretrained):  mlp.experts.gate_up_proj [E, H, 2I] ([in, out]; gate at even
      output columns, up at odd), gate_up_proj_bias [E, 2I], down_proj [E, I, H], down_proj_bias [E, H]
  mxfp4 (the Hub checkpoints):  gate_up_proj_blocks uint8 [E, 2I, H/32, 16] and gate_up_proj_scales
      uint8 [E, 2I, H/32] ([out, in], same interleaving), down_proj_blocks [E, H, I/32, 16],
      down_proj_scales [E, H, I/32]; biases as above.
An MXFP4 row is self-contained (its bytes and its scales), so splitting the rows into gate and up
copies bytes: repacking mxfp4 -> mxfp4 keeps every block byte-identical.
"""
from __future__ import annotations

import torch

from engine.errors import SluiceError
from engine.format.checkpoint import Checkpoint
from engine.format.quant import dequantize
from engine.model.spec import ModelSpec


class GptOssExpertSource:
    has_bias = True

    def __init__(self, ckpt: Checkpoint, spec: ModelSpec):
        self.ckpt, self.spec = ckpt, spec
        self._layer: tuple[int, dict[str, torch.Tensor]] | None = None

    def _prefix(self, layer: int) -> str:
        return f"model.layers.{layer}.mlp.experts."

    def stored_format(self, layer: int) -> str:
        return "mxfp4" if self._prefix(layer) + "gate_up_proj_blocks" in self.ckpt else "bf16"

    def check(self) -> None:
        """Every expert tensor is there, with the shape the config implies."""
        E, H, I = self.spec.num_experts, self.spec.hidden_size, self.spec.expert_intermediate
        for layer in self.spec.moe_layers:
            p = self._prefix(layer)
            if self.stored_format(layer) == "mxfp4":
                needed = {"gate_up_proj_blocks": (E, 2 * I, H // 32, 16), "gate_up_proj_scales": (E, 2 * I, H // 32),
                          "down_proj_blocks": (E, H, I // 32, 16), "down_proj_scales": (E, H, I // 32)}
            else:
                needed = {"gate_up_proj": (E, H, 2 * I), "down_proj": (E, I, H)}
            needed.update({"gate_up_proj_bias": (E, 2 * I), "down_proj_bias": (E, H)})
            for name, shape in needed.items():
                if p + name not in self.ckpt:
                    raise SluiceError(f"The checkpoint has no tensor '{p + name}'; it is incomplete or not the "
                                      "model its config says.")
                if tuple(self.ckpt.shape(p + name)) != shape:
                    raise SluiceError(f"The tensor '{p + name}' has shape {list(self.ckpt.shape(p + name))} but the "
                                      f"config implies {list(shape)}; the config does not belong to these weights.")

    def is_expert_tensor(self, name: str) -> bool:
        return ".experts." in name

    def _tensors(self, layer: int) -> dict[str, torch.Tensor]:
        """The layer's fused expert tensors (one layer held at a time)."""
        if self._layer is None or self._layer[0] != layer:
            p = self._prefix(layer)
            names = [n for n in self.ckpt.names() if n.startswith(p)]
            self._layer = (layer, {n[len(p):]: self.ckpt.get(n) for n in names})
        return self._layer[1]

    def _biases(self, t: dict[str, torch.Tensor], expert: int) -> dict[str, torch.Tensor]:
        gate_up = t["gate_up_proj_bias"][expert].float()
        return {"gate_bias": gate_up[0::2], "up_bias": gate_up[1::2], "down_bias": t["down_proj_bias"][expert].float()}

    def native_parts(self, layer: int, expert: int, quant: str) -> dict[str, torch.Tensor] | None:
        """The block's parts copied from the checkpoint when it already stores `quant` (else None)."""
        if quant != "mxfp4" or self.stored_format(layer) != "mxfp4":
            return None
        t = self._tensors(layer)
        gate_up, gate_up_scales = t["gate_up_proj_blocks"][expert], t["gate_up_proj_scales"][expert]
        rows = gate_up.shape[0]
        gate_up = gate_up.reshape(rows, -1)                                       # [2I, H/2]
        down = t["down_proj_blocks"][expert]
        parts = {"gate.w": gate_up[0::2], "gate.scale": gate_up_scales[0::2],
                 "up.w": gate_up[1::2], "up.scale": gate_up_scales[1::2],
                 "down.w": down.reshape(down.shape[0], -1), "down.scale": t["down_proj_scales"][expert]}
        parts.update({f"{name}.b": b for name, b in self._biases(t, expert).items()})
        return parts

    def get(self, layer: int, expert: int) -> dict[str, torch.Tensor]:
        """gate, up [I, H], down [H, I] (float32) and the three biases of one expert."""
        t = self._tensors(layer)
        if self.stored_format(layer) == "mxfp4":
            parts = self.native_parts(layer, expert, "mxfp4")
            weights = {proj: dequantize({"w": parts[f"{proj}.w"], "scale": parts[f"{proj}.scale"]}, "mxfp4")
                       for proj in ("gate", "up", "down")}
        else:
            gate_up = t["gate_up_proj"][expert].float()                           # [H, 2I]
            weights = {"gate": gate_up[:, 0::2].T, "up": gate_up[:, 1::2].T, "down": t["down_proj"][expert].float().T}
        return {**weights, **self._biases(t, expert)}
