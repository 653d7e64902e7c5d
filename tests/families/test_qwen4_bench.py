"""`sluice bench` on qwen4_exp: the Qwen3.8-Flash-Next preset's dimensions against the published model, the
estimate's n-gram bytes, and a run of a tiny stand-in on the CPU (written directly, and as a Hub checkpoint that
transformers loads and the repack converts) reporting the n-gram rows a token and bytes scaled to the full model."""
import json
from pathlib import Path

import pytest
import torch

from engine.format.ngram import NGRAM_FILE, read_index
from engine.model.qwen4.config import read_qwen4_dims
from engine.model.spec import read_spec
from engine.tools import presets
from engine.tools.bench import report
from engine.tools.cli import main
from tests.families.qwen4_models import TEXT

PRESET = "qwen3.8-flash-next-4l"
# Published: 125B parameters besides a 51B n-gram table; its table as others computed it from transformers'
# hashing (16 prime head vocabularies from 2e7, padded to 128 rows)
REAL_TABLE_ROWS = 320_001_536


def full_config() -> dict:
    """The preset's config with the model's own 48 layers and its real table."""
    return presets.full_model_config(PRESET)


def test_flash_next_preset_has_the_models_shapes_with_4_layers_and_a_20th_of_its_table():
    spec = read_spec(presets.preset_config(PRESET))
    d = read_qwen4_dims(spec.cfg)
    assert (spec.hidden_size, spec.num_experts, spec.top_k, spec.expert_intermediate) == (2560, 512, 10, 640)
    assert spec.shared_expert_intermediate == 640 and (d.hc_count, d.hc_lowrank) == (4, 320)
    assert spec.cfg.layer_types == ["linear_attention"] * 3 + ["indexed_attention"]     # the model's first 4
    assert d.ple_layers == (1,) and (d.ngram_heads, d.row_dim) == (16, 160)             # DeltaNet + PLE
    assert (d.indexer_heads, d.indexer_head_dim, d.indexer_budget, d.compress_ratio) == (4, 128, 2048, 4)
    full = read_qwen4_dims(read_spec(full_config()).cfg)
    assert full.table_rows(0) == REAL_TABLE_ROWS and full.ple_layers == d.ple_layers
    assert d.table_rows(0) == pytest.approx(REAL_TABLE_ROWS / 20, rel=1e-3)
    assert spec.num_layers == 4 < presets.FULL_MODEL[PRESET]["num_layers"] == 48
    assert presets._tables(presets.preset_config(PRESET)) == {1: (128, d.table_rows(0) // 128, 160)}


def test_the_presets_files_fit_a_64_gib_disk_with_the_checkpoint_and_its_repack():
    import math
    from engine.format.layout import block_layout
    config = presets.preset_config(PRESET)
    dense = sum(math.prod(shape) for shape in presets._dense_shapes(config).values()) * 2            # bf16
    table_rows = sum(parts * rows for parts, rows, _ in presets._tables(config).values())
    hub = dense + 4 * 512 * 3 * 640 * 2560 * 2 + table_rows * 160 * 2                                  # bf16
    repacked = dense + 4 * 512 * block_layout(640, 2560, "nvfp4").block_bytes + table_rows * 512      # ngram.bin
    assert repacked < 18e9 and hub + repacked < 47e9 < 64 * 2**30 - 16e9    # 16 GB left for the system


def test_the_full_configs_counts_are_the_published_125b_and_51b_table():
    from transformers import AutoModelForCausalLM
    from engine.plan.estimate import model_shape
    shape = model_shape(full_config())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(read_spec(full_config()).cfg)
    table = sum(p.numel() for n, p in model.named_parameters() if "ngram_embedding" in n)
    assert shape.total_params == model.num_parameters()
    assert table == REAL_TABLE_ROWS * 160 and round(table / 1e9) == 51
    assert round((shape.total_params - table) / 1e9) == 126                 # "125B": 125.74B
    assert round((shape.active_params - 2 * shape.embedding_params) / 1e9) == 6   # "A6B": no embedding, head


def test_the_estimate_reads_16_rows_a_token_and_counts_the_tables_on_disk():
    from engine.format.layout import block_layout
    from engine.plan.estimate import Machine, estimate
    machine = Machine("cuda", ram_available_bytes=31 << 30, mem_bw_bps=60e9, disk_read_bps=14e9,
                      free_disk_bytes=4 << 40, vram_bytes=8 << 30, pcie_bps=26e9, gpu_mem_bw_bps=448e9)
    block = block_layout(640, 2560, "nvfp4").block_bytes
    all_hit = estimate(full_config(), 0, machine, "nvfp4", hit_rates=(1.0, 1.0))
    assert all_hit.disk_bytes_per_token == 16 * 4096                         # one page a row, experts all cached
    all_miss = estimate(full_config(), 0, machine, "nvfp4", hit_rates=(0.0, 0.0))
    assert all_miss.disk_bytes_per_token == 48 * 10 * block + 16 * 4096
    # ngram.bin: 320-byte bf16 rows 512 bytes apart (no row across a page)
    assert all_hit.repacked_bytes == all_hit.shape.dense_params * 2 + all_hit.expert_bytes + REAL_TABLE_ROWS * 512


def tiny_bench(monkeypatch, tmp_path, capsys, *flags) -> dict:
    monkeypatch.setitem(presets.PRESETS, "tiny-q4", {"model_type": "qwen4_exp_text", **TEXT})
    monkeypatch.setitem(presets.FULL_MODEL, "tiny-q4", {"name": "Tiny-Q4", "num_layers": 8, "reference_tok_s": 11.65})
    argv = ["bench", "--preset", "tiny-q4", "--quant", "fp8", "--device", "cpu", "--prompt-tokens", "24",
            "--new-tokens", "8", "--work-dir", str(tmp_path), "--dtype", "float32",
            "--ram-cache", "256KB", *flags]        # short of the model: its n-gram rows are read from disk
    assert main(argv + ["--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    result["report"] = report(result)                   # the text `sluice bench` prints for the same result
    return result


def check_ngram_figures(r: dict) -> None:
    g, f = r["decode_ngram"], r["full_model"]
    assert g["rows_per_token"] == 8                   # 2 PLE layers x (orders 2, 3) x 2 heads
    assert 0 < g["bytes_read_per_token"] <= 8 * 4096 and g["read_amplification"] >= 1
    assert f["num_layers"] == 8 and f["preset_layers"] == 4 and f["reference_tok_s"] == 11.65
    assert f["disk_bytes_per_token"] == pytest.approx(r["decode_bytes_per_token"]["disk"] * 2
                                                      + g["bytes_read_per_token"])
    assert "n-gram rows  8.0 a token" in r["report"] and "11.65 tok/s" in r["report"]


def test_bench_writes_the_tables_and_reports_rows_a_token(monkeypatch, tmp_path, capsys):
    r = tiny_bench(monkeypatch, tmp_path, capsys)
    check_ngram_figures(r)
    index = read_index(r["model_dir"])
    d = read_qwen4_dims(read_spec(presets.preset_config("tiny-q4")).cfg)
    assert [(t.layer, t.rows) for t in index.tables] == [(0, d.table_rows(0)), (2, d.table_rows(1))]


def test_bench_via_repack_writes_a_hub_checkpoint_transformers_loads(monkeypatch, tmp_path, capsys):
    from transformers import AutoModelForCausalLM
    r = tiny_bench(monkeypatch, tmp_path, capsys, "--via-repack")
    check_ngram_figures(r)
    hf_dir = presets.hf_checkpoint_dir(tmp_path, "tiny-q4")
    weight_map = json.loads((hf_dir / presets.HF_INDEX).read_text())["weight_map"]
    assert sum("ngram_embedding.shard_" in n for n in weight_map) == 2 * TEXT["split_ngram_parts"]
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16)     # the shards concatenated
    ple = model.model.layers[0].ple.ple_embedding            # the hash constants as loaded, and as computed
    assert ple.ngram_heads_vocab_sizes.tolist() == ple.head_vocab_sizes and ple.head_vocab_sizes[0] > 1
    assert ple.ngram_heads_offsets.tolist() == ple.head_offsets
    index = read_index(r["model_dir"])
    data = (Path(r["model_dir"]) / NGRAM_FILE).read_bytes()
    for table, layer in zip(index.tables, (0, 2)):
        expected = model.model.layers[layer].ple.ple_embedding.ngram_embedding.weight.detach()
        rows = torch.frombuffer(bytearray(data[table.offset:table.offset + table.rows * index.row_stride]),
                                dtype=torch.uint8).view(table.rows, index.row_stride)[:, :index.row_bytes]
        assert torch.equal(rows.contiguous().view(torch.bfloat16), expected)
    last_shard = "model.layers.2.ple.ple_embedding.ngram_embedding.shard_3.weight"
    direct = presets._random_table_shard(presets.preset_config("tiny-q4"), last_shard, "cpu", 0)
    assert torch.equal(direct, expected[-direct.shape[0]:])               # both writers: the same rows


def test_the_catalog_lists_flash_next_with_the_estimates_counts():
    from app.setup.catalog import load_catalog
    from engine.plan.estimate import model_shape
    entry = next(m for m in load_catalog() if m.repo == "Qwen/Qwen3.8-Flash-Next")
    shape = model_shape({**full_config(), "model_type": "qwen4_exp"})
    assert entry.family == "qwen4_exp"
    assert (entry.total_params_b, entry.active_params_b) == (round(shape.total_params / 1e9, 1),
                                                             round(shape.active_params / 1e9, 1))


def test_the_exceeds_regime_computes_the_models_speed_on_the_origins_machine(monkeypatch, tmp_path, capsys):
    from bench.__main__ import main as bench_main
    monkeypatch.setitem(presets.PRESETS, "tiny-q4", {"model_type": "qwen4_exp_text", **TEXT})
    monkeypatch.setitem(presets.FULL_MODEL, "tiny-q4", {"name": "Tiny-Q4", "num_layers": 8, "reference_tok_s": 11.65})
    monkeypatch.setitem(presets.FULL_CONFIG, "tiny-q4", {"num_hidden_layers": 8, "layer_types": None})
    argv = ["--out", str(tmp_path / "out"), "--work-dir", str(tmp_path), "regime", "--regime", "exceeds", "--no-cgroup",
            "--keep-page-cache"]
    flags = ["--preset", "tiny-q4", "--quant", "fp8", "--dense-quant", "int8", "--vram-budget", "8GB", "--device",
             "cpu", "--prompt-tokens", "24", "--new-tokens", "8", "--dtype", "float32"]
    assert bench_main([*argv, "--json", "--", *flags]) == 0
    r = json.loads(capsys.readouterr().out)
    origin = r["origin"]
    assert r["regime"]["name"] == "exceeds" and r["decode_ngram"]["rows_per_token"] == 8
    assert origin["computed"] and origin["reference_tok_s"] == 11.65 and origin["dense_quant"] == "int8"
    assert origin["tok_s"] == pytest.approx(origin["roofline_tok_s"] * r["decode_efficiency"]) and origin["tok_s"] > 0
    assert origin["disk_bytes_per_token"] >= 2 * 4 * 4096                # its 8 layers' experts, 2 PLE layers' rows
    from bench.origin import origin_lines               # the text report's lines of the same result (one run, not two)
    assert any("computed     Tiny-Q4 on the origin's machine (8 GB RTX 5060" in line for line in origin_lines(r))
