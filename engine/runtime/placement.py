"""Where a layer's routed experts are computed: the cost model of hybrid CPU + GPU execution.

For one decode step of a layer:
  in a VRAM slot        -> the GPU computes it (nothing moves);
  in the RAM cache      -> k of these n experts are computed by the CPU where they sit, the other
                           n - k are copied into a slot and computed by the GPU; k minimises
                           max(k * cpu_s, (q + n - k) * copy_s), both sides running at once, q the
                           copies already queued ahead (when none are left to copy, their wait is 0);
  on disk               -> read into RAM, then copied (the read dominates either way).
The next layer's speculative prefetch follows the same split (prefetch_count): it copies the hottest
predicted RAM-resident experts ahead and leaves the coldest to the CPU, so the copy stream does not
fill with blocks the CPU could have computed in place.
cpu_s (one expert, one token, on the CPU) and copy_s (one block over PCIe) are measured on this
machine when the model loads, and cpu_s follows what the CPU then really takes. The coldest experts
go to the CPU: the hot ones are the ones worth a VRAM slot (copied, they stay resident).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

import torch

# A copy delays the whole token, a CPU expert only its own layer: the copy stream is shared by every
# layer and runs ahead of them (prefetch), so in a streaming decode it is the bottleneck, while the CPU
# waits idle outside its layer's share. The cost model charges a copy this many times its duration.
COPY_COST = float(os.environ.get("SLUICE_COPY_COST", "1"))
MODES = ("auto", "all", "off")      # auto: the cost model; all: every RAM-resident miss on the CPU (tests)
SMOOTHING = 0.1                     # weight of a new CPU timing in the running estimate


@dataclass
class Placement:
    cpu_s: float             # seconds for the CPU to compute one expert for one token
    copy_s: float            # seconds to copy one expert block host -> device
    mode: str = "auto"
    copy_cost: float = 1.0   # what a copy costs the token, in copy_s: see COPY_COST

    def cpu_share(self, candidates: list, num_tokens: int, uses: Callable[[object], float], queued: int = 0) -> list:
        """The candidates (RAM-resident misses) the CPU computes: the k least used. `queued`: copies
        still ahead of them on the copy stream (prefetches), which a copied miss waits behind."""
        if self.mode == "off" or not candidates:
            return []
        n = len(candidates)
        if self.mode == "all":
            k = n
        else:
            k = min(range(n + 1), key=lambda j: (self._step_s(j, n - j, num_tokens, queued), -j))
        return sorted(candidates, key=uses)[:k]

    def prefetch_count(self, n: int) -> int:
        """Of n predicted RAM-resident experts of the next layer, how many to copy ahead: the split
        where the CPU's share of them, k = n - count, takes as long as the copies, k * cpu_s =
        count * copy_s * copy_cost (mode "all": none, the CPU computes every RAM-resident miss)."""
        if self.mode == "off":
            return n
        if self.mode == "all" or self.cpu_s <= 0:
            return 0 if self.mode == "all" else n
        copy_s = self.copy_s * self.copy_cost
        return min(n, round(n * self.cpu_s / (self.cpu_s + copy_s)))

    def _step_s(self, on_cpu: int, copied: int, num_tokens: int, queued: int) -> float:
        """Both sides at once: the CPU's experts, and the copies (behind the queued ones, if any copy)."""
        copy_s = (queued + copied) * self.copy_s * self.copy_cost if copied else 0.0
        return max(on_cpu * self.cpu_s * num_tokens, copy_s)

    def observe(self, seconds: float, experts: int, num_tokens: int) -> None:
        """A CPU batch took `seconds` for `experts` experts of `num_tokens` tokens."""
        if experts:
            sample = seconds / (experts * num_tokens)
            self.cpu_s += SMOOTHING * (sample - self.cpu_s)


def measure_cpu_s(compute: Callable[[], object], repeats: int = 5) -> float:
    """Seconds one call of `compute` (one expert, one token on the CPU) takes, after warming up."""
    for _ in range(2):
        compute()
    start = time.perf_counter()
    for _ in range(repeats):
        compute()
    return (time.perf_counter() - start) / repeats


def measure_copy_s(src: torch.Tensor, dst: torch.Tensor, repeats: int = 5) -> float:
    """Seconds to copy one pinned host block into a device slot (CUDA events)."""
    dst.copy_(src, non_blocking=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        dst.copy_(src, non_blocking=True)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats
