"""Fit and speed estimate: parameter counts against transformers, bytes per token, roofline, verdicts."""
from __future__ import annotations

import json

import pytest

from engine import SluiceError
from engine.plan.estimate import (FAST_TOK_S, LAYER_OVERHEAD_S, Machine, estimate, estimate_model_dir, expert_block_bytes,
                             model_shape)
from engine.format.layout import block_layout

GB = 10**9
QWEN3_30B_A3B = dict(model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                     num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                     moe_intermediate_size=768, intermediate_size=6144, vocab_size=151936, tie_word_embeddings=False,
                     decoder_sparse_step=1, mlp_only_layers=[], torch_dtype="bfloat16")
MIXTRAL_8X7B = dict(model_type="mixtral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                    num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2, intermediate_size=14336,
                    vocab_size=32000, torch_dtype="bfloat16")
# openai/gpt-oss-120b config.json (the fields the estimate reads)
GPT_OSS_120B = dict(model_type="gpt_oss", hidden_size=2880, num_hidden_layers=36, num_attention_heads=64,
                    num_key_value_heads=8, head_dim=64, num_local_experts=128, num_experts_per_tok=4,
                    intermediate_size=2880, vocab_size=201088, tie_word_embeddings=False, attention_bias=True,
                    torch_dtype="bfloat16")


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "olmoe", "qwen2_moe", "gpt_oss"])
def test_parameter_counts_match_transformers(family):
    from transformers import AutoConfig, AutoModelForCausalLM
    from engine.tools.demo import COMMON, FAMILY_KWARGS
    cfg = AutoConfig.for_model(family, **{**COMMON, **FAMILY_KWARGS[family], "num_hidden_layers": 3, "vocab_size": 300})
    model = AutoModelForCausalLM.from_config(cfg)
    shape = model_shape(json.loads(cfg.to_json_string()))     # as config.json on the hub would read
    assert shape.total_params == model.num_parameters()
    experts = [p for n, p in model.named_parameters() if ".experts." in n]
    routed = sum(p.numel() for p in experts)
    assert shape.active_params == shape.total_params - routed + routed * shape.top_k // shape.num_experts


def test_published_sizes_of_real_models():
    qwen = model_shape(QWEN3_30B_A3B)            # the model card says 30.5B total, 3.3B activated
    assert round(qwen.total_params / 1e9, 1) == 30.5 and 3.3e9 <= qwen.active_params < 3.4e9
    mixtral = model_shape(MIXTRAL_8X7B)          # Mistral's announcement: 46.7B total, 12.9B active
    assert round(mixtral.total_params / 1e9, 1) == 46.7 and round(mixtral.active_params / 1e9, 1) == 12.9
    gpt_oss = model_shape(GPT_OSS_120B)          # OpenAI's model card: 116.8B total, 5.1B active (embedding not counted)
    assert round(gpt_oss.total_params / 1e9, 1) == 116.8
    assert round((gpt_oss.active_params - gpt_oss.embedding_params) / 1e9, 1) == 5.1


def test_expert_block_bytes_follow_the_engine_layout_and_shrink_with_quant():
    shape = model_shape(QWEN3_30B_A3B)
    sizes = {q: expert_block_bytes(shape, q) for q in ("bf16", "fp8", "nvfp4")}
    assert sizes["bf16"] == block_layout(768, 2048, "bf16").block_bytes
    assert sizes["bf16"] >= 3 * 768 * 2048 * 2 and sizes["bf16"] % 4096 == 0
    assert sizes["bf16"] > sizes["fp8"] > sizes["nvfp4"] > 3 * 768 * 2048 // 2


def _machine(**kw) -> Machine:
    base = dict(device="cpu", ram_available_bytes=24 * 2**30, mem_bw_bps=20 * GB, disk_read_bps=2 * GB,
                free_disk_bytes=500 * GB)
    return Machine(**{**base, **kw})


