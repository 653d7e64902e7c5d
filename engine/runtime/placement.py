"""Where a layer's routed experts are computed: the cost model of hybrid CPU + GPU execution.

For one decode step of a layer:
  in a VRAM slot        -> the GPU computes it (nothing moves);
  in the RAM cache      -> k of these n experts are computed by the CPU where they sit, the other
                           n - k are copied into a slot and computed by the GPU; k minimises
                           max(k * cpu_s + (n - k) * host_s, (q + n - k) * copy_s): the decode
                           thread computes the CPU's share and issues each copy (host_s of its time,
                           its bookkeeping included), while the copy stream moves the blocks, q
                           copies already queued ahead (when none are left to copy, their wait is 0);
  on disk               -> read into RAM, then copied (the read dominates either way).
The next layer's speculative prefetch follows the same split (prefetch_count): it copies the hottest
predicted RAM-resident experts ahead and leaves the coldest to the CPU, so the copy stream does not
fill with blocks the CPU could have computed in place.
cpu_s (one expert, one token, on the CPU) and copy_s (one block over PCIe) are measured on this
machine when the model loads; cpu_s and host_s then follow what decoding really takes, each sample
bounded (a stall of the machine cannot switch the CPU's share off for good). The coldest experts
go to the CPU: the hot ones are the ones worth a VRAM slot (copied, they stay resident).
Modes: "auto" the split where the CPU pays off (pays_off), "all" every RAM-resident miss to the CPU, "off" none.
On a GPU "auto" then checks its prediction on the running decode (ShareTrial): near the threshold the split and
copying every miss differ by less than the model's error (what the CPU's threads cost the decode thread and the
copy engine is not in it), so decode steps alternate between the two and the faster is kept.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch


SMOOTHING = 0.1                     # weight of a new timing in a running estimate
MAX_STEP = 2.0                      # one sample moves an estimate at most this factor up (or down)
CPU_RANGE = (0.5, 5.0)              # the running cpu_s stays within these factors of the one measured at load
# An expert computed while decoding takes about 2.2x what the same expert took at load (DRAM instead of cache,
# threads waking, the decode thread's other work): "auto" turns the CPU's share on only where that slower CPU
# beats a copy. Then the cost model's split is faster than copying every miss; where it does not, the same split
# forced on is slower (the CPU's DRAM reads and the copy engine's compete).
LIVE_FACTOR = 2.2
TRIAL_STEPS = 32                    # decode steps a trial window times, with the CPU's share and without
HOLD_STEPS = 1024                   # decode steps a trial's verdict holds before the two are timed again


class ShareTrial:
    """Whether the CPU's share is on, decided by timing decode steps: windows of `window` steps with the share and
    without, one after the other (each window's first step not counted: the copies and the CPU's threads settle),
    then the one whose median step was shorter holds for `hold` steps, and the two are timed again."""

    def __init__(self, window: int = TRIAL_STEPS, hold: int = HOLD_STEPS):
        self.window, self.hold = window, hold
        self.on = True
        self.verdict: dict | None = None        # the last decision: median seconds a step with and without the share
        self._times: dict[bool, list[float]] = {True: [], False: []}
        self._held = 0                          # steps left of the current verdict (0: timing)
        self._fresh = True                      # the window's first step, not counted

    def step(self, seconds: float | None) -> bool:
        """A decode step took `seconds` (from one step's start to the next's; None where a prompt ran between) ->
        whether this step made a new verdict."""
        if self._held:
            self._held -= 1
            if not self._held:
                self._times = {True: [], False: []}
                self.on, self._fresh = True, True
            return False
        if seconds is None or self._fresh:
            self._fresh = False
            return False
        times = self._times[self.on]
        times.append(seconds)
        if len(times) < self.window:
            return False
        if len(self._times[not self.on]) < self.window:
            self.on, self._fresh = not self.on, True
            return False
        with_share, without = (_median(self._times[True]), _median(self._times[False]))
        self.on = with_share < without
        self.verdict = {"with_share_s": with_share, "without_s": without, "on": self.on}
        self._held = self.hold
        return True


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


@dataclass
class Placement:
    cpu_s: float             # seconds for the CPU to compute one expert for one token
    copy_s: float            # seconds to copy one expert block host -> device (the copy stream's time)
    mode: str = "auto"
    host_s: float = 0.0      # seconds of the decode thread's time to issue one copy (bookkeeping included)
    cpu_load_s: float = 0.0  # cpu_s as measured at load (bounds the running estimate)
    trial: ShareTrial | None = None     # mode "auto" on a GPU: the share on only where the decode steps say so

    def pays_off(self) -> bool:
        """Whether the CPU's share is worth having at all: mode "all" always, "auto" where an expert
        computed while decoding (LIVE_FACTOR x what it took at load) is faster than copying its block."""
        return self.mode == "all" or (self.mode == "auto" and self.cpu_load_s * LIVE_FACTOR < self.copy_s)

    def share_paused(self) -> bool:
        """The trial has the share off for now."""
        return self.trial is not None and not self.trial.on

    def cpu_share(self, candidates: list, num_tokens: int, uses: Callable[[object], float], queued: int = 0) -> list:
        """The candidates (RAM-resident misses) the CPU computes: the k least used. `queued`: copies
        still ahead of them on the copy stream (prefetches), which a copied miss waits behind."""
        if self.mode == "off" or not candidates or self.share_paused():
            return []
        n = len(candidates)
        k = n if self.mode == "all" else self._best_k(n, num_tokens, queued)
        return sorted(candidates, key=uses)[:k]

    def prefetch_count(self, n: int) -> int:
        """Of n predicted RAM-resident experts of the next layer, how many to copy ahead: the same
        split, the CPU taking the rest when that layer runs (mode "all": none, the CPU computes every
        RAM-resident miss)."""
        if self.mode == "off" or (self.mode == "auto" and self.cpu_s <= 0) or self.share_paused():
            return n
        return 0 if self.mode == "all" else n - self._best_k(n, 1, 0)

    def _best_k(self, n: int, num_tokens: int, queued: int) -> int:
        return min(range(n + 1), key=lambda k: (self._step_s(k, n - k, num_tokens, queued), -k))

    def _step_s(self, on_cpu: int, copied: int, num_tokens: int, queued: int) -> float:
        """Both sides at once: the decode thread (the CPU's experts, issuing the copies) and the copy
        stream (the copies, behind the queued ones, if any copy)."""
        host = on_cpu * self.cpu_s * num_tokens + copied * self.host_s
        stream = (queued + copied) * self.copy_s if copied else 0.0
        return max(host, stream)

    def observe(self, seconds: float, experts: int, num_tokens: int) -> None:
        """A CPU batch took `seconds` for `experts` experts of `num_tokens` tokens."""
        if experts:
            self.cpu_s = _follow(self.cpu_s, seconds / (experts * num_tokens))
            if self.cpu_load_s > 0:
                low, high = CPU_RANGE
                self.cpu_s = min(max(self.cpu_s, low * self.cpu_load_s), high * self.cpu_load_s)

    def observe_copies(self, seconds: float, copies: int) -> None:
        """Issuing `copies` copies took the decode thread `seconds`."""
        if copies:
            self.host_s = _follow(self.host_s, seconds / copies)


def _follow(estimate: float, sample: float) -> float:
    """A running average that one outlier moves at most MAX_STEP-fold."""
    if estimate <= 0:
        return sample
    sample = min(max(sample, estimate / MAX_STEP), estimate * MAX_STEP)
    return estimate + SMOOTHING * (sample - estimate)


def measure_cpu_s(compute: Callable[[], object], repeats: int = 7) -> float:
    """Seconds one call of `compute` (one expert, one token on the CPU) takes: the median of a few
    calls after warming up (a stall of the machine during one call does not count)."""
    for _ in range(2):
        compute()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        compute()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def measure_copy_s(src: torch.Tensor, dst: torch.Tensor, repeats: int = 5, pacing=None) -> float:
    """Seconds to copy one pinned host block into a device slot (CUDA events), each copy paced as the mover
    paces it where `pacing` (engine.runtime.pacing.CudaPacing) simulates a slower link."""
    dst.copy_(src, non_blocking=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        dst.copy_(src, non_blocking=True)
        if pacing is not None:
            pacing.owe(src.numel() * src.element_size())
            pacing.settle()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats
