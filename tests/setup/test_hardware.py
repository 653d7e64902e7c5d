"""Hardware probing: performance cores on fake sysfs trees, thread pinning, the O_DIRECT disk self-test."""
from __future__ import annotations

import os
import sys
import threading

import pytest
import torch

from engine.plan import hardware
from engine.plan.hardware import format_cpu_list, parse_cpu_list, performance_cores, pin_current_thread_to_performance_cores


def _write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _cpufreq(root, max_freq_by_cpu):
    for cpu, freq in max_freq_by_cpu.items():
        _write(root, f"devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq", f"{freq}\n")


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("5") == [5]


def test_intel_hybrid_uses_cpu_core_list(tmp_path):
    _write(tmp_path, "devices/cpu_core/cpus", "0-11\n")            # i7-12700: 6 P-cores with HT
    _write(tmp_path, "devices/cpu_atom/cpus", "12-19\n")
    _cpufreq(tmp_path, {0: 4900000, 12: 3600000})                 # ignored: the hybrid list wins
    assert performance_cores(tmp_path) == list(range(12))


def test_without_hybrid_list_the_fastest_cpufreq_cores_win(tmp_path):
    _cpufreq(tmp_path, {0: 2000000, 1: 2000000, 2: 3200000, 3: 3200000, 10: 3200000})   # big.LITTLE
    assert performance_cores(tmp_path) == [2, 3, 10]


def test_equal_frequencies_mean_all_cores(tmp_path):
    _cpufreq(tmp_path, {0: 3000000, 1: 3000000, 2: 3000000})
    assert performance_cores(tmp_path) == [0, 1, 2]


def test_no_frequency_information_falls_back_to_online_cores(tmp_path):
    _write(tmp_path, "devices/system/cpu/online", "0-5\n")
    assert performance_cores(tmp_path) == [0, 1, 2, 3, 4, 5]
    assert performance_cores(tmp_path / "missing") == list(range(os.cpu_count()))


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """Pinning sizes torch's (process-wide) thread pool; later tests get it back as it was."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.skipif(sys.platform != "linux", reason="thread affinity is a Linux call")
def test_pinning_moves_only_the_calling_thread_to_the_allowed_performance_cores(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    fastest = allowed[-1]
    _cpufreq(tmp_path, {c: (3600000 if c == fastest else 2400000) for c in allowed})
    before = os.sched_getaffinity(0)
    result = {}

    def worker():
        result["cores"] = pin_current_thread_to_performance_cores(tmp_path)
        result["affinity"] = os.sched_getaffinity(0)
        result["torch_threads"] = torch.get_num_threads()
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert result["cores"] == [fastest] and result["affinity"] == {fastest}
    assert result["torch_threads"] == 1                           # no more compute threads than pinned cores
    assert os.sched_getaffinity(0) == before                      # the test's own thread is untouched


@pytest.mark.skipif(sys.platform != "linux", reason="thread affinity is a Linux call")
def test_pinning_falls_back_to_allowed_cores_when_performance_cores_are_off_limits(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    _write(tmp_path, "devices/cpu_core/cpus", f"{max(allowed) + 100}\n")   # a P-core this process may not use
    result = {}
    thread = threading.Thread(target=lambda: result.update(cores=pin_current_thread_to_performance_cores(tmp_path)))
    thread.start()
    thread.join()
    assert result["cores"] == allowed


def test_cpu_list_round_trips():
    assert format_cpu_list([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert parse_cpu_list(format_cpu_list([5, 1, 2])) == [1, 2, 5]


def test_disk_self_test_measures_a_plausible_speed_and_cleans_up(tmp_path):
    bps = hardware.disk_read_bandwidth(tmp_path, test_bytes=8 * hardware.MiB, read_bytes=hardware.MiB)
    assert 1e6 < bps < 1e12                                       # between 1 MB/s and 1 TB/s
    assert list(tmp_path.iterdir()) == []


def test_probe_reports_ram_cpus_and_measured_bandwidths(tmp_path):
    hw = hardware.probe(tmp_path, disk_test_bytes=4 * hardware.MiB, measure_gpu=False)
    assert hw.ram_total_bytes >= hw.ram_available_bytes > 0
    assert hw.num_cpus == os.cpu_count() and set(hw.performance_cores) <= set(range(4096))
    assert hw.mem_bw_bps > 1e8 and hw.disk_read_bps > 1e6 and not hw.has_gpu


def _cgroup_tree(tmp_path, limits: dict[str, tuple[str, int]]):
    """A fake cgroup v2 tree: {relative group: (memory.max, memory.current)} and /proc/self/cgroup."""
    root = tmp_path / "cgroup"
    for group, (limit, current) in limits.items():
        d = root / group if group else root
        d.mkdir(parents=True, exist_ok=True)
        (d / "memory.max").write_text(f"{limit}\n")
        (d / "memory.current").write_text(f"{current}\n")
    return root


def test_available_memory_honours_the_tightest_cgroup_limit(tmp_path):
    gib = 2**30
    root = _cgroup_tree(tmp_path, {"": ("max", 0), "box": (str(6 * gib), 1 * gib),
                                   "box/app": (str(4 * gib), int(2.5 * gib))})
    proc = tmp_path / "cgroup.txt"
    proc.write_text("0::/box/app\n")
    assert hardware.available_memory(root, proc) == int(1.5 * gib)        # 4 GiB cap, 2.5 GiB already in use
    (root / "box/app/memory.stat").write_text(f"anon 1000\nfile {gib // 2 + 7}\nshmem 7\ninactive_file {gib // 4}\n")
    assert hardware.available_memory(root, proc) == 2 * gib                # page cache is room too, shared memory not
    (root / "box/app/memory.stat").write_text(f"anon 1000\ninactive_file {gib // 2}\nactive_file 7\n")
    assert hardware.available_memory(root, proc) == 2 * gib                # an older kernel's stats: the inactive part
    (root / "box/app/memory.max").write_text("max\n")
    assert hardware.available_memory(root, proc) == 5 * gib                # the parent's cap applies
    import psutil
    (root / "box/memory.max").write_text("max\n")
    assert hardware.available_memory(root, proc) <= psutil.virtual_memory().available
    assert hardware.available_memory(root, tmp_path / "missing") > 0      # no cgroup file: the system's figure


def test_compute_threads_leave_smt_siblings_or_one_of_many_cores_to_the_rest(tmp_path):
    """torch's compute threads: one per physical core where cores have SMT siblings; without, every core
    of a few, all but one of 8 or more (a compute thread pushed off its core stalls every parallel op)."""
    from engine.plan.hardware import compute_threads
    for cpu in range(8):                                 # 4 physical cores, siblings n and n + 4
        _write(tmp_path, f"devices/system/cpu/cpu{cpu}/topology/thread_siblings_list", f"{cpu % 4},{cpu % 4 + 4}\n")
    assert compute_threads(list(range(8)), tmp_path) == 4
    assert compute_threads([0, 1, 4], tmp_path) == 2     # cores 0 and 4 are one physical core
    assert compute_threads([0, 1, 2], tmp_path) == 3     # no sibling among them: a few cores, all of them
    missing = tmp_path / "none"
    assert compute_threads(list(range(6)), missing) == 6 and compute_threads([3], missing) == 1
    assert compute_threads(list(range(16)), missing) == 15
