"""Copies paced to a slower link than this machine's (Options.copy_rate_gbps): the bench's simulation of another
card's PCIe (a PCIe 4.0 x16 card copies ~25 GB/s where the bench boxes copy ~55), so that the placement decides
and the runtime waits as they would there. Every figure measured with it says so (telemetry `copy_pacing`, a
warning): it is not this machine's speed.

  CudaPacing  a copy of n bytes is followed, on its copy stream, by a GPU spin for what the device's own copy
              lacks of n / rate: the copy stream is held, the decode thread is not;
  HostPacing  the CPU device's copy is a memcpy on the decode thread, so the mover sleeps out the rest.
Both directions are paced (a slot's victim written back crosses the same link).
"""
from __future__ import annotations

import time

import torch

from engine.runtime.placement import measure_copy_s
from engine.runtime.telemetry import Telemetry

SPIN_CYCLES = 10_000_000        # a calibration spin: ~5 ms at the ~2 GHz of a data-centre GPU's SMs


class HostPacing:
    def __init__(self, rate_bps: float):
        self.rate_bps = rate_bps

    def hold(self, num_bytes: int, took_s: float) -> None:
        """A copy of num_bytes that took took_s: sleep until it has taken num_bytes / rate."""
        rest = num_bytes / self.rate_bps - took_s
        if rest > 0:
            time.sleep(rest)


class CudaPacing:
    def __init__(self, rate_bps: float, device_s_per_byte: float, cycles_per_s: float):
        self.rate_bps = rate_bps
        self.device_s_per_byte = device_s_per_byte     # the device's own copy, measured (it is not spun again)
        self.cycles_per_s = cycles_per_s               # the spin kernel's clock
        self._owed_s = 0.0

    def owe(self, num_bytes: int) -> None:
        """A copy of num_bytes was enqueued: what it lacks of num_bytes / rate is owed to the stream."""
        self._owed_s += max(num_bytes / self.rate_bps - num_bytes * self.device_s_per_byte, 0.0)

    def settle(self) -> None:
        """Hold the current stream (the copy stream, inside a copy batch) for what its copies owe, before the
        event that marks them done is recorded."""
        if self._owed_s > 0:
            torch.cuda._sleep(int(self._owed_s * self.cycles_per_s))
            self._owed_s = 0.0


def make_pacing(rate_gbps: float | None, slot: torch.Tensor, telemetry: Telemetry) -> CudaPacing | HostPacing | None:
    """The pacing for copies into `slot`'s device at rate_gbps (None: not paced), recorded in the telemetry."""
    if rate_gbps is None:
        return None
    rate_bps = rate_gbps * 1e9
    if slot.device.type != "cuda":
        pacing, device_gbps = HostPacing(rate_bps), None
    else:
        device_s = measure_copy_s(torch.empty(slot.numel(), dtype=torch.uint8, pin_memory=True), slot)
        pacing = CudaPacing(rate_bps, device_s / slot.numel(), spin_cycles_per_s())
        device_gbps = slot.numel() / device_s / 1e9
    telemetry.info["copy_pacing"] = {"rate_gbps": rate_gbps, "device_gbps": device_gbps}
    telemetry.warn(f"Host-device copies are paced to {rate_gbps:g} GB/s (copy_rate_gbps, a simulated slower link): "
                   f"the speeds measured now are not this machine's.")
    return pacing


def spin_cycles_per_s() -> float:
    """The clock of torch.cuda._sleep's spin, timed by CUDA events (the median of three, after one to raise
    the clocks)."""
    torch.cuda._sleep(SPIN_CYCLES)
    rates = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(SPIN_CYCLES)
        end.record()
        end.synchronize()
        rates.append(SPIN_CYCLES / (start.elapsed_time(end) / 1e3))
    return sorted(rates)[1]
