"""`sluice bench` on DeepSeek-V4: the V4-Flash preset's shapes, and a run of a tiny stand-in on the CPU
that reports bytes per token scaled to the full model beside the seed engine's 4.2 GiB/token."""
import json

from engine.format.modeldir import open_model_dir
from engine.model.spec import read_spec
from engine.tools import presets
from engine.tools.cli import main
from tests.families.dsv4_checkpoint import TINY


def test_flash_preset_has_v4_flash_shapes_with_fewer_layers():
    spec = read_spec(presets.preset_config("deepseek-v4-flash-4l"))
    cfg = spec.cfg
    assert (spec.hidden_size, spec.num_experts, spec.top_k, spec.expert_intermediate) == (4096, 256, 6, 2048)
    assert (cfg.num_attention_heads, cfg.head_dim, cfg.hc_mult, cfg.vocab_size) == (64, 512, 4, 129280)
    assert set(cfg.layer_types) == {"sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"}
    assert spec.num_layers == 4 < presets.FULL_MODEL["deepseek-v4-flash-4l"]["num_layers"] == 43


def test_bench_reports_bytes_per_token_at_full_model_scale(monkeypatch, tmp_path, capsys):
    tiny = {k: v for k, v in TINY.items() if k not in ("rope_parameters",)}
    monkeypatch.setitem(presets.PRESETS, "tiny-dsv4", {"model_type": "deepseek_v4", **tiny})
    monkeypatch.setitem(presets.FULL_MODEL, "tiny-dsv4", {"name": "Tiny-V4", "num_layers": 12,
                                                          "reference_bytes_per_token": 4.2 * 2**30})
    argv = ["bench", "--preset", "tiny-dsv4", "--quant", "fp8", "--device", "cpu", "--prompt-tokens", "24",
            "--new-tokens", "8", "--work-dir", str(tmp_path), "--dtype", "float32"]
    assert main(argv + ["--json"]) == 0                                  # builds the model; default budgets
    first = json.loads(capsys.readouterr().out)
    slot = first["device_slot_bytes"]
    fixed = first["vram_budget_bytes"] - 2 * first["slots_per_bank"] * slot
    argv += ["--vram-budget", str(fixed + 4 * slot), "--ram-cache", "64KB"]  # 2 slots a bank, 8 blocks of RAM
    assert main(argv + ["--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    f = r["full_model"]
    assert f["num_layers"] == 12 and f["preset_layers"] == 6
    block_bytes = open_model_dir(r["model_dir"]).layout.block_bytes
    assert f["expert_bytes_per_token"] == 12 * TINY["num_experts_per_tok"] * block_bytes
    assert f["disk_bytes_per_token"] == r["decode_bytes_per_token"]["disk"] * 2 > 0
    assert main(argv) == 0
    assert "this preset has 6 of its 12 layers" in capsys.readouterr().out


def test_estimate_counts_v4_flash_exactly_and_its_bytes_per_token():
    import torch
    from transformers import AutoModelForCausalLM
    from engine.format.layout import block_layout
    from engine.plan.estimate import Machine, estimate
    config = presets.preset_config("deepseek-v4-flash-4l")
    config.update(num_hidden_layers=43, layer_types=None, mlp_layer_types=None)   # the model's own schedule
    spec = read_spec(config)
    with torch.device("meta"):
        total = AutoModelForCausalLM.from_config(spec.cfg).num_parameters()
    # the seed engine's box: 31 GiB of RAM, 8.2 GiB/s disk
    machine = Machine("cpu", ram_available_bytes=31 << 30, mem_bw_bps=50e9, disk_read_bps=8.2 * 2**30,
                      free_disk_bytes=4 << 40)
    est = estimate(config, 0, machine, "nvfp4")
    assert est.shape.total_params == total                               # 284B-class: V4-Flash
    assert est.expert_bytes_per_token == 43 * 6 * block_layout(2048, 4096, "nvfp4").block_bytes
    assert 0 < est.disk_bytes_per_token <= est.expert_bytes_per_token
