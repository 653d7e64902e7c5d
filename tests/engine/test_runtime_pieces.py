"""The runtime's pieces on their own: declared telemetry, model state, and the decode step agreeing
with prefill (one model definition drives both)."""
import platform

import pytest
import torch

import engine
from engine.model.state import ModelState, StateSpec, state_bytes
from engine.runtime.telemetry import COUNTERS, Telemetry, delta, phase_hit_rate


def test_a_misspelt_telemetry_counter_fails_instead_of_becoming_a_new_one():
    t = Telemetry()
    with pytest.raises(KeyError, match="ram_hist"):
        t.add(ram_hist=1)
    with pytest.raises(KeyError):
        t.set(decode_toks=1.0)
    assert "ram_hits" in COUNTERS


def test_hit_rates_and_phase_deltas_are_derived_in_one_place():
    t = Telemetry()
    t.add(ram_hits=1, ram_misses=3, vram_hits=6, vram_misses=2)
    before = t.snapshot()
    t.add(ram_hits=3, ram_misses=1)
    after = t.snapshot()
    assert after["ram_cache"]["hit_rate"] == 0.5 and after["vram"]["hit_rate"] == 0.75
    assert phase_hit_rate(after, before, "ram_cache") == 0.75           # only what happened in between
    assert delta(after, before, "ram_cache", "hits") == 3
    assert Telemetry().snapshot()["ram_cache"]["hit_rate"] == 0.0        # nothing looked up yet


def test_growing_state_keeps_earlier_positions_and_reset_clears_fixed_state():
    specs = [{"k": StateSpec((2,)), "conv": StateSpec((3,), per_token=False)}]
    state = ModelState(specs, max_tokens=40, dtype=torch.float32, device=torch.device("cpu"), static=False,
                       initial_tokens=4)
    first = torch.arange(6.0).view(3, 2)
    state.append(0, "k", torch.arange(3), 0, first)
    grown = state.append(0, "k", torch.arange(3, 9), 3, torch.ones(6, 2))     # past the initial 4: grows
    assert grown.shape == (9, 2) and torch.equal(grown[:3], first)
    state.fixed(0, "conv").fill_(5)
    state.reset()
    assert state.fixed(0, "conv").abs().sum() == 0


def test_a_buffer_of_a_row_per_block_of_tokens_is_sized_and_grown_in_rows():
    specs = [{"blocks": StateSpec((2,), tokens_per_row=4)}]
    assert state_bytes(specs, 9, torch.float32) == 3 * 2 * 4                   # 9 tokens: 3 rows, the last partial
    growing = ModelState(specs, max_tokens=40, dtype=torch.float32, device=torch.device("cpu"), static=False,
                         initial_tokens=8)
    assert growing.buffers[0]["blocks"].shape == (2, 2)
    held = growing.append(0, "blocks", torch.arange(2, 5), 2, torch.ones(3, 2))   # rows 2..4: grows, at most 10 rows
    assert held.shape == (5, 2) and growing.buffers[0]["blocks"].shape[0] <= 10
    static = ModelState(specs, max_tokens=40, dtype=torch.float32, device=torch.device("cpu"), static=True)
    assert static.buffers[0]["blocks"].shape == (10, 2)


def test_static_state_writes_at_device_positions_and_returns_the_whole_buffer():
    state = ModelState([{"k": StateSpec((1,))}], max_tokens=8, dtype=torch.float32, device=torch.device("cpu"),
                       static=True)
    out = state.append(0, "k", torch.tensor([5]), None, torch.tensor([[7.0]]))
    assert out.shape == (8, 1) and out[5, 0] == 7 and out[:5].abs().sum() == 0      # zeros, never garbage


@pytest.mark.parametrize("family,unsorted", [("qwen2_moe", True), ("olmoe", True), ("deepseek_v3", True),
                                             ("olmoe", False)])
