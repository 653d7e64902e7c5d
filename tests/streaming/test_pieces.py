"""Small pure pieces of the runtime: speculation scoring, pinned buffers, cache tier moves."""
import pytest
import torch

from engine.runtime.cache import RamCache
from engine.runtime.pinned import pinned_buffer, pinned_bytes
from engine.runtime.speculation import score
from engine.runtime.telemetry import Telemetry


def test_score_is_recall_of_the_used_experts():
    assert score({1, 2, 3}, {2, 3, 4, 5}) == (2, 4)
    assert score(set(), {7}) == (0, 1)


def test_cache_demote_and_touch_order_evictions():
    cache = RamCache(3 * 4096, 4096, Telemetry())
    for key in [(0, 0), (0, 1), (0, 2)]:
        cache.insert(key)
    cache.demote((0, 2))                   # now also in VRAM: evict first
    cache.touch((0, 0))                    # a VRAM victim already in RAM: keep longest
    cache.insert((0, 3))
    assert (0, 2) not in cache and (0, 0) in cache and (0, 1) in cache
    cache.lock((0, 0)), cache.lock((0, 1)), cache.lock((0, 3))
    assert not cache.can_insert()


def test_ram_cache_keeps_its_chunks_alive_so_they_stay_pinned():
    """A pinned chunk is unregistered when its tensor is collected (views keep the memory, not the
    page-locking): the cache must hold the chunks it allocated, else every copy from it is pageable
    (the session-6 regression: fits-ram decode fell from 86 to 13 tok/s on the H200)."""
    import gc
    import weakref
    chunks = []

    def allocate(num_bytes):
        chunk = torch.zeros(num_bytes, dtype=torch.uint8)
        chunks.append(weakref.ref(chunk))
        return chunk
    cache = RamCache(40 * 4096, 4096, Telemetry(), allocate=allocate)
    with torch.inference_mode():      # as generation grows it: there views do not keep their base tensor
        for expert in range(40):
            cache.insert((0, expert))
    gc.collect()
    assert chunks and all(ref() is not None for ref in chunks)
    del cache
    gc.collect()
    assert all(ref() is None for ref in chunks)


@pytest.mark.gpu
def test_pinned_ram_cache_blocks_stay_pinned():
    from engine.runtime.cache import CHUNK_SLOTS
    before = pinned_bytes()
    cache = RamCache(2 * CHUNK_SLOTS * 4096, 4096, Telemetry(), allocate=pinned_buffer)
    with torch.inference_mode():
        for expert in range(CHUNK_SLOTS + 1):
            cache.insert((0, expert))
    import gc
    gc.collect()
    assert pinned_bytes() - before == 2 * CHUNK_SLOTS * 4096
    assert all(cache.block(slot).is_pinned() for slot in (0, CHUNK_SLOTS))


@pytest.mark.gpu
def test_pinned_buffer_pins_exactly_what_is_asked():
    before = pinned_bytes()
    buf = pinned_buffer(5 * 4096 + 4096)
    assert pinned_bytes() - before == 6 * 4096                 # no power-of-two rounding
    assert buf.data_ptr() % 4096 == 0 and buf.is_pinned()       # O_DIRECT-aligned and page-locked
    dev = torch.empty(buf.numel(), dtype=torch.uint8, device="cuda")
    buf.fill_(7)
    dev.copy_(buf, non_blocking=True)
    torch.cuda.synchronize()
    assert int(dev.sum()) == 7 * buf.numel()
    del buf
    import gc
    gc.collect()
    assert pinned_bytes() == before


def test_copies_finish_in_stream_order_so_the_scan_stops_at_the_first_unfinished():
    """Copies run in order on one copy stream: once one has not finished, no later one has (a later
    event that says it has is not asked, so its RAM block stays locked until the earlier ones land)."""
    from engine.runtime.movers import _finished_prefix

    class Event:
        def __init__(self, done):
            self.done, self.asked = done, 0

        def query(self):
            self.asked += 1
            return self.done

    events = [Event(True), Event(True), Event(False), Event(True)]
    assert _finished_prefix(events) == 2
    assert not events[3].asked
    assert _finished_prefix([]) == 0 and _finished_prefix(events[:2]) == 2
    batch, later = Event(True), Event(False)           # one done event for a batch's three copies
    assert _finished_prefix([batch, batch, batch, later]) == 3 and batch.asked == 1


