"""The slot banks' placement on the device: which slot each expert's block sits ready in, [layers, experts] int32,
-1 where it does not (not resident, or its copy not known to have landed when the row was last sent).

A decode step's expert launch can then look its slots up on the device, straight after the router, instead of
waiting for the host to read the routed ids and upload their slots: the GPU computes the experts the table holds
while the host reads the ids, and the host launches only the others (the misses, and blocks whose copies were
still in flight) on top. The host must know exactly what a lookup saw, so a row changes on the device only
through `send`, stream-ordered before the lookup that follows it, and `send` returns the row as sent.

The residency policy reports each block placed into a slot and each one evicted; a placed block enters its row at
the first `send` after its copy has landed (`landed`: the copy's done event has completed, or the compute stream
already waited for it). An evicted block leaves its row at the next `send` of its layer, before any later lookup
of that layer; the copy that overwrites its slot waits for the bank's last compute (the movers' `bank_free`).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

Key = tuple[int, int]


class SlotTable:
    def __init__(self, num_layers: int, num_experts: int, device: torch.device):
        pinned = device.type == "cuda"
        self.sent = np.full((num_layers, num_experts), -1, dtype=np.int32)      # each row as last sent
        self.device = torch.full((num_layers, num_experts), -1, dtype=torch.int32, device=device)
        self._stage = torch.full((num_layers, num_experts), -1, dtype=torch.int32, pin_memory=pinned)
        self._stage_np = self._stage.numpy()
        self._placed: dict[int, dict[int, int]] = {}     # layer -> {expert: slot} placed, its copy maybe in flight
        self._stale: dict[int, set[int]] = {}            # layer -> experts whose sent entry no longer holds

    def placed(self, key: Key, slot: int) -> None:
        """A copy of key's block into `slot` was issued (its entry stays -1 until the copy has landed)."""
        layer, expert = key
        self._placed.setdefault(layer, {})[expert] = slot
        self._stale.setdefault(layer, set()).add(expert)

    def evicted(self, key: Key) -> None:
        layer, expert = key
        self._placed.get(layer, {}).pop(expert, None)
        self._stale.setdefault(layer, set()).add(expert)

    def send(self, layer: int, landed: Callable[[int, int], bool]) -> np.ndarray:
        """The layer's row brought up to date on the device (a copy on the current stream, before whatever is
        enqueued next) -> the row as a lookup enqueued next sees it. landed(layer, slot): whether the block placed
        in that slot may be read by work enqueued from now on."""
        row, changed = self.sent[layer], False
        for expert in self._stale.pop(layer, ()):
            changed |= bool(row[expert] != -1)
            row[expert] = -1
        placed = self._placed.get(layer)
        if placed:
            for expert, slot in list(placed.items()):
                if landed(layer, slot):
                    row[expert] = slot
                    del placed[expert]
                    changed = True
        if changed:       # the staging row is written again only at this layer's next send, a token later
            self._stage_np[layer] = row
            self.device[layer].copy_(self._stage[layer], non_blocking=True)
        return row

    def look_up(self, layer: int, ids: torch.Tensor) -> torch.Tensor:
        """[1, K] int32 slots of the routed ids [K] (device ops: capturable)."""
        return self.device[layer].index_select(0, ids).view(1, -1)
