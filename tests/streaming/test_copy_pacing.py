"""Copies paced to a simulated slower link (Options.copy_rate_gbps): the option parses, reaches the mover and the
placement's copy measurement, changes no token, and every figure measured with it says so."""
import time

import pytest
import torch

from engine.errors import SluiceError
from engine.options import Options
from engine.runtime import kernel_warmup, pacing
from engine.runtime.pacing import CudaPacing, HostPacing, make_pacing
from engine.runtime.placement import measure_copy_s
from engine.runtime.telemetry import Telemetry
from engine.tools.bench import engine_options
from engine.tools.cli import build_parser

from tests.streaming.sized import engine_with_slots, token_ids

PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 1, 300]


def test_the_copy_rate_parses_everywhere_options_are_built():
    assert Options.parse(["copy_rate_gbps=25"]).copy_rate_gbps == 25.0
    assert Options.parse(["copy-rate-gbps=12.5", "copy_rate_gbps=none"]).copy_rate_gbps is None
    for bad, says in (("fast", "takes a number or 'default', not 'fast'"), ("0", "more than 0 GB/s, not 0.0"),
                      ("-3", "more than 0 GB/s, not -3.0")):
        with pytest.raises(SluiceError, match=says):
            Options.parse([f"copy_rate_gbps={bad}"])
    paced = Options(copy_rate_gbps=25.0)            # the kernel warm-up child measures as its parent will
    assert Options.parse(kernel_warmup.child_settings(paced)[1::2]) == paced.replace(kernel_warmup=False)
    assert Options.parse(kernel_warmup.child_settings(Options())[1::2]).copy_rate_gbps is None
    bench = build_parser().parse_args(["bench", "--preset", "olmoe-1b-7b", "--copy-rate-gbps", "25"])
    assert engine_options(bench).copy_rate_gbps == 25.0
    bench = build_parser().parse_args(["bench", "--preset", "olmoe-1b-7b", "--set", "copy_rate_gbps=12.5"])
    assert engine_options(bench).copy_rate_gbps == 12.5


def test_a_cuda_copy_is_held_for_what_the_device_lacks_of_the_slower_rate(monkeypatch):
    """The spin after a batch of copies: bytes / rate less the device's own copy time, in the spin's cycles; none
    where the device is slower than the simulated link already."""
    spins = []
    monkeypatch.setattr(pacing.torch.cuda, "_sleep", spins.append)
    block = 6_299_648                                  # an OLMoE int8 expert block
    link = CudaPacing(rate_bps=25e9, device_s_per_byte=1 / 55e9, cycles_per_s=2e9)
    link.owe(block)
    link.owe(block)                                    # a batch of two copies: one spin before its done event
    link.settle()
    link.settle()                                      # nothing more owed: no second spin
    assert spins == [int(2 * block * (1 / 25e9 - 1 / 55e9) * 2e9)]
    faster = CudaPacing(rate_bps=100e9, device_s_per_byte=1 / 55e9, cycles_per_s=2e9)
    faster.owe(block)
    faster.settle()
    assert len(spins) == 1


def test_a_host_copy_sleeps_out_the_rest():
    start = time.perf_counter()
    HostPacing(rate_bps=1e6).hold(20_000, took_s=0.005)           # 20 ms at 1 MB/s, 5 of them spent copying
    assert 0.015 <= time.perf_counter() - start < 0.1
    start = time.perf_counter()
    HostPacing(rate_bps=1e6).hold(20_000, took_s=0.05)
    assert time.perf_counter() - start < 0.005


def test_paced_copies_reach_the_mover_change_no_token_and_say_so(sluice_models):
    """A model whose experts stream through 3 slots a bank: its copies paced to 10 MB/s copy at most that fast,
    the tokens are the unpaced run's, and the telemetry and the warnings say the link was simulated."""
    path, rate_gbps = sluice_models("olmoe", "bf16"), 0.01
    runs = {}
    for rate in (None, rate_gbps):
        eng = engine_with_slots(path, 3, 12, options=Options(copy_rate_gbps=rate, kernel_warmup=False))
        try:
            runs[rate] = token_ids(eng, PROMPT, 8), eng.telemetry(), eng.runner.experts.mover.pacing
        finally:
            eng.close()
    (plain, plain_snap, none), (paced, snap, link) = runs[None], runs[rate_gbps]
    assert paced == plain and none is None and plain_snap["copy_pacing"] is None
    assert link is not None and link.rate_bps == rate_gbps * 1e9
    assert snap["h2d"]["bytes"] > 0 and snap["h2d"]["gbps"] <= rate_gbps * 1.05 < plain_snap["h2d"]["gbps"]
    assert snap["copy_pacing"]["rate_gbps"] == rate_gbps
    assert any("paced to 0.01 GB/s" in w and "not this machine's" in w for w in snap["warnings"])


@pytest.mark.gpu
def test_paced_copies_on_a_gpu_take_bytes_over_rate_and_leave_the_host_free():
    """256 MB copied at a simulated 25 GB/s takes ~10.7 ms on the copy stream (not the ~5 ms of PCIe 5.0), the
    host returns at once, and the placement's copy measurement sees the paced rate."""
    num_bytes, rate_gbps = 256 << 20, 25.0
    slot = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    src = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)
    telemetry = Telemetry()
    link = make_pacing(rate_gbps, slot, telemetry)
    assert telemetry.info["copy_pacing"]["device_gbps"] > rate_gbps        # this box's own link is faster
    stream = torch.cuda.Stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        start.record()
        host = time.perf_counter()
        slot.copy_(src, non_blocking=True)
        link.owe(num_bytes)
        link.settle()
        host = time.perf_counter() - host
        end.record()
    end.synchronize()
    expected_s = num_bytes / (rate_gbps * 1e9)
    assert 0.97 * expected_s <= start.elapsed_time(end) / 1e3 <= 1.1 * expected_s
    assert host < 0.3 * expected_s
    block = src[:6_299_648]
    assert measure_copy_s(block, slot[:6_299_648], pacing=link) >= 0.97 * block.numel() / (rate_gbps * 1e9)
    assert measure_copy_s(block, slot[:6_299_648]) < 0.8 * block.numel() / (rate_gbps * 1e9)


def test_speeds_measured_on_a_simulated_link_are_kept_apart_from_the_machines_own():
    from engine.format.layout import block_layout
    from engine.runtime.load_speeds import speeds_key
    args = (torch.device("cpu"), block_layout(1024, 2048, "int8"), None, torch.bfloat16, 15, "auto")
    assert speeds_key(*args, 25.0) != speeds_key(*args) == speeds_key(*args, None)
    assert speeds_key(*args, 25.0).endswith("|copies paced to 25 GB/s")
