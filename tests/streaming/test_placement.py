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
    """Measured at load: an expert on the CPU and a block copy. Decoding, the CPU takes ~2.2x its load
    time, so "auto" keeps its share only where that is still faster than copying ("all": always)."""
    assert not Placement(cpu_s=141e-6, copy_s=138e-6, cpu_load_s=141e-6).pays_off()     # the H200 box
    assert Placement(cpu_s=150e-6, copy_s=790e-6, cpu_load_s=150e-6).pays_off()         # a PCIe 4.0 x4 card
    assert Placement(cpu_s=1.0, copy_s=0.0, mode="all", cpu_load_s=1.0).pays_off()
    assert not Placement(cpu_s=0.0, copy_s=1.0, mode="off").pays_off()


def test_the_live_factor_decides_where_a_cpu_share_pays_off(monkeypatch):
    """What decoding is taken to cost the CPU (LIVE_FACTOR x its load time) decides: a fused expert of 160 us at
    load against a 130 us copy gets no share at 2.2x, and would at 0.5x."""
    box = Placement(cpu_s=160e-6, copy_s=130e-6, cpu_load_s=160e-6)
    assert not box.pays_off()
    monkeypatch.setattr(placement, "LIVE_FACTOR", 0.5)
    assert box.pays_off()


OLMOE_BLOCK = 6_299_648        # the bench model's int8 expert block (OLMoE-1B-7B)
H200_CPU_LOAD_S = 148e-6       # such an expert at load on the H200 box's 16 cores (the fused kernel, ~42 GB/s of DRAM)
H200_CPU_DECODING_S = 290e-6   # the same expert while decoding there
H100_CPU_LOAD_S = 102e-6       # at load on the H100 box's 16 cores
H100_COPY_25_S = 269e-6        # a block's copy there, paced to 25 GB/s (--copy-rate-gbps 25), as the placement measures it


def _on_a_link(gbps: float, cpu_load_s: float = H200_CPU_LOAD_S, copy_s: float | None = None) -> Placement:
    """A bench box's CPU against a link copying at gbps, decoding at its live speed."""
    return Placement(cpu_s=cpu_load_s * placement.LIVE_FACTOR, copy_s=copy_s or OLMOE_BLOCK / (gbps * 1e9),
                     cpu_load_s=cpu_load_s)


def test_where_the_bench_boxs_cpu_takes_misses_by_the_speed_of_the_link():
    """The boxes' own PCIe (55 GB/s), a PCIe 4.0 x16 card (25, the bench's --copy-rate-gbps 25) and a PCIe 3.0 x16 or
    4.0 x8 one (12.5). At 25 GB/s the H100 box's CPU (102 us an expert at load, ~225 us decoding) beats a paced copy
    (269 us), and the cost model's split there decodes faster than copying every miss; at 55 GB/s the same split is
    slower, and "auto" copies every miss. The H200 box's slower CPU takes misses only below ~19 GB/s. Where the
    share is on, the split follows the link: 2 of 4 misses to the CPU at 25 GB/s, 3 at 12.5."""
    assert _on_a_link(25, H100_CPU_LOAD_S, H100_COPY_25_S).pays_off()
    assert not _on_a_link(55.3, H100_CPU_LOAD_S).pays_off()
    assert not _on_a_link(55.3).pays_off() and not _on_a_link(25).pays_off() and _on_a_link(12.5).pays_off()
    assert abs(H200_CPU_LOAD_S * placement.LIVE_FACTOR - H200_CPU_DECODING_S) < 0.15 * H200_CPU_DECODING_S
    misses = [0, 1, 2, 3]
    assert len(_on_a_link(25, H100_CPU_LOAD_S, H100_COPY_25_S).cpu_share(misses, 1, float)) == 2
    assert len(_on_a_link(12.5).cpu_share(misses, 1, float)) == 3
    assert _on_a_link(12.5).prefetch_count(4) == 1