def test_bytes_per_token_and_speed_follow_the_roofline_by_hand():
    est = estimate(QWEN3_30B_A3B, 61 * GB, _machine(), "fp8", hit_rates=(0.5, 0.25))
    shape, block = est.shape, est.block_bytes
    per_token = shape.num_moe_layers * shape.top_k * block             # 48 layers x 8 experts
    assert est.h2d_bytes_per_token == pytest.approx(per_token * 0.5)     # half the blocks are not in a slot
    assert est.disk_bytes_per_token == pytest.approx(per_token * 0.5 * 0.75)
    assert est.bytes_per_token == pytest.approx(per_token * (0.5 + 0.375))
    compute_s = (shape.active_params - shape.embedding_params) * 4 / (20 * GB) + 48 * LAYER_OVERHEAD_S["cpu"]
    assert est.compute_s == pytest.approx(compute_s)
    expected = 1 / (per_token * 0.375 / (2 * GB) + per_token * 0.5 / (20 * GB) + compute_s)
    assert est.tok_s == pytest.approx(expected)
    assert est.disk_needed_bytes == 61 * GB + est.repacked_bytes


def test_budget_split_and_block_size_match_the_engine(model_folders, tmp_path):
    from setup_support import SUPPORTED_REPO, config_of
    from engine import load
    from engine.format.repack import repack
    src = model_folders[SUPPORTED_REPO]
    model_dir = repack(src, tmp_path / "model", quant="bf16")
    vram_budget, ram_cache = 950_000, 300_000       # CPU slot banks (block + decoded weights) for 10 of 32 blocks
    est = estimate(config_of(src), 0, _machine(), "bf16", vram_budget=vram_budget, ram_cache=ram_cache)
    engine = load(model_dir, device="cpu", vram_budget=vram_budget, ram_cache=ram_cache)
    try:
        info = engine.info
    finally:
        engine.close()
    assert est.block_bytes == info["expert_bytes"]
    installed = estimate_model_dir(model_dir, _machine(), vram_budget=vram_budget, ram_cache=ram_cache)
    assert (installed.quant, installed.tok_s) == ("bf16", est.tok_s)
    assert est.expert_bytes == info["expert_bytes_total"]
    num_blocks = info["num_experts"] * est.shape.num_moe_layers
    assert est.slot_hit == pytest.approx(2 * info["slots_per_bank"] / num_blocks) and 0 < est.slot_hit < 1
    ram_blocks = info["ram_cache_bytes"] // info["expert_bytes"]
    slots = 2 * info["slots_per_bank"]
    # exclusive tiers: the RAM cache holds blocks the slots do not
    assert est.ram_hit == pytest.approx(min(1, ram_blocks / (num_blocks - slots)))


def test_smaller_quant_and_more_cache_are_faster():
    machine = _machine()
    speeds = [estimate(QWEN3_30B_A3B, 61 * GB, machine, q, ram_cache=4 * 2**30).tok_s for q in ("bf16", "fp8", "nvfp4")]
    assert speeds[0] < speeds[1] < speeds[2]
    small, big = (estimate(QWEN3_30B_A3B, 61 * GB, machine, "fp8", ram_cache=c).tok_s for c in (2 * 2**30, 16 * 2**30))
    assert small < big


def test_gpu_machine_uses_vram_slots_and_pcie():
    gpu = _machine(device="cuda", vram_bytes=8 * 2**30, pcie_bps=25 * GB, gpu_mem_bw_bps=400 * GB)
    est = estimate(QWEN3_30B_A3B, 61 * GB, gpu, "nvfp4")
    assert 0 < est.slot_hit < 1 and est.h2d_bytes_per_token < est.shape.num_moe_layers * 8 * est.block_bytes
    assert est.verdict in ("fits fast", "fits but slow")


