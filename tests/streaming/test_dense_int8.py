"""int8 dense weights (engine.model.dense_quant): the engine gives transformers' tokens when both hold
the same dequantised dense weights, with experts streaming, on whatever device there is (a GPU runs
the int8 linear kernel inside the CUDA graphs), and the VRAM they free goes to expert slots."""
import pytest
import torch
from safetensors import safe_open

import engine
from engine import SluiceError
from engine.format.repack import repack
from engine.model.dense_quant import planned_bytes, quantized_names
from engine.model.families import family_module
from engine.format.file_table import FileTable
from engine.model.layers import Packed
from engine.tools.demo import build_hf_model
from kernels import cpu_gemv
from tests.engine.reference import load_reference, reference_greedy
from tests.families.dsv4_checkpoint import CSA, HCA, SLIDING, build_dsv4
from tests.families.hybrid_models import build_hybrid
from tests.streaming.sized import DEVICE, engine_with_slots, token_ids

PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 1, 300]
NEW_TOKENS = 16


FAMILIES = ["qwen3_moe", "mixtral", "olmoe", "qwen2_moe", "deepseek_v3", "deepseek_v2", "glm4_moe", "minimax_m2",
            "glm4_moe_lite", "qwen3_next", "qwen3_5_moe", "gpt_oss", "deepseek_v4"]
DSV4_LAYERS = [SLIDING, CSA, HCA]        # one of each attention kind, the first hash-routed


@pytest.fixture(scope="module", params=FAMILIES)
def int8_model(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param in ("qwen3_next", "qwen3_5_moe"):     # fused DeltaNet projections; a vision tower
        build_hybrid(request.param, tmp / "hf", seed=3)
    elif request.param == "deepseek_v4":
        build_dsv4(tmp / "hf", seed=3, with_tokenizer=False, num_hidden_layers=3, layer_types=DSV4_LAYERS,
                   mlp_layer_types=["hash_moe", "moe", "moe"])
    else:
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
    family = eng.spec.family
    assert eng.info["dense_quant"] == "int8"
    assert weights.lm_head.parts["w"].dtype == torch.int8
    table = weights.embed_tokens        # read from the file row by row (quantised as read) unless the family embeds itself
    assert table.quant == "int8" if isinstance(table, FileTable) else table.parts["w"].dtype == torch.int8
    if family in ("qwen3_next", "qwen3_5_moe"):      # the DeltaNet's largest projection (Qwen3-Next: split at build)
        assert isinstance(weights.blocks[0].mixer.in_qkv, Packed)
    assert snap["disk"]["reads"] > 0 and snap["vram"]["peak_bytes"] <= snap["vram"]["budget_bytes"]
    if DEVICE == "cuda":          # the kernel passed its check and runs in the graphs (where the family has them)
        assert weights.lm_head.kernel is not None and eng.runner.step.use_graphs == weights.graph_safe
    else:                         # the CPU's int8 kernel passed its check: the prompt's and the steps' tokens are its
        assert weights.lm_head.kernel.func is cpu_gemv.int8_linear
    reference = load_reference(int8_model / "hf", "int8", dense_quant="int8")
    with safe_open(str(int8_model / "sluice" / "dense.safetensors"), "pt") as f:
        stored = list(f.keys())
    # the reference rounded the very tensors the engine did (Qwen3.5's text model names them as the Sluice dir)
    assert quantized_names(family, stored) == quantized_names(family, dict(reference.named_parameters()))
    assert ours == reference_greedy(reference, PROMPT, NEW_TOKENS)


def test_int8_dense_weights_leave_more_of_a_vram_budget_to_slots(int8_model):
    plans = {}
    for dense_quant in (None, "int8"):
        eng = engine.load(int8_model / "sluice", device="cpu", vram_budget="1MB", max_context=64,
                          dense_quant=dense_quant)
        plans[dense_quant] = eng.plan
        eng.close()
    bf16, int8 = plans[None], plans["int8"]
    # float32 compute on the CPU: the quantised weights take ~1/4 (codes) plus their row scales; what
    # stays (DeepSeek-V4's compressors, indexer and mHC mixers: a larger share of so small a model) keeps the rest
    assert int8.dense_bytes < bf16.dense_bytes * (0.5 if eng.spec.family == "deepseek_v4" else 0.4)
    # the planner, asked before loading (the default context), expects the bytes loading saved
    planned = {q: planned_bytes(eng.model.dense_shapes, torch.float32, eng.spec.family, q, eng.model.dense_dtypes)
               for q in (None, "int8")}
    assert bf16.dense_bytes - int8.dense_bytes == planned[None] - planned["int8"]
    assert (planned[None], planned["int8"]) == (bf16.dense_bytes, int8.dense_bytes)     # integer tables too
    assert int8.slots_per_bank > bf16.slots_per_bank


def test_unknown_or_unavailable_dense_format_is_one_clear_sentence(sluice_models, monkeypatch):
    model_dir = sluice_models("qwen3_moe")
    with pytest.raises(SluiceError, match="Unknown dense weight format 'int4': choose int8"):
        engine.load(model_dir, dense_quant="int4")
    # every family names its int8 weights today; one added without a DENSE_INT8 pattern refuses
    monkeypatch.delattr(family_module("qwen3_moe"), "DENSE_INT8")
    with pytest.raises(SluiceError, match="int8 dense weights are not available for qwen3_moe models yet"):
        engine.load(model_dir, dense_quant="int8")


@pytest.mark.gpu
def test_attached_kernels_give_transformers_tokens(int8_model):
    """The kernels attached at load (engine/runtime/attach.py): the softmax top-k routers, the int8 prompt GEMM,
    the norms, the rotary and one token's attention through Triton instead of F.linear / softmax / topk and the
    reference's dequantised GEMM: transformers' tokens all the same."""
    from engine.runtime.attach import attached_kernels
    prompt = PROMPT * 2                                   # 20 tokens: past the decode kernel's 8, the GEMM's
    eng = engine_with_slots(int8_model / "sluice", slots_per_bank=3, ram_blocks=4, dense_quant="int8")
    try:
        ours = token_ids(eng, prompt, NEW_TOKENS)
        attached = attached_kernels(eng.runner.model)
    finally:
        eng.close()
    assert attached.get("Packed.kernel")                  # every family has int8 projections
    if eng.spec.family in ROUTER_FAMILIES:
        assert attached.get("Router.kernel")
    if eng.spec.family == "olmoe":                        # plain norms and attention
        assert {"RmsNorm.kernel", "Attention.rope_kernel", "Attention.attention_kernel"} <= set(attached)
    reference = load_reference(int8_model / "hf", "int8", dense_quant="int8")
    assert ours == reference_greedy(reference, prompt, NEW_TOKENS)


ROUTER_FAMILIES = ("qwen3_moe", "mixtral", "olmoe", "qwen2_moe", "qwen3_next", "qwen3_5_moe")
