"""Exclusive RAM/VRAM tiers: with RAM holding what VRAM does not (VRAM victims written back, RAM
copies of resident experts evicted first), the two caches add up and fewer blocks come from disk."""
import random

import pytest
import torch

from engine.options import Options
from engine.tools import presets

from tests.streaming.sized import engine_with_slots, token_ids

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TINY = dict(model_type="olmoe", vocab_size=300, hidden_size=64, intermediate_size=32, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=4, num_experts=16, num_experts_per_tok=4,
            max_position_embeddings=512, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    presets.PRESETS["tiny-olmoe-tiers"] = TINY
    try:
        return presets.write_sluice_dir("tiny-olmoe-tiers", tmp_path_factory.mktemp("tiers") / "m", "fp8",
                                        device="cpu", progress=lambda msg: None)
    finally:
        del presets.PRESETS["tiny-olmoe-tiers"]


def _decode(path, ram_blocks: int) -> tuple[list[int], dict, set, set]:
    """A sampled decode (varied routing) -> (its tokens, telemetry, the blocks RAM holds, those VRAM holds)."""
    eng = engine_with_slots(path, 6, ram_blocks, max_context=96, options=Options(ram_fill=False))
    rng = random.Random(0)
    prompt = [rng.randrange(300) for _ in range(16)]
    try:
        token_ids(eng, prompt, 1)
        tokens = token_ids(eng, prompt, 60, temperature=1.0, seed=0)
        ram = set(eng.runner.cache._entries) - eng.runner.cache._demoted
        vram = {key for layer in eng.spec.moe_layers for key in ((layer, e) for e in range(eng.spec.num_experts))
                if eng.runner.banks.holds(key)}
        return tokens, eng.telemetry(), ram, vram
    finally:
        eng.close()


def test_the_tiers_add_up_and_compute_the_same(model_dir):
    """6 slots a bank (12 of 64 blocks in VRAM) and 12 blocks of RAM: RAM keeps what VRAM does not (a block
    copied up is demoted, a VRAM victim written back), so the tiers hold more distinct blocks than either."""
    tokens, snap, ram, vram = _decode(model_dir, ram_blocks=12)
    assert snap["d2h"]["bytes"] > 0                           # victims went back to RAM
    assert not ram & vram                                         # RAM's live blocks are the ones VRAM lacks
    assert len(ram | vram) > 12 + 6, (len(ram), len(vram))
    everything, _, _, _ = _decode(model_dir, ram_blocks=64)       # RAM holds the whole model: nothing evicted
    assert tokens == everything                                   # the policy moves bytes, never changes math