def test_decode_step_continues_what_prefill_computed(sluice_models, family, unsorted):
    """prefill(p + [t]) and prefill(p) then decode(t) must give the same logits: one definition of
    the model drives both paths, and the state written by prefill is the one decode reads."""
    eng = engine.load(sluice_models(family, "bf16"))
    prompt = [5, 17, 42, 99, 3, 250, 7]
    second_block = eng.runner.model.blocks[eng.spec.moe_layers[1]]
    if unsorted:                                          # a router that picks unsorted (and says so)
        route = second_block.route
        second_block.route = lambda h: tuple(t.flip(-1) for t in route(h))
        if hasattr(second_block.router, "best_first"):
            second_block.router.best_first = False
    try:
        with torch.inference_mode():
            whole = eng.runner.prefill(prompt).clone()
            eng.runner.prefill(prompt[:-1])
            stepped = eng.runner.decode(prompt[-1], len(prompt) - 1).clone()
            first, second = eng.spec.moe_layers[:2]
            routed_and_guessed = eng.runner.step.out[first].ids
            guess_weights, guess_ids = eng.runner.model.blocks[second].route(eng.runner.step.out[first].h)
    finally:
        eng.close()
    torch.testing.assert_close(stepped, whole, rtol=1e-4, atol=1e-4)
    # a MoE layer's ids: its top-k, then the next MoE layer's own router's guess on the same input, best
    # first (the prefetch reads ahead from disk for the better half only)
    top_k = eng.spec.top_k
    assert routed_and_guessed.numel() == 2 * top_k
    weight_of = dict(zip(guess_ids.flatten().tolist(), guess_weights.flatten().tolist()))
    guessed = routed_and_guessed[top_k:].tolist()
    assert set(guessed) == set(weight_of)
    assert [weight_of[e] for e in guessed] == sorted(weight_of.values(), reverse=True)


def test_the_snapshot_says_what_the_process_holds_besides_the_cache():
    t = Telemetry()
    t.set(ram_used_bytes=1 << 20)
    process = t.snapshot()["process"]
    assert process["rss_bytes"] > 50 << 20                           # this test process: torch is loaded
    assert process["non_cache_bytes"] == process["rss_bytes"] - (1 << 20)
    assert 0 < process["anon_bytes"] <= process["rss_bytes"]
    assert process["non_cache_anon_bytes"] == process["anon_bytes"] - (1 << 20)
    t.set(ram_held_bytes=3 << 20)                     # the cache's free slots and pinned chunk tails are its own
    process = t.snapshot()["process"]
    assert process["non_cache_anon_bytes"] == process["anon_bytes"] - (3 << 20)


def test_the_cache_holds_the_slots_it_wrote_and_its_pinned_chunks_whole():
    from engine.runtime.cache import CHUNK_SLOTS, RamCache
    t = Telemetry()
    cache = RamCache(40 * 4096, 4096, t)
    for expert in range(3):
        cache.insert((0, expert))
    cache.discard((0, 1))                                             # a failed read: its slot stays the cache's
    snap = t.snapshot()["ram_cache"]
    assert snap["used_bytes"] == 2 * 4096
    assert snap["held_bytes"] == 3 * 4096

    class Pinned(torch.Tensor):                                       # a chunk page-locked whole, as on CUDA
        def is_pinned(self):
            return True
    pinned = RamCache(40 * 4096, 4096, t, allocate=lambda n: torch.zeros(n, dtype=torch.uint8).as_subclass(Pinned))
    pinned.insert((0, 0))
    pinned._ahead.result()                                            # the next chunk, made ahead, counts too
    assert t.snapshot()["ram_cache"]["held_bytes"] == 2 * CHUNK_SLOTS * 4096
    assert t.snapshot()["vram"]["driver_bytes"] == 0                 # no GPU driver attached


