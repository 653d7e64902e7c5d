"""Token-exact with transformers while experts really stream (RAM cache and slots smaller than the experts)."""
import pytest

import engine
from engine import GenerationParams
from tests.conftest import FAMILIES
from tests.engine.reference import load_reference, reference_greedy
from tests.streaming.sized import streaming_budgets

PROMPT_IDS = [5, 17, 42, 99, 3, 250, 7, 63, 120, 11, 300, 8]
NEW_TOKENS = 32


# int8 on two families: its path through the engine is fp8's, only the stored bytes differ (test time)
CASES = [(family, quant) for quant in ("bf16", "fp8", "nvfp4", "mxfp4") for family in FAMILIES] \
    + [(family, "int8") for family in ("qwen3_moe", "mixtral")]


@pytest.mark.parametrize("family,quant", CASES)
def test_greedy_tokens_match_transformers(family, quant, hf_models, sluice_models):
    model_dir = sluice_models(family, quant)
    vram, ram = streaming_budgets(model_dir)
    eng = engine.load(model_dir, vram_budget=vram, ram_cache=ram)
    ours = [e.token_id for e in eng.generate(PROMPT_IDS, GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0))]
    theirs = reference_greedy(load_reference(hf_models(family), quant), PROMPT_IDS, NEW_TOKENS)
    assert ours == theirs

    tel = eng.telemetry()
    assert tel["ram_cache"]["capacity_bytes"] < eng.model.expert_bytes_total
    assert tel["ram_cache"]["misses"] > 0 and tel["ram_cache"]["evictions"] > 0 and tel["ram_cache"]["hits"] > 0
    assert tel["disk"]["bytes_read"] > eng.model.expert_bytes_total // 3
    assert tel["vram"]["peak_bytes"] <= tel["vram"]["budget_bytes"] == vram
    eng.close()