def test_int8_on_a_gpu_counts_the_cpu_computing_ram_resident_experts():
    """fp8 and int8 move the same bytes; with int8 the CPU computes part of the RAM-resident misses
    beside the copies (hybrid execution) where it computes an expert faster than PCIe copies it (a
    narrow link), so the estimate is faster there; with a fast link, and on the CPU device, they are equal."""
    narrow = _machine(device="cuda", vram_bytes=8 * 2**30, pcie_bps=3 * GB, gpu_mem_bw_bps=400 * GB)
    fp8, int8 = (estimate(QWEN3_30B_A3B, 61 * GB, narrow, q, ram_cache=32 * 2**30) for q in ("fp8", "int8"))
    assert int8.h2d_bytes_per_token == pytest.approx(fp8.h2d_bytes_per_token, rel=0.02)
    assert int8.tok_s > 1.1 * fp8.tok_s
    wide = _machine(device="cuda", vram_bytes=8 * 2**30, pcie_bps=25 * GB, gpu_mem_bw_bps=400 * GB)
    assert estimate(QWEN3_30B_A3B, 61 * GB, wide, "int8", ram_cache=32 * 2**30).tok_s == pytest.approx(
        estimate(QWEN3_30B_A3B, 61 * GB, wide, "fp8", ram_cache=32 * 2**30).tok_s, rel=0.05)
    cpu = _machine()
    assert estimate(QWEN3_30B_A3B, 61 * GB, cpu, "int8").tok_s == pytest.approx(
        estimate(QWEN3_30B_A3B, 61 * GB, cpu, "fp8").tok_s, rel=0.05)


def _tiny_model(family: str):
    """(config, transformers model) of a small `family` model, each with its quirks (tests' builders)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
    from engine.tools.demo import COMMON, FAMILY_KWARGS
    from tests.families.dsv4_checkpoint import tiny_config
    from tests.families.hybrid_models import QWEN3_5_TEXT, QWEN3_NEXT, VISION
    if family == "qwen3_5_moe":
        cfg = AutoConfig.for_model(family, text_config=QWEN3_5_TEXT, vision_config=VISION)
        return cfg, AutoModelForImageTextToText.from_config(cfg)
    if family == "qwen3_next":
        cfg = AutoConfig.for_model(family, **QWEN3_NEXT)
    elif family == "deepseek_v4":
        cfg = tiny_config()
    else:
        cfg = AutoConfig.for_model(family, **{**COMMON, **FAMILY_KWARGS[family], "num_hidden_layers": 3, "vocab_size": 300})
    return cfg, AutoModelForCausalLM.from_config(cfg)


@pytest.mark.parametrize("family", ["olmoe", "qwen2_moe", "deepseek_v3", "gpt_oss", "qwen3_next", "qwen3_5_moe",
                                    "deepseek_v4"])
def test_int8_dense_bytes_match_what_the_engine_plans(family):
    """The estimate's int8 dense size, from config.json alone, is what the engine plans from the weights'
    shapes (engine.model.dense_quant.planned_bytes): routers, biases, norms, MLA's kv_b_proj, the DeltaNet's
    gates and DeepSeek-V4's compressors stay in bf16."""
    import torch
    from engine.model.dense_quant import planned_bytes
    from engine.model.spec import canonical_dense_name, is_text_model_tensor
    from engine.plan.estimate import dense_bytes
    cfg, model = _tiny_model(family)
    shapes = {canonical_dense_name(family, n): list(t.shape) for n, t in model.state_dict().items()
              if ".experts." not in n and is_text_model_tensor(family, n)}       # buffers too (router biases)
    shape = model_shape(json.loads(cfg.to_json_string()))
    planned = planned_bytes(shapes, torch.bfloat16, family, "int8")
    assert dense_bytes(shape, 2, "int8") == pytest.approx(planned, rel=0.02)
    if family != "deepseek_v4":          # its hash-routing table is a buffer, not a parameter
        assert dense_bytes(shape, 2, None) == planned_bytes(shapes, torch.bfloat16, family, None)


