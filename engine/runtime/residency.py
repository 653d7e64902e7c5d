"""Residency policy: which expert blocks live in which tier, which to evict, what to bring ahead.

Plain Python over block keys (layer, expert); no tensor is touched here, so every rule is unit-tested
without torch (tests/streaming/test_residency_policy.py). The movers (movers.py) and the slot banks'
memory (slots.py) only carry out these decisions.

VRAM slots: two banks, layer L in bank L % 2, so the experts of layer L+1 arrive in one bank while layer
L computes in the other. Within a bank, slots are a cache across tokens. Eviction is by use, decayed with
time (LRFU): each routed pair adds one to its expert's score, and scores halve every HALF_LIFE tokens; the
victim is the resident block with the lowest score (never used: the oldest of those). Routing has both
kinds of locality: a few experts per layer are hot for a while, and an expert used by this token is often
used by the next. On recorded routing a 16-token half-life copies fewer blocks a token than the rules tried
before it; on a Zipf trace it keeps more hits than plain LRU, and on uniform routing it is no worse
(tests/streaming/test_residency.py).

A prompt's prefill is a sweep: it asks for nearly every expert of every layer once, in layer order, so
recency would let each layer's misses evict the very blocks the later layers (and the next prompt) hit.
During a sweep the victim is one of the blocks the sweep itself brought in (a pool that rotates): the least
used of the `window` oldest, and the blocks resident before it stay. The clock stands still within a sweep
and moves one token at its end: a prompt's tokens are equally recent.

The tiers are exclusive: a block copied into VRAM is demoted in RAM (evicted first) and a VRAM victim is
written back to RAM, so the two caches add up. In a sweep a RAM hit keeps its place and a block the sweep
evicts again is not written back, so both tiers keep what they held before the prompt.
"""
from __future__ import annotations

import math
from collections import Counter, OrderedDict
from itertools import islice
from typing import Callable, Iterable, Iterator

import numpy as np

Key = tuple[int, int]          # (layer, expert)
HALF_LIFE = 16.0               # tokens after which a use counts half
NEVER_USED = -1e12             # the score of a block never routed to: below every used one, oldest first
SWEEP_WINDOW = 32              # a sweep's victim: the least used of its this many oldest blocks
SMALL_COUNT = 64               # note_used counts up to this many routed pairs in a dict, more with a Counter


def least_used(oldest_first: Iterable[Key], uses: Callable[[Key], float], window: int) -> Key | None:
    """The least used of the first `window` keys (the oldest on ties), or None."""
    candidates = list(islice(oldest_first, window))
    return min(candidates, key=uses) if candidates else None


def ram_victim(entries: Iterable[Key], locked: Callable[[Key], bool], demoted: set[Key],
               uses: Callable[[Key], float] | None, window: int, num_locked: int) -> Key | None:
    """The RAM cache's victim among `entries` (least recent first): a demoted block (one also in VRAM costs
    nothing to lose), else the least used of the `window` least recent unlocked ones; plain LRU without `uses`."""
    first = next((key for key in entries if not locked(key)), None)
    if first is None or first in demoted or uses is None:
        return first
    oldest = [key for key in islice(entries, window + num_locked) if not locked(key)]
    return min(oldest[:window], key=uses)


def split_resident(wanted: list[int], find: Callable[[int], int | None]) -> tuple[dict[int, int], list[int]]:
    """({expert: slot} of the experts already in VRAM, the others in order: the misses)."""
    slot_of, late = {}, []
    for expert in wanted:
        slot = find(expert)
        if slot is None:
            late.append(expert)
        else:
            slot_of[expert] = slot
    return slot_of, late