def test_disk_active_time_counts_overlapping_reads_once(sluice_models):
    """Four reads at once on four reader threads: their summed time counts the overlap four times, the
    disk's active time (the union of their intervals) once, and never more than the wall time."""
    import time
    from engine.format.modeldir import open_model_dir
    from engine.runtime.cache import anonymous_buffer
    from engine.runtime.store import ExpertStore
    model = open_model_dir(sluice_models("qwen3_moe"))
    telemetry = Telemetry()
    store = ExpertStore(model, telemetry, num_threads=4)
    blocks = [anonymous_buffer(model.layout.block_bytes).numpy() for _ in range(8)]
    start = time.perf_counter()
    futures = [store.submit(0, e % model.spec.num_experts, blocks[e]) for e in range(8)]
    for f in futures:
        f.result()
    wall = time.perf_counter() - start
    store.close()
    disk = telemetry.snapshot()["disk"]
    assert disk["reads"] == 8
    assert 0 < disk["active_s"] <= wall
    assert disk["active_s"] <= disk["busy_s"] + 1e-9


@pytest.mark.parametrize("pieces", [1, 3, 4, 8])
def test_blocks_read_in_pieces_are_the_blocks(sluice_models, pieces):
    """Every block read as `pieces` parallel page-aligned reads lands whole (its CRC32 checked), byte for
    byte what a whole-block read gives."""
    from engine.format.modeldir import open_model_dir
    from engine.runtime.cache import anonymous_buffer
    from engine.runtime.store import ExpertStore, piece_ranges
    model = open_model_dir(sluice_models("qwen3_moe"))
    block = model.layout.block_bytes
    assert sum(n for _, n in piece_ranges(block, pieces)) == block
    assert all(start % 4096 == 0 for start, _ in piece_ranges(block, pieces))
    whole = ExpertStore(model, Telemetry(), pieces=1)
    split = ExpertStore(model, Telemetry(), pieces=pieces)
    keys = [(layer, e) for layer in model.spec.moe_layers for e in range(model.spec.num_experts)]
    expected, got = {}, {}
    for store, out in ((whole, expected), (split, got)):
        buffers = {key: anonymous_buffer(block).numpy() for key in keys}
        futures = [store.submit(*key, buffers[key]) for key in keys]
        for f in futures:
            f.result()
        out.update({key: bytes(buffers[key]) for key in keys})
        assert store.telemetry.snapshot()["disk"]["reads"] == len(keys)
        store.close()
    assert got == expected


def test_closing_the_store_with_reads_queued_leaves_no_read_waiting_forever(sluice_models):
    from engine.format.modeldir import open_model_dir
    from engine.runtime.cache import anonymous_buffer
    from engine.runtime.store import ExpertStore
    model = open_model_dir(sluice_models("qwen3_moe"))
    store = ExpertStore(model, Telemetry(), num_threads=1, pieces=4)
    futures = [store.submit(0, e % model.spec.num_experts, anonymous_buffer(model.layout.block_bytes).numpy())
               for e in range(32)]
    store.close()                       # cancels the pieces still queued: their blocks fail, none hangs
    assert all(f.done() for f in futures)
    failed = [f for f in futures if f.exception(timeout=0) is not None]
    assert failed and all(f.exception(timeout=0) is not None for f in futures[-len(failed):])


def test_cache_victim_is_the_least_used_of_its_least_recent_half():
    """Blocks in the newer half stay whatever their counts (a block read ahead has no use yet); of the older
    half, locked ones are skipped and the least used goes."""
    cache = RamCache(6 * 4096, 4096, Telemetry())
    uses = {"a": 5, "b": 1, "c": 3}                     # d, e, f: never used
    cache.uses = lambda key: uses.get(key[1], 0)
    for name in "abcdef":
        cache.insert((0, name))
    assert cache.window == 3
    cache.insert((0, "g"))
    assert (0, "b") not in cache and all((0, n) in cache for n in "acdefg")
    cache.lock((0, "a"))                                # the oldest, locked: the half is c, d, e
    cache.insert((0, "h"))
    assert (0, "d") not in cache and (0, "a") in cache and (0, "c") in cache
