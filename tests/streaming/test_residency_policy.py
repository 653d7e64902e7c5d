"""The residency policy in plain Python over block keys (engine/runtime/residency.py): no torch, no tensors,
so each rule is checked in milliseconds on hand-made states."""
import subprocess
import sys
from pathlib import Path

from engine.runtime.residency import (FillPlan, SlotPolicy, copies_ahead, hottest, keys_to_read, ram_victim,
                                      reads_ahead, split_resident, writes_back)

ROOT = Path(__file__).resolve().parents[2]


def test_the_policy_imports_no_torch():
    code = "import sys, engine.runtime.residency; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_find_splits_resident_experts_from_misses_in_routing_order():
    policy = SlotPolicy(4)
    for expert in (7, 3):
        policy.acquire((0, expert), protected=set())
    slot_of, late = split_resident([5, 3, 9, 7], lambda e: policy.find((0, e)))
    assert slot_of == {3: 1, 7: 0} and late == [5, 9]
    assert policy.find((1, 3)) is None                    # layer 1 is the other bank


def test_the_victim_is_the_least_used_lately_never_a_protected_block():
    policy = SlotPolicy(3)
    for expert in (1, 2, 3):
        policy.acquire((0, expert), protected=set())
    for _ in range(4):
        policy.note_used(0, [1, 1, 3])                    # 1 hot, 3 warm, 2 never used
    policy.acquire((0, 4), protected=set())
    assert policy.last_evicted == ((0, 2), 1) and policy.holds((0, 4))
    policy.acquire((0, 5), protected={(0, 3), (0, 4)})    # the coldest unprotected left: 1
    assert policy.last_evicted[0] == (0, 1)


def test_a_sweep_evicts_its_own_blocks_and_keeps_what_was_resident_before():
    policy = SlotPolicy(4)
    for expert in range(4):
        policy.acquire((0, expert), protected=set())
        policy.note_used(0, [expert])
    policy.begin_sweep()
    policy.acquire((0, 10), protected=set())              # nothing swept yet: the usual victim
    first = policy.last_evicted[0]
    for expert in range(11, 20):
        policy.acquire((0, expert), protected={(0, expert)})
        assert policy.last_evicted_swept and policy.last_evicted[0][1] >= 10    # one of the sweep's own
    assert policy.end_sweep() == [(0, 19)]
    assert all(policy.holds((0, e)) for e in range(4) if (0, e) != first)
    assert writes_back(first, sweeping=True, evicted_by_sweep=False)          # a block from before: kept in RAM
    assert not writes_back((0, 11), sweeping=True, evicted_by_sweep=True)     # the sweep's own: passes through
    assert writes_back((0, 11), sweeping=False, evicted_by_sweep=False) and not writes_back(None, False, False)


def test_ram_victim_takes_a_demoted_block_first_then_the_least_used_of_the_oldest():
    entries = [(0, 1), (0, 2), (0, 3), (0, 4)]            # least recent first
    uses = {(0, 1): 5.0, (0, 2): 0.5, (0, 3): 0.1, (0, 4): 0.0}.get
    locked = {(0, 1): 1}.get
    assert ram_victim(entries, locked, demoted={(0, 2)}, uses=uses, window=2, num_locked=1) == (0, 2)
    assert ram_victim(entries, locked, demoted=set(), uses=uses, window=2, num_locked=1) == (0, 3)
    assert ram_victim(entries, locked, demoted=set(), uses=None, window=2, num_locked=1) == (0, 2)   # plain LRU
    assert ram_victim([(0, 1)], locked, demoted=set(), uses=uses, window=2, num_locked=1) is None


def test_prefetch_choice_counts_and_order():
    assert [copies_ahead(n, None) for n in (1, 2, 7, 8)] == [1, 1, 3, 4]        # the better half, at least one
    assert copies_ahead(8, 0) == 0 and copies_ahead(8, 100) == 100
    assert reads_ahead(8, None, all_guesses=False) == 4 and reads_ahead(8, None, all_guesses=True) == 8
    assert reads_ahead(8, 2, all_guesses=True) == 2
    assert hottest([4, 5, 6], {4: 0.5, 5: 2.0, 6: 1.0}.get, 2) == [5, 6]
    held, room = {(1, 2)}, [2]

    def has_room():
        return room[0] > 0
    chosen = []
    for key in keys_to_read([(1, 1), (1, 2), (1, 3), (1, 4)], held.__contains__, has_room):
        chosen.append(key)
        room[0] -= 1                                      # each read started takes a RAM block
    assert chosen == [(1, 1), (1, 3)]


def test_the_fill_plan_goes_in_model_order_and_skips_what_is_held():
    plan = FillPlan([(0, 0), (0, 1), (1, 0), (1, 1)])
    held = {(0, 1)}
    assert plan.next_key(held.__contains__) == (0, 0)
    assert plan.next_key(held.__contains__) == (1, 0)
    assert plan
    held.add((1, 1))
    assert plan.next_key(held.__contains__) is None and not plan
    plan = FillPlan([(0, 0)])
    plan.clear()
    assert not plan and plan.next_key(lambda key: False) is None
