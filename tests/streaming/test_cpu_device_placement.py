"""On the CPU device an int8 model's RAM-resident experts are computed where they sit (the slot path
would copy each block and decode a float copy of it first); the tokens stay the slot path's."""
import pytest
import torch

from engine.format.repack import repack
from engine.tools.demo import build_hf_model

from tests.streaming.sized import engine_with_slots, token_ids

PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 1, 300]

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU device's default; on a GPU the cost model decides")


@pytest.fixture(scope="module")
def olmoe_dirs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("olmoe")
    build_hf_model("olmoe", tmp / "hf", num_layers=3, with_tokenizer=False, seed=3)
    return {quant: repack(tmp / "hf", tmp / quant, quant=quant) for quant in ("int8", "bf16")}


def _run(path, **kw):
    eng = engine_with_slots(path, 3, 12, **kw)
    try:
        return token_ids(eng, PROMPT, 12), eng.telemetry()
    finally:
        eng.close()


def test_int8_experts_in_ram_are_computed_in_place_by_default(olmoe_dirs):
    tokens, snap = _run(olmoe_dirs["int8"])                      # the default: cpu_experts "auto"
    slot_tokens, slot_snap = _run(olmoe_dirs["int8"], cpu_experts="off")
    assert tokens == slot_tokens
    assert snap["cpu"]["experts"] > 0 and slot_snap["cpu"]["experts"] == 0
    assert snap["h2d"]["bytes"] < slot_snap["h2d"]["bytes"]      # fewer blocks copied into slots


def test_bf16_experts_still_take_slots(olmoe_dirs):
    _, snap = _run(olmoe_dirs["bf16"])
    assert snap["cpu"]["experts"] == 0


def test_the_slot_tier_keeps_the_fewest_slots_and_gives_the_rest_to_the_ram_cache():
    from engine.runtime.budget import in_place_defaults
    gib, mib = 2**30, 2**20
    vram, ram = in_place_defaults(4 * gib, 8 * gib, fixed_bytes=1 * gib, device_slot_bytes=30 * mib, top_k=8)
    assert vram == 1 * gib + 2 * 8 * 30 * mib and vram + ram == 12 * gib     # nothing lost
    assert in_place_defaults(1 * gib + 100 * mib, 8 * gib, fixed_bytes=1 * gib, device_slot_bytes=30 * mib,
                             top_k=8) == (1 * gib + 100 * mib, 8 * gib)


def test_the_default_plan_keeps_top_k_slots_a_bank_and_decodes_from_ram(olmoe_dirs):
    import engine
    eng = engine.load(olmoe_dirs["int8"], device="cpu", dtype="float32", max_context=64)
    try:
        assert eng.plan.slots_per_bank == eng.spec.top_k
        tokens = token_ids(eng, PROMPT, 12)
        snap = eng.telemetry()
    finally:
        eng.close()
    assert tokens == _run(olmoe_dirs["int8"], cpu_experts="off")[0]
    assert snap["cpu"]["experts"] > 0 and snap["h2d"]["bytes"] == 0          # nothing copied into a slot