def test_the_cache_makes_its_next_chunk_ahead_on_another_thread_and_never_past_its_budget():
    import threading

    from engine.runtime.cache import CHUNK_SLOTS, RamCache
    made = []

    def allocate(n):
        made.append((n // 4096, threading.current_thread().name))
        return torch.zeros(n, dtype=torch.uint8)
    cache = RamCache(40 * 4096, 4096, Telemetry(), allocate=allocate)     # 40 slots: chunks of 16, 16 and 8
    assert made == []                                                     # nothing until it grows
    for expert in range(40):
        cache.insert((0, expert))
        if cache._ahead is not None:
            cache._ahead.result()
    assert [count for count, _ in made] == [CHUNK_SLOTS, CHUNK_SLOTS, 40 - 2 * CHUNK_SLOTS]
    assert made[0][1] == threading.current_thread().name                # the first when it was needed
    assert {name for _, name in made[1:]} == {"sluice-ram-chunk"}         # the others ahead of need
    assert cache._ahead is None and not cache.has_free()


def test_a_chunk_that_cannot_be_made_ahead_fails_the_insert_that_needs_it():
    from engine.runtime.cache import CHUNK_SLOTS, RamCache
    calls = []

    def allocate(n):
        calls.append(n)
        if len(calls) > 1:
            raise MemoryError("cudaHostRegister of 65536 bytes failed (error 2)")
        return torch.zeros(n, dtype=torch.uint8)
    cache = RamCache(40 * 4096, 4096, Telemetry(), allocate=allocate)
    for expert in range(CHUNK_SLOTS):                                     # the first chunk fills
        cache.insert((0, expert))
    with pytest.raises(MemoryError, match="cudaHostRegister"):
        cache.insert((0, CHUNK_SLOTS))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's heap keeps freed blocks; others differ")
def test_free_heap_pages_go_back_to_the_system():
    """After loading, what transient buffers freed is handed back (room for the RAM cache under a cap)."""
    from engine.runtime.memory import process_memory, release_free_heap
    big = bytearray(8 << 20)
    del big                                                 # glibc's mmap threshold rises: 4 MiB blocks now use the heap
    blocks = [bytearray(4 << 20) for _ in range(64)]        # 256 MiB, touched
    last = blocks[-1]
    del blocks                                              # freed, but the heap's top is still in use: kept
    before = process_memory()[1]
    release_free_heap()
    assert before - process_memory()[1] > 128 << 20
    del last


def test_anonymous_memory_is_broken_down_by_mapping():
    """The bench says where the memory besides the cache sits: a shared anonymous map (what the RAM
    cache is made of) and a large tensor show up under their own names, with their sizes."""
    import mmap

    from engine.runtime.memory import anonymous_by_mapping, process_memory
    shared = mmap.mmap(-1, 96 << 20)
    shared.write(b"x" * (96 << 20))
    tensor = torch.ones(80 << 20, dtype=torch.uint8)
    where = dict(anonymous_by_mapping(top=20))
    assert where["large shared anonymous maps"] >= 96 << 20
    assert where["large private anonymous maps"] >= tensor.numel()
    assert sum(where.values()) <= process_memory()[1] * 1.05 + (8 << 20)   # parts of the anonymous total
    shared.close()


def test_without_growing_the_cache_has_room_only_where_no_allocation_would_wait():
    import threading

    from engine.runtime.cache import CHUNK_SLOTS, RamCache
    release = threading.Event()

    def allocate(n):
        if threading.current_thread().name == "sluice-ram-chunk":
            release.wait(10)                                  # the chunk made ahead takes its time
        return torch.zeros(n, dtype=torch.uint8)
    cache = RamCache(40 * 4096, 4096, Telemetry(), allocate=allocate)
    assert cache.has_free() and not cache.has_free(grow=False)          # nothing allocated yet
    for expert in range(CHUNK_SLOTS):
        cache.insert((0, expert))
        assert cache.has_free(grow=False) == (expert < CHUNK_SLOTS - 1)  # slots of the first chunk left
    assert cache.has_free()                                               # the budget has room ...
    release.set()
    cache._ahead.result()
    assert cache.has_free(grow=False)                                     # ... and the next chunk is ready
