"""Qt-free wizard helpers: where downloads and models go, and the numbers the pages show."""
from __future__ import annotations

from app.setup.common import format_duration, model_dir_name, snapshot_dir
from engine.plan.estimate import format_params


def test_snapshots_are_hidden_beside_the_models(tmp_path):
    assert snapshot_dir(tmp_path, "Qwen/Qwen3-30B-A3B") == tmp_path / ".downloads" / "Qwen--Qwen3-30B-A3B"


def test_model_dir_name_drops_the_owner_and_adds_the_quant():
    assert model_dir_name("Qwen--Qwen3-30B-A3B", "fp8") == "Qwen3-30B-A3B-fp8"
    assert model_dir_name("my model (copy)", "nvfp4") == "my-model-copy-nvfp4"


def test_human_numbers():
    assert format_params(30_532_122_624) == "30.5B" and format_params(3_353_032_704) == "3.4B"
    assert format_duration(None) == "estimating time left"
    assert format_duration(42.4) == "42 s left"
    assert format_duration(125) == "2 min 05 s left"
    assert format_duration(3 * 3600 + 7 * 60) == "3 h 07 min left"


def test_the_wizard_estimates_with_the_dense_weights_the_app_loads_with():
    """Settings → Dense weights int8 reaches the wizard's estimate (more VRAM for expert slots), and its
    verdict says so; a window without settings estimates the dense weights as stored."""
    from types import SimpleNamespace
    from app.settings import AppSettings
    from app.setup.common import engine_options
    from app.setup.estimate_page import estimates_for, verdict_html
    from engine.plan.estimate import Machine
    parent = SimpleNamespace(settings=AppSettings(device="cuda", vram_budget="6GB", dense_weights="int8"))
    options = engine_options(parent)
    assert options["dense_quant"] == "int8" and engine_options(None)["dense_quant"] is None
    config = dict(model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                  num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                  moe_intermediate_size=768, vocab_size=151936, torch_dtype="bfloat16")
    gpu = Machine("cuda", 32 * 2**30, 40e9, 3e9, 500 * 10**9, vram_bytes=8 * 2**30, pcie_bps=25e9, gpu_mem_bw_bps=400e9)
    int8 = estimates_for(config, 61 * 10**9, 0, gpu, options)["int8"]
    stored = estimates_for(config, 61 * 10**9, 0, gpu, {**options, "dense_quant": None})["int8"]
    assert int8.slot_hit > stored.slot_hit and int8.tok_s > stored.tok_s
    assert "int8 dense weights" in verdict_html(int8) and "int8 dense" not in verdict_html(stored)


def test_the_wizard_suggests_int8_dense_weights_where_they_make_a_model_run():
    """With the dense weights as stored, a GPU too small for them gets a tip: int8 dense weights (Settings)
    would run the model, at about this speed. Where they are already chosen, no tip."""
    from app.setup.estimate_page import estimates_for, verdict_html
    from engine.plan.estimate import Machine
    config = dict(model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                  num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                  moe_intermediate_size=768, vocab_size=151936, torch_dtype="bfloat16")
    small_gpu = Machine("cuda", 32 * 2**30, 40e9, 3e9, 500 * 10**9, vram_bytes=int(3.3 * 2**30), pcie_bps=25e9,
                        gpu_mem_bw_bps=400e9)
    options = {"device": "cuda", "vram_budget": None, "ram_cache": None, "dense_quant": None}
    stored = estimates_for(config, 61 * 10**9, 0, small_gpu, options)["int8"]
    assert stored.verdict == "will not run" and stored.int8_dense_tip is not None
    assert stored.int8_dense_tip.is_usable and "Tip: with int8 dense weights" in verdict_html(stored)
    assert "it would run:" in verdict_html(stored)
    chosen = estimates_for(config, 61 * 10**9, 0, small_gpu, {**options, "dense_quant": "int8"})["int8"]
    assert chosen.is_usable and chosen.int8_dense_tip is None and "Tip:" not in verdict_html(chosen)
