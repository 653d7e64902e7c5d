"""Device slot banks: two banks of block-sized slots on the compute device.

Layer L uses bank L % 2, so the experts of layer L+1 can arrive in one bank while layer L's
experts compute in the other. Within a bank, slots are an LRU cache across tokens: an expert
that is still resident is a device hit and costs no transfer at all.
"""
from __future__ import annotations

from collections import OrderedDict

import torch

from engine.runtime.telemetry import Telemetry

Key = tuple[int, int]


class SlotBanks:
    def __init__(self, slots_per_bank: int, block_bytes: int, device: torch.device, telemetry: Telemetry):
        self.slots_per_bank = slots_per_bank
        self.block_bytes = block_bytes
        self.banks = [torch.empty(slots_per_bank, block_bytes, dtype=torch.uint8, device=device) for _ in range(2)]
        self._resident: list[OrderedDict[Key, int]] = [OrderedDict(), OrderedDict()]
        self._state = [["empty"] * slots_per_bank for _ in range(2)]
        self._key = [[None] * slots_per_bank for _ in range(2)]
        self._free = [list(range(slots_per_bank - 1, -1, -1)) for _ in range(2)]   # pop() gives slot 0 first
        self.last_evicted: tuple[Key, int] | None = None
        self.telemetry = telemetry
        telemetry.attach_slots(self.describe)

    @staticmethod
    def bank_of(layer: int) -> int:
        return layer % 2

    def find(self, key: Key) -> int | None:
        bank = self.bank_of(key[0])
        slot = self._resident[bank].get(key)
        if slot is not None:
            self._resident[bank].move_to_end(key)
        return slot

    def acquire(self, key: Key, protected: set[Key]) -> int:
        """A slot in key's bank for a new block, evicting the least recently used unprotected block."""
        bank = self.bank_of(key[0])
        resident = self._resident[bank]
        self.last_evicted = None                             # (key, slot) whose bytes are about to be replaced
        if self._free[bank]:
            slot = self._free[bank].pop()
        else:
            victim = next(k for k in resident if k not in protected)
            slot = resident.pop(victim)
            self.last_evicted = (victim, slot)
        resident[key] = slot
        self._key[bank][slot] = key
        self._state[bank][slot] = "loading"
        return slot

    def block(self, key: Key, slot: int) -> torch.Tensor:
        return self.banks[self.bank_of(key[0])][slot]

    def set_state(self, key: Key, slot: int, state: str) -> None:
        self._state[self.bank_of(key[0])][slot] = state

    def describe(self) -> list[dict]:
        out = []
        for bank in range(2):
            for slot in range(self.slots_per_bank):
                key = self._key[bank][slot]
                out.append({"bank": bank, "slot": slot, "layer": key[0] if key else None,
                            "expert": key[1] if key else None, "state": self._state[bank][slot]})
        return out
