"""Each model's context is its own (max_position_embeddings), cut to what the VRAM budget holds."""
import pytest

import engine
from engine import SluiceError


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory):
    from engine.format.repack import repack
    from engine.tools.demo import build_hf_model
    root = tmp_path_factory.mktemp("long-context")
    snapshot = build_hf_model("qwen3_moe", root / "hf", num_layers=2, max_position_embeddings=16384)
    return repack(snapshot, root / "sluice")


def test_default_context_is_the_model_limit_when_the_budget_holds_it(long_context_model):
    eng = engine.load(long_context_model, vram_budget="64MB", ram_cache="8MB")
    try:
        assert eng.info["max_context"] == eng.info["model_max_context"] == 16384     # no 8192 cap
    finally:
        eng.close()


def test_default_context_shrinks_to_what_the_vram_budget_holds(long_context_model):
    eng = engine.load(long_context_model, vram_budget="3MB", ram_cache="8MB")
    try:
        info = eng.info
        assert 512 <= info["max_context"] < 16384
        kv_bytes = eng.plan.kv_bytes
        assert kv_bytes <= (info["vram_budget_bytes"] - eng.plan.dense_bytes) / 2    # experts keep the rest
        assert info["slots_per_bank"] >= info["top_k"]
    finally:
        eng.close()


def test_a_chosen_context_is_used_and_one_past_the_model_limit_is_one_sentence(long_context_model):
    eng = engine.load(long_context_model, vram_budget="64MB", ram_cache="8MB", max_context=1000)
    try:
        assert eng.info["max_context"] == 1000
        events = list(eng.generate([1] * 990, engine.GenerationParams(max_new_tokens=10, temperature=0)))
        assert events[-1].finished
    finally:
        eng.close()
    with pytest.raises(SluiceError, match="between 1 and 16384 tokens"):
        engine.load(long_context_model, max_context=20000)
