"""The placement cost model: how many RAM-resident misses the CPU takes, and which."""
from engine.runtime import placement
from engine.runtime.placement import Placement


def test_split_balances_cpu_and_copy_time_and_gives_the_cpu_the_coldest():
    uses = {1: 9.0, 2: 0.0, 3: 5.0, 4: 1.0}.get
    equal = Placement(cpu_s=1.0, copy_s=1.0)
    assert sorted(equal.cpu_share([1, 2, 3, 4], 1, uses)) == [2, 4]          # half each, the two coldest
    slow_cpu = Placement(cpu_s=3.0, copy_s=1.0)
    assert slow_cpu.cpu_share([1, 2, 3, 4], 1, uses) == [2]                  # max(3, 3) beats max(0, 4)
    assert Placement(cpu_s=10.0, copy_s=1.0).cpu_share([1, 2, 3, 4], 1, uses) == []
    assert Placement(cpu_s=0.1, copy_s=1.0).cpu_share([1, 2, 3, 4], 1, uses) == [2, 4, 3, 1]
    assert Placement(cpu_s=1.0, copy_s=1.0).cpu_share([1, 2], 4, uses) == []  # 4 tokens: 4x the CPU time
    # five prefetch copies still queued: a copied miss would wait behind them, so the CPU takes both
    assert sorted(slow_cpu.cpu_share([1, 2], 1, uses, queued=5)) == [1, 2]


def test_modes_and_the_running_cpu_estimate():
    assert Placement(cpu_s=100.0, copy_s=1.0, mode="all").cpu_share([5, 6], 1, lambda e: 0) == [5, 6]
    assert Placement(cpu_s=0.0, copy_s=1.0, mode="off").cpu_share([5, 6], 1, lambda e: 0) == []
    p = Placement(cpu_s=1.0, copy_s=1.0)
    for _ in range(100):
        p.observe(seconds=4.0, experts=2, num_tokens=1)                      # the CPU really takes 2 s an expert
    assert abs(p.cpu_s - 2.0) < 1e-3


def test_prefetch_copies_what_the_cpu_would_take_as_long_to_compute():
    assert Placement(cpu_s=1.0, copy_s=1.0).prefetch_count(6) == 3          # equal speeds: half each
    assert Placement(cpu_s=3.0, copy_s=1.0).prefetch_count(8) == 6          # a slow CPU keeps 2 of 8
    assert Placement(cpu_s=100.0, copy_s=1.0).prefetch_count(8) == 8
    assert Placement(cpu_s=1.0, copy_s=1.0, mode="all").prefetch_count(8) == 0   # tests: the CPU takes every one
    assert Placement(cpu_s=1.0, copy_s=1.0, mode="off").prefetch_count(8) == 8



def test_the_decode_threads_time_to_issue_copies_counts():
    """Copies are not free for the decode thread, which also computes the CPU's share: when issuing
    a copy costs it nearly what computing the expert does, the CPU takes fewer."""
    uses = {1: 9.0, 2: 0.0, 3: 5.0, 4: 1.0}.get
    free_copies = Placement(cpu_s=1.0, copy_s=1.0)
    costly_copies = Placement(cpu_s=1.0, copy_s=1.0, host_s=0.9)
    assert len(costly_copies.cpu_share([1, 2, 3, 4], 1, uses)) < len(free_copies.cpu_share([1, 2, 3, 4], 1, uses))
    assert costly_copies.prefetch_count(8) > free_copies.prefetch_count(8)
    p = Placement(cpu_s=0.0, copy_s=1.0)
    p.observe_copies(seconds=0.5, copies=5)
    assert p.host_s == 0.1                                                   # the first sample sets it


def test_one_stall_cannot_switch_the_cpu_share_off_for_good():
    """A 100x outlier (the machine stalled) moves the running estimate at most 2x, and the estimate
    stays within 5x of what was measured at load, so the CPU keeps getting work and new samples."""
    p = Placement(cpu_s=1.0, copy_s=1.0, cpu_load_s=1.0)
    p.observe(seconds=100.0, experts=1, num_tokens=1)
    assert p.cpu_s <= 1.0 + 0.1 * (2.0 - 1.0) + 1e-9
    for _ in range(200):
        p.observe(seconds=100.0, experts=1, num_tokens=1)
    assert p.cpu_s == 5.0


def test_auto_keeps_the_cpu_share_only_where_the_cpu_beats_a_copy():
    """Measured at load: an expert on the CPU and a block copy. Decoding, the CPU takes ~3x its load
    time, so "auto" keeps its share only where that is still faster than copying ("all": always)."""
    assert not Placement(cpu_s=141e-6, copy_s=138e-6, cpu_load_s=141e-6).pays_off()     # the H200 box
    assert Placement(cpu_s=150e-6, copy_s=790e-6, cpu_load_s=150e-6).pays_off()         # a PCIe 4.0 x4 card
    assert Placement(cpu_s=1.0, copy_s=0.0, mode="all", cpu_load_s=1.0).pays_off()
    assert not Placement(cpu_s=0.0, copy_s=1.0, mode="off").pays_off()


def test_the_live_factor_decides_where_a_cpu_share_pays_off(monkeypatch):
    """What decoding is taken to cost the CPU (LIVE_FACTOR x its load time) decides: a fused expert of 160 us at
    load against a 130 us copy gets no share at 3x, and would at 0.5x."""
    box = Placement(cpu_s=160e-6, copy_s=130e-6, cpu_load_s=160e-6)
    assert not box.pays_off()
    monkeypatch.setattr(placement, "LIVE_FACTOR", 0.5)
    assert box.pays_off()


OLMOE_BLOCK = 6_299_648        # the bench model's int8 expert block (OLMoE-1B-7B)
BOX_CPU_LOAD_S = 148e-6        # such an expert at load on the bench box's 16 cores (the fused kernel, ~42 GB/s of DRAM)
BOX_CPU_DECODING_S = 290e-6    # the same expert while decoding there (BENCHMARKS.md, docs/ENGINEERING.md)


def _on_a_link(gbps: float, mode: str = "auto") -> Placement:
    """The bench box's CPU against a link copying at gbps, decoding at its live speed."""
    return Placement(cpu_s=BOX_CPU_DECODING_S, copy_s=OLMOE_BLOCK / (gbps * 1e9), mode=mode, cpu_load_s=BOX_CPU_LOAD_S)


def test_where_the_bench_boxs_cpu_takes_misses_by_the_speed_of_the_link():
    """The box's own PCIe (55 GB/s), a PCIe 4.0 x16 card (25, the bench's --copy-rate-gbps 25) and a PCIe 3.0 x16 or
    4.0 x8 one (12.5). "auto" gives the CPU a share only where a copy takes more than LIVE_FACTOR times the CPU's load
    time (444 us: a link below ~14 GB/s), so at 25 GB/s the box still copies every miss; the split itself ("split",
    the A/B of that check) gives the CPU 1 of 4 misses at 55 GB/s, 2 at 25 and 3 at 12.5."""
    assert not _on_a_link(55.3).pays_off() and not _on_a_link(25).pays_off() and _on_a_link(12.5).pays_off()
    assert all(_on_a_link(gbps, "split").pays_off() for gbps in (55.3, 25, 12.5))
    misses = [0, 1, 2, 3]
    assert [len(_on_a_link(gbps, "split").cpu_share(misses, 1, float)) for gbps in (55.3, 25, 12.5)] == [1, 2, 3]
    assert [_on_a_link(gbps, "split").prefetch_count(4) for gbps in (55.3, 25, 12.5)] == [3, 2, 1]
