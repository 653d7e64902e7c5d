"""Greedy tokens through the user's path (engine.load(...).generate) with experts really streaming,
compared with transformers on the same (dequantised) weights."""
import engine
from engine import GenerationParams
from tests.engine.reference import load_reference, reference_greedy
from tests.streaming.sized import streaming_budgets

PROMPT_IDS = [5, 17, 42, 99, 3, 250, 7, 63, 120, 11, 300, 8]
NEW_TOKENS = 24


def assert_streamed_tokens_match(hf_dir, model_dir, quant: str, **load) -> None:
    """load: engine.load options (device, dtype); the budgets force streaming on the CPU's plan."""
    vram, ram = streaming_budgets(model_dir)
    eng = engine.load(model_dir, vram_budget=None if load else vram, ram_cache=ram, **load)
    try:
        ours = [e.token_id for e in eng.generate(PROMPT_IDS, GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0))]
        tel = eng.telemetry()
    finally:
        eng.close()
    theirs = reference_greedy(load_reference(hf_dir, quant), PROMPT_IDS, NEW_TOKENS)
    assert ours == theirs, f"Sluice {ours}\ntransformers {theirs}"
    assert tel["ram_cache"]["capacity_bytes"] < eng.model.expert_bytes_total
    assert tel["ram_cache"]["evictions"] > 0 and tel["disk"]["bytes_read"] > eng.model.expert_bytes_total // 3


def int8_dense_tokens(hf_dir, model_dir):
    """Greedy tokens with int8 dense weights (experts streaming) and the transformers reference holding the same
    rounded dense weights -> (ours, theirs, the reference model)."""
    from tests.streaming.sized import engine_with_slots, token_ids
    eng = engine_with_slots(model_dir, slots_per_bank=2, ram_blocks=3, dense_quant="int8")
    try:
        ours = token_ids(eng, PROMPT_IDS, NEW_TOKENS)
        assert eng.info["dense_quant"] == "int8"
    finally:
        eng.close()
    reference = load_reference(hf_dir, "int8", dense_quant="int8")
    return ours, reference_greedy(reference, PROMPT_IDS, NEW_TOKENS), reference
