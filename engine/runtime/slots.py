"""Device slot banks: two banks of block-sized slots on the compute device.

Layer L uses bank L % 2, so the experts of layer L+1 can arrive in one bank while layer L's
experts compute in the other. Within a bank, slots are a cache across tokens: an expert that is
still resident is a device hit and costs no transfer at all. Eviction is by use, decayed with time
(LRFU): each routed pair adds one to its expert's score, and scores halve every HALF_LIFE tokens;
the victim is the resident block with the lowest score (never used: the oldest of those). Routing
has both kinds of locality: a few experts per layer are hot for a while, and an expert used by this
token is often used by the next (25-30% of a decode's expert uses come one token after the last use,
on the bench model's routing). Replayed on the bench model's recorded routing at the fits-ram bench's
209 slots a bank, a 16-token half-life copies 13% fewer blocks a decode token than the policy before it
(the least used of the 32 least recently used, counts halved every ~50 tokens): 36.7 against 42.4, and
7-25% fewer at 100-400 slots (scripts/probe_residency_policies.py; Belady's optimum would copy 19.5). On a
Zipf trace it keeps more hits than plain LRU, and on uniform routing it is no worse
(tests/streaming/test_residency.py).

A prompt's prefill is a sweep: it asks for nearly every expert of every layer once, in layer order, so
recency would let each layer's misses evict the very blocks the later layers (and the next prompt) hit,
and a cyclic sweep larger than the bank hits nothing. During a sweep the victim is therefore one of the
blocks the sweep itself brought in (a pool that rotates): the least used of the `window` oldest (the
prompt's hot experts stay for its answer), and the blocks resident before it stay. The clock stands still
within a sweep and moves one token at its end: a prompt's tokens are equally recent, and each layer's
routing counts alike (ageing layer by layer left the first layers' hot experts looking cold to the answer's
evictions: they copied 14% more in scripts/probe_prefill_residency.py).
"""
from __future__ import annotations

import math
from collections import Counter, OrderedDict
from itertools import islice
from typing import Callable, Iterable

import numpy as np
import torch

from engine.runtime.telemetry import Telemetry

Key = tuple[int, int]
HALF_LIFE = 16.0        # tokens after which a use counts half (see the module's docstring)
NEVER_USED = -1e12      # the score key of a block never routed to: below every used one, oldest first


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
        self.window = 32                                     # a sweep's victim: the least used of its oldest
        self.lru = False                                     # plain LRU instead of decayed use (an A/B, tests)
        # log2 of a key's decayed use count plus the clock / HALF_LIFE at its last use: one number that orders
        # keys by decayed use at any later time, so it is written only when the key is used
        self._score: dict[Key, float] = {}
        self._slot_score = [np.full(slots_per_bank, NEVER_USED) for _ in range(2)]   # the resident keys' scores
        self._now = 0.0                                      # the clock, in tokens
        self._layers: set[int] = set()                       # the layers seen: one call each a token
        self._acquired = 0                                   # blocks brought in (orders never-used ones)
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
        """The experts a layer's tokens were routed to (resident or not; one id a routed pair): each pair adds
        one to its expert's decayed use count. Counted per distinct expert: a 512-token prefill routes 4096
        pairs a layer, which one by one took ~5 ms of host time a layer."""
        self._layers.add(layer)
        if self._swept is None:                              # a token is one call a layer
            self._now += 1.0 / len(self._layers)
        now = self._now / HALF_LIFE
        bank = self.bank_of(layer)
        for expert, n in Counter(routed).items():
            key = (layer, expert)
            score = self._score.get(key)
            score = math.log2(n + (2.0 ** (score - now) if score is not None else 0.0)) + now
            self._score[key] = score
            slot = self._resident[bank].get(key)
            if slot is not None:
                self._slot_score[bank][slot] = score

    def uses(self, key: Key) -> float:
        """How often the key's expert was routed to lately (its use count, halved every HALF_LIFE tokens)."""
        score = self._score.get(key)
        return 0.0 if score is None else 2.0 ** (score - self._now / HALF_LIFE)

    def rank(self, key: Key) -> float:
        """A number that orders keys as `uses` does (the log of the decayed count plus the clock at the last use),
        without computing the count: the RAM cache's victim compares hundreds of keys (22 against 29 us an
        eviction from 313 blocks, 172 against 233 from 3000, on the 2-core dev machine)."""
        return self._score.get(key, NEVER_USED)

    def begin_sweep(self) -> None:
        """A prefill starts (see the module's docstring)."""
        self._swept = [OrderedDict(), OrderedDict()]

    def end_sweep(self) -> list[Key]:
        """The sweep ends: the blocks it brought in that are still resident (they stay, as any other)."""
        swept, self._swept = self._swept, None
        self._now += 1.0                                     # the prompt ages once, as one token
        return [key for keys in swept for key in keys] if swept else []

    @property
    def sweeping(self) -> bool:
        return self._swept is not None

    def _sweep_victim(self, bank: int, protected: set[Key]) -> Key | None:
        """Of the unprotected blocks the current sweep brought into the bank, the least used of the `window`
        oldest (the prompt's hot experts stay for its answer), or None."""
        return self._least_used(self._swept[bank], protected) if self._swept else None

    def _victim(self, bank: int, protected: set[Key]) -> Key:
        """The unprotected block with the least decayed use (never used: the oldest), or with `lru` the least
        recently used."""
        resident = self._resident[bank]
        if self.lru:
            return next(key for key in resident if key not in protected)
        scores = self._slot_score[bank]
        guarded = [slot for slot in map(resident.get, protected) if slot is not None]
        if guarded:
            scores = scores.copy()
            scores[guarded] = np.inf
        return self._key[bank][int(scores.argmin())]

    def _least_used(self, oldest_first: Iterable[Key], protected: set[Key]) -> Key | None:
        return least_used((key for key in oldest_first if key not in protected), self.uses, self.window)

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
        self._acquired += 1
        score = self._score.get(key)
        self._slot_score[bank][slot] = NEVER_USED + self._acquired if score is None else score
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
