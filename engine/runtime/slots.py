"""Device slot banks: two banks of block-sized slots on the compute device.

Layer L uses bank L % 2, so the experts of layer L+1 can arrive in one bank while layer L's
experts compute in the other. Within a bank, slots are a cache across tokens: an expert that is
still resident is a device hit and costs no transfer at all. Eviction is recency with frequency:
the victim is the least used of the `window` least recently used blocks (use counts halve now and
then, so yesterday's favourite can leave). Real routing is skewed (a few experts per layer are
hot): on a Zipf trace this keeps more hits than plain LRU, and on uniform routing it is no worse
(tests/streaming/test_residency.py).

A prompt's prefill is a sweep: it asks for nearly every expert of every layer once, in layer order, so
recency would let each layer's misses evict the very blocks the later layers (and the next prompt) hit,
and a cyclic sweep larger than the bank hits nothing. During a sweep the victim is therefore one of the
blocks the sweep itself brought in (a pool that rotates), by the same rule as above (the least used of the
oldest: the prompt's hot experts stay for its answer), and the blocks resident before it stay. The use
counts do not age within a sweep, only once at its end: a prompt's tokens are equally recent, and a
512-token layer routes more pairs than an aging period, so aging layer by layer would leave the first
layers' hot experts looking cold to the answer's evictions (they copied 14% more in
scripts/probe_prefill_residency.py).
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from itertools import islice
from typing import Callable, Iterable

import torch

from engine.runtime.telemetry import Telemetry

Key = tuple[int, int]


def least_used(oldest_first: Iterable[Key], uses: Callable[[Key], float], window: int) -> Key | None:
    """The least used of the first `window` keys (the oldest on ties), or None: the eviction rule of the
    slot banks and the RAM cache."""
    candidates = list(islice(oldest_first, window))
    return min(candidates, key=uses) if candidates else None


class SlotBanks:
    def __init__(self, slots_per_bank: int, block_bytes: int, device: torch.device, telemetry: Telemetry):
        self.slots_per_bank = slots_per_bank
        self.block_bytes = block_bytes
        self.banks = [torch.empty(slots_per_bank, block_bytes, dtype=torch.uint8, device=device) for _ in range(2)]
        self._views = [list(bank.unbind()) for bank in self.banks]     # one view a slot, made once (~4 us each)
        self._resident: list[OrderedDict[Key, int]] = [OrderedDict(), OrderedDict()]
        self._state = [["empty"] * slots_per_bank for _ in range(2)]
        self._key = [[None] * slots_per_bank for _ in range(2)]
        self._free = [list(range(slots_per_bank - 1, -1, -1)) for _ in range(2)]   # pop() gives slot 0 first
        self.last_evicted: tuple[Key, int] | None = None
        self.last_evicted_swept = False                      # ... and whether the current sweep brought it in
        self._swept: list[OrderedDict[Key, None]] | None = None   # during a sweep: per bank, its blocks, oldest first
        self.window = 32                                     # 1 = plain LRU
        self._uses: dict[Key, float] = {}
        self._uses_until_aging = self._aging_period = 16 * slots_per_bank
        self.telemetry = telemetry
        telemetry.attach_slots(self.describe)

    @staticmethod
    def bank_of(layer: int) -> int:
        return layer % 2

    def holds(self, key: Key) -> bool:
        """Whether the block is resident (without making it recent)."""
        return key in self._resident[self.bank_of(key[0])]

    def find(self, key: Key) -> int | None:
        bank = self.bank_of(key[0])
        slot = self._resident[bank].get(key)
        if slot is not None:
            self._resident[bank].move_to_end(key)
        return slot

    def note_used(self, layer: int, routed: list[int]) -> None:
        """The experts a layer's tokens were routed to (resident or not; one id a routed pair): their use
        counts grow. Counted per distinct expert: a 512-token prefill routes 4096 pairs a layer, which one
        by one took ~5 ms of host time a layer."""
        for expert, n in Counter(routed).items():
            key = (layer, expert)
            self._uses[key] = self._uses.get(key, 0.0) + n
        self._uses_until_aging -= len(routed)
        if self._uses_until_aging <= 0 and self._swept is None:
            self._age()

    def _age(self) -> None:
        """Every use count halves (yesterday's favourite can leave); counts below one half are dropped."""
        self._uses_until_aging = self._aging_period
        self._uses = {k: n / 2 for k, n in self._uses.items() if n >= 0.5}

    def uses(self, key: Key) -> float:
        """How often the key's expert was routed to lately (its aged use count)."""
        return self._uses.get(key, 0.0)

    def begin_sweep(self) -> None:
        """A prefill starts (see the module's docstring)."""
        self._swept = [OrderedDict(), OrderedDict()]

    def end_sweep(self) -> list[Key]:
        """The sweep ends: the blocks it brought in that are still resident (they stay, as any other)."""
        swept, self._swept = self._swept, None
        if self._uses_until_aging <= 0:
            self._age()
        return [key for keys in swept for key in keys] if swept else []

    @property
    def sweeping(self) -> bool:
        return self._swept is not None

    def _sweep_victim(self, bank: int, protected: set[Key]) -> Key | None:
        """Of the unprotected blocks the current sweep brought into the bank, the least used of the `window`
        oldest (the prompt's hot experts stay for its answer), or None."""
        return self._least_used(self._swept[bank], protected) if self._swept else None

    def _victim(self, bank: int, protected: set[Key]) -> Key:
        """The least used of the `window` least recently used unprotected blocks (oldest on ties)."""
        return self._least_used(self._resident[bank], protected)

    def _least_used(self, oldest_first: Iterable[Key], protected: set[Key]) -> Key | None:
        uses = self._uses
        return least_used((key for key in oldest_first if key not in protected), lambda key: uses.get(key, 0.0),
                          self.window)

    def acquire(self, key: Key, protected: set[Key]) -> int:
        """A slot in key's bank for a new block, evicting an unprotected block (see `_victim`)."""
        bank = self.bank_of(key[0])
        resident = self._resident[bank]
        self.last_evicted = None                             # (key, slot) whose bytes are about to be replaced
        self.last_evicted_swept = False
        if self._free[bank]:
            slot = self._free[bank].pop()
        else:
            victim = self._sweep_victim(bank, protected)
            self.last_evicted_swept = victim is not None
            if victim is None:
                victim = self._victim(bank, protected)
            slot = resident.pop(victim)
            self.last_evicted = (victim, slot)
            if self._swept is not None:
                self._swept[bank].pop(victim, None)
        if self._swept is not None:
            self._swept[bank][key] = None
        resident[key] = slot
        self._key[bank][slot] = key
        self._state[bank][slot] = "loading"
        return slot

    def block(self, key: Key, slot: int) -> torch.Tensor:
        return self._views[key[0] % 2][slot]

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
