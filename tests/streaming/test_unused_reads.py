"""Reads started ahead for guesses their layer did not use: the decode thread does not wait for them
(it goes on to its own layer's reads), and a RAM block stays locked until its read has landed."""
import threading
import time
from concurrent.futures import Future

from tests.streaming.sized import engine_with_slots, token_ids


def _pending_read(experts, key) -> Future:
    """A read of `key` that the test lands by hand: its RAM block inserted and locked as DiskReads.start does."""
    future = Future()
    future.set_running_or_notify_cancel()
    ram_slot = experts.cache.insert(key)
    experts.cache.lock(key)
    experts.reads.pending[key] = (ram_slot, future)
    return future


def test_a_wrong_guess_read_in_flight_is_not_waited_for(sluice_models):
    eng = engine_with_slots(sluice_models("qwen3_moe"), slots_per_bank=3, ram_blocks=6)
    try:
        token_ids(eng, [5, 17, 42], 2)
        experts = eng.runner.experts
        experts.synchronize()                               # the generation's own reads have landed
        layer = eng.spec.moe_layers[0]
        unused = (layer, eng.spec.num_experts - 1)
        future = _pending_read(experts, unused)
        start = time.perf_counter()
        experts._score_speculation(layer, actual={0})       # the layer used expert 0, not the guess
        assert time.perf_counter() - start < 0.05
        assert unused in experts.reads and experts.cache._locks.get(unused)    # still reading: locked
        future.set_result(None)                             # the read lands
        experts._score_speculation(layer, actual={0})       # the next time the layer runs
        assert unused not in experts.reads and not experts.cache._locks.get(unused)
        assert unused in experts.cache                      # the block stays cached for a later use
    finally:
        eng.close()


def test_a_full_ram_cache_waits_for_wrong_guess_reads_instead_of_failing(sluice_models):
    eng = engine_with_slots(sluice_models("qwen3_moe"), slots_per_bank=3, ram_blocks=4)
    experts, layer = eng.runner.experts, eng.spec.moe_layers[-1]
    wanted = (layer, eng.spec.num_experts - 1)
    futures = []
    try:
        token_ids(eng, [5, 17, 42], 2)
        experts.synchronize()                                   # the generation's own reads have landed
        ours = set()
        for expert in range(eng.spec.num_experts - 1):          # reads in flight until no RAM block is free
            key = (layer, expert)
            if not experts.cache.can_insert():
                break
            if key not in experts.cache:
                futures.append(_pending_read(experts, key))
                ours.add(key)
        experts._score_speculation(layer, actual={wanted[1]})    # none of them was used
        assert not experts.cache.can_insert() and experts.reads.unused == ours
        threading.Timer(0.1, lambda: [f.set_result(None) for f in futures]).start()
        ram_slot, read = experts.reads.start(wanted)            # waits for them to land, does not fail
        experts.reads.finish(wanted, read)
        experts.cache.unlock(wanted)
        assert not experts.reads.unused and wanted in experts.cache
    finally:
        for f in futures:
            if not f.done():
                f.set_result(None)
        eng.close()