def test_int8_dense_weights_give_the_experts_vram_and_speed():
    """On a GPU whose VRAM holds only part of the experts, int8 dense weights leave more for the slots, so
    more blocks hit and the estimate is faster; a family without int8 dense weights is estimated as stored."""
    gpu = _machine(device="cuda", vram_bytes=8 * 2**30, pcie_bps=25 * GB, gpu_mem_bw_bps=400 * GB)
    stored, int8 = (estimate(QWEN3_30B_A3B, 61 * GB, gpu, "int8", dense_quant=d) for d in (None, "int8"))
    assert int8.dense_quant == "int8" and stored.dense_quant is None
    assert int8.slot_hit > stored.slot_hit and int8.h2d_bytes_per_token < stored.h2d_bytes_per_token
    assert int8.compute_s < stored.compute_s and int8.tok_s > stored.tok_s
    # the CPU device's decode reads the int8 codes too (kernels/cpu_gemv.py), a quarter of its float32 weights' bytes
    cpu_stored, cpu_int8 = (estimate(QWEN3_30B_A3B, 61 * GB, _machine(), "int8", dense_quant=d) for d in (None, "int8"))
    overhead = 48 * LAYER_OVERHEAD_S["cpu"]
    assert cpu_int8.compute_s - overhead < cpu_stored.compute_s - overhead
    assert cpu_int8.tok_s > cpu_stored.tok_s
    suggested = estimate(QWEN3_30B_A3B, 61 * GB, _machine(), "int8", suggest_int8_dense=True)   # the wizard's tip
    assert suggested.int8_dense_tip is not None and suggested.int8_dense_tip.tok_s == cpu_int8.tok_s
    from engine.model.families import family_module
    with pytest.MonkeyPatch.context() as patch:          # a family that does not name its int8 weights
        patch.delattr(family_module("qwen3_moe"), "DENSE_INT8")
        plain, asked = (estimate(QWEN3_30B_A3B, 61 * GB, gpu, "int8", dense_quant=d) for d in (None, "int8"))
    assert asked.dense_quant is None and asked.tok_s == plain.tok_s


def test_verdicts():
    gpu_24gb = _machine(device="cuda", vram_bytes=24 * 2**30, pcie_bps=25 * GB, gpu_mem_bw_bps=900 * GB,
                        ram_available_bytes=64 * 2**30, disk_read_bps=7 * GB)
    fast = estimate(QWEN3_30B_A3B, 61 * GB, gpu_24gb, "nvfp4")     # most experts fit beside a 16K context
    assert fast.verdict == "fits fast" and fast.tok_s >= FAST_TOK_S and fast.slot_hit > 0.85   # (the CUDA context: 0.85 GB)
    slow = estimate(MIXTRAL_8X7B, 93 * GB, _machine(ram_available_bytes=16 * 2**30, disk_read_bps=0.3 * GB), "bf16")
    assert slow.verdict == "fits but slow" and slow.tok_s < FAST_TOK_S
    no_disk = estimate(QWEN3_30B_A3B, 61 * GB, _machine(free_disk_bytes=50 * GB), "bf16")
    assert no_disk.verdict == "will not run" and "disk" in no_disk.reason
    no_ram = estimate(MIXTRAL_8X7B, 93 * GB, _machine(ram_available_bytes=4 * 2**30), "bf16")
    assert no_ram.verdict == "will not run" and "memory" in no_ram.reason
    too_small = estimate(MIXTRAL_8X7B, 93 * GB, _machine(), "bf16", vram_budget=2 * 2**30)
    assert too_small.verdict == "will not run" and "--vram-budget" in too_small.reason   # the engine's words
    tiny_gpu = estimate(MIXTRAL_8X7B, 93 * GB, _machine(device="cuda", vram_bytes=2 * 2**30, pcie_bps=25 * GB), "bf16")
    assert tiny_gpu.verdict == "will not run" and "GPU memory" in tiny_gpu.reason


def test_config_without_moe_sizes_is_a_clear_error():
    with pytest.raises(SluiceError, match="lacks the MoE sizes"):
        model_shape({"model_type": "qwen3_moe", "hidden_size": 64})
