"""int8 dense weights (engine.model.dense_quant): the engine gives transformers' tokens when both hold
the same dequantised dense weights, with experts streaming, on whatever device there is (a GPU runs
the int8 linear kernel inside the CUDA graphs), and the VRAM they free goes to expert slots."""
import pytest
import torch

import engine
from engine import SluiceError
from engine.format.repack import repack
from engine.tools.demo import build_hf_model
from tests.engine.reference import load_reference, reference_greedy
from tests.streaming.sized import DEVICE, engine_with_slots, token_ids

PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 1, 300]
NEW_TOKENS = 16


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral", "olmoe", "qwen2_moe", "deepseek_v3", "deepseek_v2",
                                        "glm4_moe", "minimax_m2"])
def int8_model(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    build_hf_model(request.param, tmp / "hf", num_layers=3, with_tokenizer=False, seed=3)
    repack(tmp / "hf", tmp / "sluice", quant="int8")
    return tmp


def test_int8_dense_weights_give_transformers_tokens_with_the_same_weights(int8_model):
    eng = engine_with_slots(int8_model / "sluice", slots_per_bank=3, ram_blocks=4, dense_quant="int8")
    try:
        ours = token_ids(eng, PROMPT, NEW_TOKENS)
        weights = eng.runner.model
        snap = eng.telemetry()
    finally:
        eng.close()
    assert eng.info["dense_quant"] == "int8"
    assert weights.lm_head.parts["w"].dtype == torch.int8 and weights.embed_tokens.parts["w"].dtype == torch.int8
    assert snap["disk"]["reads"] > 0 and snap["vram"]["peak_bytes"] <= snap["vram"]["budget_bytes"]
    if DEVICE == "cuda":                     # the kernel passed its check and runs in the graphs
        assert weights.lm_head.kernel is not None and eng.runner.step.use_graphs
    reference = load_reference(int8_model / "hf", "int8", dense_quant="int8")
    assert ours == reference_greedy(reference, PROMPT, NEW_TOKENS)


def test_int8_dense_weights_leave_more_of_a_vram_budget_to_slots(int8_model):
    plans = {}
    for dense_quant in (None, "int8"):
        eng = engine.load(int8_model / "sluice", device="cpu", vram_budget="1MB", max_context=64,
                          dense_quant=dense_quant)
        plans[dense_quant] = eng.plan
        eng.close()
    bf16, int8 = plans[None], plans["int8"]
    # float32 compute on the CPU: the quantised weights take ~1/4 (codes) plus their row scales
    assert int8.dense_bytes < bf16.dense_bytes * 0.4
    assert int8.slots_per_bank > bf16.slots_per_bank


def test_unknown_or_unavailable_dense_format_is_one_clear_sentence(int8_model, tmp_path):
    with pytest.raises(SluiceError, match="Unknown dense weight format 'int4': choose int8"):
        engine.load(int8_model / "sluice", dense_quant="int4")
    build_hf_model("gpt_oss", tmp_path / "hf", num_layers=2, with_tokenizer=False, seed=3)
    repack(tmp_path / "hf", tmp_path / "sluice", quant="bf16")
    with pytest.raises(SluiceError, match="int8 dense weights are not available for gpt_oss models yet"):
        engine.load(tmp_path / "sluice", dense_quant="int8")
