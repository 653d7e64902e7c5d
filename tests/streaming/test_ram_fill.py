"""RAM filled in the background (Experts.fill, Engine._fill_while_idle): blocks no prompt has read yet go into free
RAM slots while the engine is idle and between decode steps, never evicting one, never changing an answer, and
never in the way of a generation or of closing."""
import time

import pytest

import engine.engine as engine_module
from engine.format.modeldir import open_model_dir
from engine.options import Options
from engine.runtime import store as store_module
from tests.streaming.sized import engine_with_slots, token_ids

PROMPT = [5, 17, 42, 7]


@pytest.fixture(autouse=True)
def _filling(monkeypatch):
    monkeypatch.setattr(engine_module, "FILL_IDLE_S", 0.05)


def _all_keys(eng):
    return [(layer, e) for layer in eng.spec.moe_layers for e in range(eng.spec.num_experts)]


def _finished_filling(eng, timeout=30.0):
    eng._filler.join(timeout)
    assert not eng._filler.is_alive()


def _disk_bytes(eng) -> int:
    return eng.telemetry()["disk"]["bytes_read"]


def _fill_reads(eng) -> int:
    return eng.telemetry()["ram_cache"]["fill_reads"]


def _until_filling(eng, timeout=10.0):
    deadline = time.monotonic() + timeout
    while _fill_reads(eng) == 0 and time.monotonic() < deadline:
        time.sleep(0.005)


def _slow_reads(monkeypatch, seconds=0.01):
    real = store_module.ExpertStore.read_into

    def slow(self, layer, expert, buf):
        time.sleep(seconds)
        real(self, layer, expert, buf)
    monkeypatch.setattr(store_module.ExpertStore, "read_into", slow)


def _answer_without_filling(path, monkeypatch) -> list[int]:
    plain = engine_with_slots(path, slots_per_bank=3, ram_blocks=64, options=Options(ram_fill=False))
    try:
        assert plain._filler is None and not plain.runner.fills
        return token_ids(plain, PROMPT, 6)
    finally:
        plain.close()


def test_an_idle_engine_reads_the_whole_model_into_ram_and_its_prompt_then_reads_nothing(sluice_models, monkeypatch):
    path = sluice_models("qwen3_moe")
    expected = _answer_without_filling(path, monkeypatch)
    spec = open_model_dir(path).spec
    eng = engine_with_slots(path, slots_per_bank=3, ram_blocks=len(spec.moe_layers) * spec.num_experts)
    try:
        _finished_filling(eng)
        eng.runner.experts.synchronize()                  # the last fill reads have landed
        cache = eng.runner.cache
        assert all(key in cache for key in _all_keys(eng))
        before = _disk_bytes(eng)
        assert token_ids(eng, PROMPT, 6) == expected      # the same answer, and not a byte from the disk for it
        assert _disk_bytes(eng) == before
    finally:
        eng.close()


def test_a_ram_cache_smaller_than_the_model_is_filled_without_evicting_and_the_filler_ends(sluice_models):
    eng = engine_with_slots(sluice_models("qwen3_moe"), slots_per_bank=3, ram_blocks=10)
    try:
        _finished_filling(eng)
        eng.runner.experts.synchronize()
        ram = eng.telemetry()["ram_cache"]
        assert ram["used_bytes"] == ram["capacity_bytes"] and ram["fill_reads"] == 10
        assert ram["evictions"] == 0
    finally:
        eng.close()


def test_a_decode_fills_free_ram_between_its_steps(sluice_models, monkeypatch):
    monkeypatch.setattr(engine_module, "FILL_IDLE_S", 1e9)             # the idle filler never starts
    eng = engine_with_slots(sluice_models("qwen3_moe"), slots_per_bank=3, ram_blocks=48)
    try:
        assert _fill_reads(eng) == 0
        token_ids(eng, PROMPT, 8)
        assert _fill_reads(eng) > 0
    finally:
        eng.close()


def test_a_generation_that_starts_while_ram_fills_is_not_refused_and_answers_the_same(sluice_models, monkeypatch):
    path = sluice_models("qwen3_moe")
    expected = _answer_without_filling(path, monkeypatch)
    _slow_reads(monkeypatch)
    eng = engine_with_slots(path, slots_per_bank=3, ram_blocks=64)
    try:
        _until_filling(eng)
        assert _fill_reads(eng) > 0 and eng._filler.is_alive()   # filling now
        assert token_ids(eng, PROMPT, 6) == expected
    finally:
        eng.close()


def test_closing_stops_the_filler_at_once(sluice_models, monkeypatch):
    _slow_reads(monkeypatch, seconds=0.05)
    eng = engine_with_slots(sluice_models("qwen3_moe"), slots_per_bank=3, ram_blocks=64)
    _until_filling(eng)
    start = time.monotonic()
    eng.close()
    assert time.monotonic() - start < 2.0
    assert not eng._filler.is_alive()


def test_a_corrupted_block_the_filler_meets_first_still_stops_the_prompt_that_needs_it_with_one_sentence(
        sluice_models, tmp_path):
    import json
    import shutil

    import engine
    from engine import GenerationParams
    from engine.errors import SluiceError
    model = shutil.copytree(sluice_models("qwen3_moe"), tmp_path / "m")
    layers = json.loads((model / "sluice.json").read_text())["experts"]["layers"]
    with open(model / "experts.bin", "r+b") as f:            # one byte of expert 5 of layer 1
        f.seek(layers["1"]["offset"] + 5 * layers["1"]["block_bytes"] + 100)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    eng = engine.load(model, device="cpu", dtype="float32", max_context=160)
    try:
        _finished_filling(eng)                               # it met the block, dropped it and ended quietly
        assert (1, 4) in eng.runner.cache and (1, 5) not in eng.runner.cache
        with pytest.raises(SluiceError, match="Expert 5 of layer 1 is corrupted"):
            list(eng.generate(list(range(1, 120)), GenerationParams(max_new_tokens=2)))
    finally:
        eng.close()
