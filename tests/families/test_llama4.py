"""Llama 4 (llama4_text, and a llama4 checkpoint's language model) natively: token-exact with transformers while
experts stream (24 tokens after a 12-token prompt, so chunked attention crosses its 8-position chunks), with RoPE
and NoPE layers, the L2 QK norm, experts fed inputs scaled by their sigmoid scores (top-2 and top-1), a shared
expert, dense MLP layers between MoE layers and the NoPE layers' attention temperature."""
import json

import pytest
from safetensors import safe_open

import engine
from engine import GenerationParams
from engine.format.repack import repack
from engine.model.families import FAMILIES, GENERIC_FAMILIES
from tests.families.generic_models import build_generic_model, build_vl_model, built_once, vl_reference_greedy
from tests.families.tokens import NEW_TOKENS, PROMPT_IDS, assert_streamed_tokens_match
from tests.streaming.sized import streaming_budgets

# top-1 as Llama 4 ships; MoE every second layer (dense MLPs between); a floor_scale small enough that the NoPE
# layers' temperature changes within the test's positions
VARIANTS = {
    "top2": {},
    "top1_interleaved": dict(num_experts_per_tok=1, interleave_moe_layer_step=2, num_layers=4,
                             no_rope_layers=[1, 1, 0, 1], floor_scale=4, attn_scale=0.5),
}


@pytest.fixture(scope="module")
def llama4_models(tmp_path_factory):
    return built_once(tmp_path_factory.mktemp("llama4"),
                      lambda variant, dst: build_generic_model("llama4_text", dst, **VARIANTS[variant]))


def test_llama4_runs_natively():
    assert FAMILIES["llama4_text"].path == FAMILIES["llama4"].path == "native"
    assert "llama4_text" not in GENERIC_FAMILIES


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_tokens_match_transformers_while_experts_stream(variant, llama4_models):
    hf_dir, model_dir = llama4_models(variant)
    assert_streamed_tokens_match(hf_dir, model_dir, "bf16")


@pytest.mark.parametrize("variant", VARIANTS)
def test_int8_experts_match_transformers_on_the_same_rounded_weights(variant, llama4_models, tmp_path):
    hf_dir, _ = llama4_models(variant)
    assert_streamed_tokens_match(hf_dir, repack(hf_dir, tmp_path / "sluice", quant="int8"), "int8")


def test_int8_dense_weights_give_transformers_tokens_with_the_same_weights(llama4_models, tmp_path):
    """Attention (q/k rows de-interleaved after quantising: each row keeps its scale), dense MLPs, shared experts,
    the embedding and the head as int8; the routers exact."""
    from engine.model.dense_quant import quantized_names
    from tests.families.tokens import int8_dense_tokens
    hf_dir, _ = llama4_models("top1_interleaved")
    model_dir = repack(hf_dir, tmp_path / "sluice", quant="int8")
    ours, theirs, reference = int8_dense_tokens(hf_dir, model_dir)
    with safe_open(str(model_dir / "dense.safetensors"), "pt") as f:
        stored = quantized_names("llama4_text", f.keys())
    rounded = quantized_names("llama4_text", dict(reference.named_parameters()))
    assert len(stored) == len(rounded) == 2 + 4 * 4 + 2 * 3 * 2      # embedding, head, attention, MLPs, shared experts
    assert ours == theirs


def test_the_native_model_is_built_from_sluices_blocks(llama4_models):
    from engine.model.families.llama4 import Llama4Block
    _, model_dir = llama4_models("top1_interleaved")
    eng = engine.load(model_dir)
    try:
        blocks = eng.runner.model.blocks
        assert all(isinstance(b, Llama4Block) for b in blocks) and [b.is_moe for b in blocks] == [False, True] * 2
    finally:
        eng.close()


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_estimate_counts_parameters_as_transformers_does(variant, llama4_models):
    from transformers import AutoModelForCausalLM

    from engine.plan.estimate import model_shape
    hf_dir, _ = llama4_models(variant)
    shape = model_shape(json.loads((hf_dir / "config.json").read_text()))
    assert shape.total_params == AutoModelForCausalLM.from_pretrained(str(hf_dir)).num_parameters()
    assert (shape.num_experts, shape.top_k) == (8, 2 if variant == "top2" else 1)


def test_a_llama4_checkpoints_language_model_runs_token_exact(tmp_path):
    """A vision-language llama4 checkpoint (`language_model.model.`, `language_model.lm_head`): its vision tower is
    neither repacked nor loaded."""
    hf_dir, model_dir = built_once(tmp_path, build_vl_model)("llama4")
    with safe_open(str(model_dir / "dense.safetensors"), "pt") as f:
        assert all(n.startswith(("model.layers.", "model.embed_tokens.", "model.norm.", "lm_head.")) for n in f.keys())
    vram, ram = streaming_budgets(model_dir)
    eng = engine.load(model_dir, vram_budget=vram, ram_cache=ram)
    try:
        params = GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0)
        ours = [e.token_id for e in eng.generate(PROMPT_IDS, params)]
        evictions = eng.telemetry()["ram_cache"]["evictions"]
    finally:
        eng.close()
    assert ours == vl_reference_greedy(hf_dir, PROMPT_IDS, NEW_TOKENS) and evictions > 0


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["bf16", "int8"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_cuda_float32_tokens_match_transformers(variant, quant, tmp_path):
    hf_dir = build_generic_model("llama4_text", tmp_path / "hf", **VARIANTS[variant])
    assert_streamed_tokens_match(hf_dir, repack(hf_dir, tmp_path / "sluice", quant=quant), quant, device="cuda",
                                 dtype="float32")


def test_a_chunk_sees_only_its_own_earlier_positions():
    """Chunked attention (chunk 4): position 5 sees 4 and 5, not 3 (the previous chunk) nor 6 (the future)."""
    import torch

    from kernels.attention_ref import visible_keys
    visible = visible_keys(torch.tensor([3, 4, 5]), 7, chunk=4)
    assert visible.tolist() == [[True] * 4 + [False] * 3,
                                [False] * 4 + [True] + [False] * 2,
                                [False] * 4 + [True, True, False]]


def test_decode_guesses_the_next_layers_experts_from_its_router(llama4_models):
    from tests.streaming.sized import streaming_engine, token_ids
    _, model_dir = llama4_models("top2")
    eng = streaming_engine(model_dir, dtype="float32")
    try:
        token_ids(eng, PROMPT_IDS, 12)
        speculation = eng.telemetry()["speculation"]
    finally:
        eng.close()
    assert speculation["predicted"] > 0 and speculation["correct"] > 0
