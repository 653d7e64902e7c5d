"""DeepSeek-V3.2 and GLM-5 natively (DeepSeek-style blocks, MLA over a lightning indexer's selection:
engine.model.dsa): token-exact with transformers while experts stream, with an index_topk of 6 under a 36-token
context, so the prompt and every decode step attend sparsely (engine.tools.demo.FAMILY_KWARGS: YaRN on V3.2, a GLM-5
layer reusing the previous indexer's selection); int8 experts and dense weights; V3.2's release layout (block-FP8,
an MTP layer) repacked; the estimate counting the indexers and their keys."""
import dataclasses
import json

import pytest
import torch
from safetensors import safe_open

import engine
from engine.format.repack import repack
from engine.model.families import FAMILIES, GENERIC_FAMILIES, family_module
from engine.model.spec import read_spec
from engine.model.state import state_bytes
from tests.engine.reference import load_reference, reference_greedy
from tests.families.tokens import NEW_TOKENS, PROMPT_IDS, assert_streamed_tokens_match
from tests.streaming.sized import engine_with_slots, token_ids

DSA = ["deepseek_v32", "glm_moe_dsa"]


def test_they_run_natively():
    assert all(FAMILIES[f].path == "native" and f not in GENERIC_FAMILIES for f in DSA)


@pytest.mark.parametrize("quant", ["bf16", "int8"])
@pytest.mark.parametrize("family", DSA)
def test_greedy_tokens_match_transformers_while_experts_stream(family, quant, hf_models, sluice_models):
    assert_streamed_tokens_match(hf_models(family), sluice_models(family, quant), quant)


def test_the_indexers_selection_decides_the_tokens(hf_models, sluice_models, monkeypatch):
    """With every key selected the answer differs: the tests above depend on the sparse selection being right."""
    from engine.model import dsa
    every_key = dsa.IndexerShape.from_config
    monkeypatch.setattr(dsa.IndexerShape, "from_config",
                        classmethod(lambda cls, cfg: dataclasses.replace(every_key(cfg), top_k=10 ** 6)))
    eng = engine.load(sluice_models("deepseek_v32", "bf16"))
    try:
        dense = token_ids(eng, PROMPT_IDS, NEW_TOKENS)
    finally:
        eng.close()
    assert dense != reference_greedy(load_reference(hf_models("deepseek_v32")), PROMPT_IDS, NEW_TOKENS)


def test_int8_dense_weights_give_transformers_tokens_with_the_same_weights(hf_models, tmp_path):
    """MLA's projections (kv_b_proj aside), the dense MLP, shared experts, embedding and head as int8; the indexers
    and routers exact."""
    from engine.model.dense_quant import quantized_names
    hf_dir = hf_models("glm_moe_dsa")
    model_dir = repack(hf_dir, tmp_path / "sluice", quant="int8")
    with safe_open(str(model_dir / "dense.safetensors"), "pt") as f:
        stored = quantized_names("glm_moe_dsa", f.keys())
    assert not [n for n in stored if ".indexer." in n] and len(stored) == 2 + 3 * 4 + 3 + 2 * 3
    expected = reference_greedy(load_reference(hf_dir, "int8", dense_quant="int8"), PROMPT_IDS, NEW_TOKENS)
    eng = engine_with_slots(model_dir, slots_per_bank=3, ram_blocks=4, dense_quant="int8")
    try:
        assert token_ids(eng, PROMPT_IDS, NEW_TOKENS) == expected
    finally:
        eng.close()


def test_v32_release_layout_repacks_without_mtp_and_matches_transformers(hf_models, tmp_path):
    from tests.families.test_deepseek_checkpoints import PROMPT, dequantized_copy, write_v3_release_like
    src = write_v3_release_like(hf_models("deepseek_v32"), tmp_path / "fp8")
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        assert "model.layers.1.self_attn.indexer.wk.weight_scale_inv" in f.keys()
    out = repack(src, tmp_path / "out")
    with safe_open(str(out / "dense.safetensors"), "pt") as f:
        assert not [n for n in f.keys() if n.startswith("model.layers.3.")]
    eng = engine.load(out)
    try:
        ours = token_ids(eng, PROMPT, NEW_TOKENS)
    finally:
        eng.close()
    assert ours == reference_greedy(load_reference(dequantized_copy(src, tmp_path / "dequantized")), PROMPT, NEW_TOKENS)


@pytest.mark.parametrize("family", DSA)
def test_the_estimate_counts_the_indexers_and_their_keys(family, hf_models):
    from transformers import AutoModelForCausalLM

    from engine.plan.estimate import model_shape
    hf_dir = hf_models(family)
    config = json.loads((hf_dir / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir))
    biases = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    assert model_shape(config).total_params == model.num_parameters() + biases
    spec = read_spec(config)
    indexers = 3 if family == "deepseek_v32" else 2                  # GLM-5's shared layer keeps no indexer keys
    per_token = state_bytes(family_module(family).state_specs(spec), 1, torch.bfloat16)
    assert per_token == (3 * (32 + 8) + indexers * 16) * 2
    eng = engine.load(repack(hf_dir, hf_dir.parent / f"{family}-estimate"))
    try:
        assert state_bytes(eng.runner.model.state_specs(), 1, torch.bfloat16) == per_token
    finally:
        eng.close()
