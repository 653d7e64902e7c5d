"""PLE's hashed n-gram row ids, as qwen4_exp defines them (integer math only, exact on any device).

A token t of a PLE layer reads one row per head: heads_per_ngram heads for each order n = 2..N. The n-gram
(t, t-1, ..., t-n+1) is mixed as XOR of token * multiplier (int64, wrapping), and head h takes it modulo its
own prime vocabulary, offset into the layer's one table. An EOS ends a history: a token looking back past the
last EOS before it sees EOS instead (so the first token of a conversation, or after an EOS, sees EOS).
Multipliers come from splitmix64 of the seed and the PLE layer's rank; each head's vocabulary is the next
prime at or above the base, counted over all PLE layers' heads in order. numpy, not torch: a decode step hashes
one token on the host, before its rows can be read, and numpy's small-array ops cost a tenth of torch's.
"""
from __future__ import annotations

import functools
import math

import numpy as np

_MASK64 = (1 << 64) - 1
_GAMMA, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_LAYER_STRIDE = 10007           # seed step between PLE layers


def splitmix64(value: int) -> int:
    value = (value + _GAMMA) & _MASK64
    value = ((value ^ (value >> 30)) * _MIX1) & _MASK64
    value = ((value ^ (value >> 27)) * _MIX2) & _MASK64
    return value ^ (value >> 31)


def multipliers(vocab_size: int, ngram_size: int, ple_index: int, seed: int) -> np.ndarray:
    """One odd multiplier per n-gram position [N], small enough that token * multiplier fits int64."""
    half_bound = max(1, ((1 << 63) - 1) // max(vocab_size, 1) // 2)
    base = seed + _LAYER_STRIDE * ple_index
    return np.array([2 * (splitmix64((base + _GAMMA * (i + 1)) & _MASK64) % half_bound) + 1
                     for i in range(ngram_size)], dtype=np.int64)


def _is_prime(n: int) -> bool:
    if n < 2 or n % 2 == 0:
        return n == 2
    return all(n % d for d in range(3, math.isqrt(n) + 1, 2))


@functools.lru_cache(maxsize=None)
def _primes_from(base: int, count: int) -> tuple[int, ...]:
    primes, n = [], base
    while len(primes) < count:
        if _is_prime(n):
            primes.append(n)
        n += 1
    return tuple(primes)


def head_vocab_sizes(base: int, ple_index: int, num_heads: int) -> list[int]:
    """The prime vocabulary of each head of PLE layer `ple_index` (the primes >= base, all layers in turn)."""
    primes = _primes_from(base, (ple_index + 1) * num_heads)
    return list(primes[ple_index * num_heads:])


def shifted_history(seq: np.ndarray, ngram_size: int, eos: int) -> list[np.ndarray]:
    """seq [L] int64 -> for each shift s < N, seq[t - s] where no EOS lies in seq[t-s .. t-1], else EOS."""
    pos = np.arange(seq.shape[0])
    eos_pos = np.where(seq == eos, pos, -1)
    last_eos_before = np.concatenate([[-1], np.maximum.accumulate(eos_pos)[:-1]])
    return [np.where(last_eos_before < pos - s, seq[np.maximum(pos - s, 0)], eos) for s in range(ngram_size)]


def row_ids(history: list[int], tokens: list[int], *, mult: np.ndarray, sizes: np.ndarray,
            offsets: np.ndarray, ngram_size: int, heads_per_ngram: int, eos: int) -> np.ndarray:
    """Row ids [T, (N-1) * heads_per_ngram] of `tokens` (T) after `history` (the N-1 tokens before them).
    token * multiplier fits int64 (`multipliers`), so no product wraps."""
    shifted = shifted_history(np.array(history + tokens, dtype=np.int64), ngram_size, eos)
    blocks = []
    for n in range(2, ngram_size + 1):
        mixed = shifted[0] * mult[0]
        for p in range(1, n):
            mixed = mixed ^ (shifted[p] * mult[p])
        heads = slice((n - 2) * heads_per_ngram, (n - 1) * heads_per_ngram)
        blocks.append(np.remainder(mixed[:, None], sizes[None, heads]) + offsets[None, heads])   # >= 0, as Python's %
    return np.concatenate(blocks, axis=-1)[len(history):]


def one_token_ids(history: list[int], token: int, *, mult: list[int], sizes: list[int], offsets: list[int],
                  ngram_size: int, heads_per_ngram: int, eos: int) -> list[int]:
    """`row_ids` of one token after `history`, in Python ints: a decode step's ~16 rows took numpy's small-array
    calls ~60 us. The same values: the products are non-negative and fit int64, so neither XOR nor % differs."""
    seq = history + [token]
    t = len(seq) - 1
    last_eos = max((i for i in range(t) if seq[i] == eos), default=-1)
    shifted = [seq[t - s] if last_eos < t - s else eos for s in range(ngram_size)]
    out = []
    for n in range(2, ngram_size + 1):
        mixed = 0
        for p in range(n):
            mixed ^= shifted[p] * mult[p]
        first = (n - 2) * heads_per_ngram
        out += [mixed % sizes[h] + offsets[h] for h in range(first, first + heads_per_ngram)]
    return out


class NgramHasher:
    """The row ids of every PLE layer for a step's tokens, keeping the conversation's last N-1 tokens."""

    def __init__(self, vocab_size: int, ngram_size: int, heads_per_ngram: int, base: int, seed: int,
                 eos: int, num_ple_layers: int):
        self.ngram_size, self.heads_per_ngram, self.eos = ngram_size, heads_per_ngram, eos
        heads = (ngram_size - 1) * heads_per_ngram
        self.layers = []
        for index in range(num_ple_layers):
            sizes = np.array(head_vocab_sizes(base, index, heads), dtype=np.int64)
            offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            self.layers.append((multipliers(vocab_size, ngram_size, index, seed), sizes, offsets))
        self._as_ints = [tuple(a.tolist() for a in layer) for layer in self.layers]      # one_token_ids'
        self.history = self._fresh()

    def _fresh(self) -> list[int]:
        return [self.eos] * (self.ngram_size - 1)

    def step(self, tokens: list[int], start: int) -> list[np.ndarray]:
        """Per PLE layer the row ids [T, heads] of tokens at positions start.. (start 0: a new conversation)."""
        if start == 0:
            self.history = self._fresh()
        if len(tokens) == 1:
            ids = [np.array([one_token_ids(self.history, tokens[0], mult=m, sizes=s, offsets=o,
                                           ngram_size=self.ngram_size, heads_per_ngram=self.heads_per_ngram,
                                           eos=self.eos)], dtype=np.int64) for m, s, o in self._as_ints]
            self.history = (self.history + tokens)[-(self.ngram_size - 1):]
            return ids
        ids = [row_ids(self.history, tokens, mult=m, sizes=s, offsets=o, ngram_size=self.ngram_size,
                       heads_per_ngram=self.heads_per_ngram, eos=self.eos) for m, s, o in self.layers]
        self.history = (self.history + tokens)[-(self.ngram_size - 1):]
        return ids
