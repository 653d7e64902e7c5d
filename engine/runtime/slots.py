"""Device slot banks: two banks of block-sized slots on the compute device, placed by the residency policy.

The policy (which block sits in which slot, which one to evict) is residency.SlotPolicy; this adds the memory:
one [slots, block_bytes] uint8 tensor a bank, and a view a slot made once.
"""
from __future__ import annotations

import torch

from engine.runtime.residency import Key, SlotPolicy
from engine.runtime.telemetry import Telemetry


class SlotBanks(SlotPolicy):
    def __init__(self, slots_per_bank: int, block_bytes: int, device: torch.device, telemetry: Telemetry):
        super().__init__(slots_per_bank)
        self.block_bytes = block_bytes
        self.banks = [torch.empty(slots_per_bank, block_bytes, dtype=torch.uint8, device=device) for _ in range(2)]
        self._views = [list(bank.unbind()) for bank in self.banks]     # one view a slot, made once (~4 us each)
        self.telemetry = telemetry
        telemetry.attach_slots(self.describe)

    def block(self, key: Key, slot: int) -> torch.Tensor:
        return self._views[self.bank_of(key[0])][slot]