def copies_ahead(num_guesses: int, override: int | None) -> int:
    """How many of the next layer's best guesses held in RAM are copied ahead: the better half. For the lower
    half a copy ahead cost more than it saved (PCIe is nearly busy, and a wrong copy evicts a resident block)."""
    return max(1, num_guesses // 2) if override is None else override


def reads_ahead(num_guesses: int, override: int | None, all_guesses: bool) -> int:
    """How many of the best guesses that no tier holds start a disk read ahead. Where the disk is the bottleneck
    (a GPU) the better half: a wrong read costs a whole block. Where compute is (the CPU device) the disk waits
    anyway, so every guess is read."""
    if override is not None:
        return override
    return num_guesses if all_guesses else max(1, num_guesses // 2)


def keys_to_read(keys: Iterable[Key], is_held: Callable[[Key], bool], has_room: Callable[[], bool]) -> Iterator[Key]:
    """The keys worth a read, in order: those no tier holds nor reads already, while RAM has room (checked
    before each, as each read started takes a block)."""
    for key in keys:
        if is_held(key):
            continue
        if not has_room():
            return
        yield key


def hottest(candidates: list[int], uses: Callable[[int], float], count: int) -> list[int]:
    """The `count` most used of the candidates (a stable order on ties)."""
    return sorted(candidates, key=lambda e: -uses(e))[:count]


def writes_back(evicted: Key | None, sweeping: bool, evicted_by_sweep: bool) -> bool:
    """Whether a VRAM victim goes back to RAM: always (exclusive tiers) but for a block a sweep brought in
    and evicts again."""
    return evicted is not None and not (sweeping and evicted_by_sweep)


class FillPlan:
    """The blocks the idle filler may still read, in the model's order (a prompt's pass starts at layer 0)."""

    def __init__(self, keys: Iterable[Key] = ()):
        self._keys = list(reversed(list(keys)))         # the next one last

    def __bool__(self) -> bool:
        return bool(self._keys)

    def clear(self) -> None:
        self._keys = []

    def next_key(self, is_held: Callable[[Key], bool]) -> Key | None:
        """The next block no tier holds nor reads, or None once none is left."""
        while self._keys:
            key = self._keys.pop()
            if not is_held(key):
                return key
        return None


class SlotPolicy:
    """Which block sits in which slot of the two VRAM banks, and which one to evict (see the module's docstring)."""

    def __init__(self, slots_per_bank: int):
        self.slots_per_bank = slots_per_bank
        self._resident: list[OrderedDict[Key, int]] = [OrderedDict(), OrderedDict()]
        self._state = [["empty"] * slots_per_bank for _ in range(2)]
        self._key: list[list[Key | None]] = [[None] * slots_per_bank for _ in range(2)]
        self._free = [list(range(slots_per_bank - 1, -1, -1)) for _ in range(2)]   # pop() gives slot 0 first
        self.last_evicted: tuple[Key, int] | None = None     # (key, slot) whose bytes are about to be replaced
        self.last_evicted_swept = False                      # ... and whether the current sweep brought it in
        self._swept: list[OrderedDict[Key, None]] | None = None   # during a sweep: per bank, its blocks, oldest first
        self.window = SWEEP_WINDOW
        self.lru = False                                     # plain LRU instead of decayed use (tests compare)
        # log2 of a key's decayed use count plus the clock / HALF_LIFE at its last use: one number that orders
        # keys by decayed use at any later time, so it is written only when the key is used
        self._score: dict[Key, float] = {}
        self._slot_score = [np.full(slots_per_bank, NEVER_USED) for _ in range(2)]   # the resident keys' scores
        self._now = 0.0                                      # the clock, in tokens
        self._layers: set[int] = set()                       # the layers seen: one call each a token
        self._acquired = 0                                   # blocks brought in (orders never-used ones)

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
        """The experts a layer's tokens were routed to (one id a routed pair): each pair adds one to its expert's
        decayed use count. Counted per distinct expert: a long prompt routes thousands of pairs a layer."""
        self._layers.add(layer)
        if self._swept is None:                              # a token is one call a layer
            self._now += 1.0 / len(self._layers)
        now = self._now / HALF_LIFE
        bank = self.bank_of(layer)
        if len(routed) > SMALL_COUNT:
            counts = Counter(routed)                         # a prompt's thousands of pairs: counted in C
        else:                                                # a step's few: a dict is cheaper than a Counter
            counts = {}
            for expert in routed:
                counts[expert] = counts.get(expert, 0) + 1
        scores, resident, slot_scores, log2 = self._score, self._resident[bank], self._slot_score[bank], math.log2
        for expert, n in counts.items():
            key = (layer, expert)
            score = scores.get(key)
            score = log2(n + (2.0 ** (score - now) if score is not None else 0.0)) + now
            scores[key] = score
            slot = resident.get(key)
            if slot is not None:
                slot_scores[slot] = score

    def uses(self, key: Key) -> float:
        """How often the key's expert was routed to lately (its use count, halved every HALF_LIFE tokens)."""
        score = self._score.get(key)
        return 0.0 if score is None else 2.0 ** (score - self._now / HALF_LIFE)

    def rank(self, key: Key) -> float:
        """A number that orders keys as `uses` does, without computing the count: the RAM cache's victim
        compares hundreds of keys."""
        return self._score.get(key, NEVER_USED)

    def begin_sweep(self) -> None:
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
        if not self._swept:
            return None
        return least_used((key for key in self._swept[bank] if key not in protected), self.uses, self.window)

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

    def acquire(self, key: Key, protected: set[Key]) -> int:
        """A slot in key's bank for a new block, evicting an unprotected block (see `_victim`)."""
        bank = self.bank_of(key[0])
        resident = self._resident[bank]
        self.last_evicted = None
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
