"""`sluice bench` end to end on a tiny preset (CPU here; the real presets run on the GPU box)."""
import json

import pytest

from engine.tools.bench import WARM_PROMPTS, report
from engine.tools.cli import main
from engine.tools import presets

TINY = dict(model_type="qwen3_moe", vocab_size=300, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=16,
            num_experts_per_tok=4, max_position_embeddings=512, norm_topk_prob=True, tie_word_embeddings=False)


@pytest.fixture
def tiny_preset(monkeypatch):
    monkeypatch.setitem(presets.PRESETS, "tiny-qwen3", TINY)
    return "tiny-qwen3"


@pytest.fixture(scope="module")
def int8_work(tmp_path_factory):
    """One work folder for the int8 runs: the tiny model is written once (the bench keeps it) for both tests."""
    return tmp_path_factory.mktemp("bench-int8")


@pytest.mark.parametrize("via_repack,quant", [(False, "fp8"), (True, "nvfp4")])
def test_bench_reports_streaming_run(tiny_preset, tmp_path, capsys, via_repack, quant):
    # 3 layers x 16 experts of 12 KiB (fp8) / 8 KiB (nvfp4) blocks; budgets: 4 slots a bank, 6 blocks of RAM
    argv = ["bench", "--preset", tiny_preset, "--quant", quant, "--device", "cpu", "--prompt-tokens", "40",
            "--new-tokens", "12", "--json", "--work-dir", str(tmp_path), "--dtype", "float32"]
    if via_repack:
        argv.append("--via-repack")
    from engine.format.modeldir import open_model_dir
    assert main(argv + ["--vram-budget", "1GB", "--ram-cache", "1GB"]) == 0     # builds the model; ample budgets
    first = json.loads(capsys.readouterr().out)
    block = open_model_dir(first["model_dir"]).layout.block_bytes
    kv_bytes = 2 * 3 * 52 * 2 * 16 * 4                  # k and v, 3 layers, 52 tokens, 2 heads x 16, fp32
    fixed = first["dense_bytes"] + first["workspace_bytes"] + kv_bytes
    assert main(argv + ["--vram-budget", str(fixed + 8 * first["device_slot_bytes"]), "--ram-cache", str(6 * block)]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["slots_per_bank"] == 4 and r["expert_cache_factor"] >= 3
    assert r["new_tokens"] == 12 and r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0
    assert r["prefill_max_reads_per_expert_per_layer"] == 1          # whole-prompt prefill: each expert read once
    assert r["decode_bytes_per_token"]["disk"] > 0                   # the cache is too small: experts stream
    assert 0 < r["decode_roofline_s_per_token"] and 0 < r["decode_efficiency"]
    assert 0 <= r["speculation_recall"] <= 1 and r["prefetch"]["issued"] > 0
    assert r["quant"] == quant
    assert 0 < r["decode_sync_wait_s_per_token"] < r["decode_s_per_token"]
    # the disk's active time is the union of the reads' intervals: within the token, at most their sum
    assert 0 < r["decode_disk_active_s_per_token"] < r["decode_s_per_token"]
    assert r["process_anonymous_by_mapping"] and "anonymous    " in report(r)     # where the memory sits
    # nothing caps this run: a decode reads (almost) no code pages back; a thrashing one would show here
    assert 0 <= r["decode_major_faults_per_token"] < 5 and "read from files while decoding" in report(r)
    # reads that ran behind the decode are named in its line (a short run of a large model measures them too)
    r.update(decode_fill_reads=65, decode_ngram={"rows_per_token": 16.0, "bytes_read_per_token": 0.0, "hit_rate": 1.0,
                                                 "read_amplification": 0.0, "held_read_bytes": 4.1e9})
    assert "(and 65 blocks and 4.10 GB of the n-gram tables read ahead into free RAM over the decode)" in report(r)


def test_bench_with_int8_dense_weights_gives_slots_the_vram_they_free(tiny_preset, int8_work, capsys):
    argv = ["bench", "--preset", tiny_preset, "--quant", "int8", "--device", "cpu", "--prompt-tokens", "16",
            "--new-tokens", "4", "--json", "--work-dir", str(int8_work), "--dtype", "float32", "--ram-cache", "1GB"]
    assert main(argv + ["--vram-budget", "1GB"]) == 0
    stored = json.loads(capsys.readouterr().out)
    budget = str(stored["dense_bytes"] + stored["workspace_bytes"] + 20 * stored["device_slot_bytes"])
    runs = {}
    for dense in ([], ["--dense-quant", "int8"]):
        assert main(argv + ["--vram-budget", budget] + dense) == 0
        runs[bool(dense)] = json.loads(capsys.readouterr().out)
    as_stored, int8 = runs[False], runs[True]
    assert (as_stored["dense_quant"], int8["dense_quant"]) == ("none", "int8")
    assert int8["dense_bytes"] < as_stored["dense_bytes"] / 2
    assert int8["slots_per_bank"] > as_stored["slots_per_bank"]
    assert "dense weights int8" in report(int8) and "dense weights as stored" in report(as_stored)
    assert "sampled at temperature 1 (" in report(int8)


def test_bench_samples_like_the_app_when_asked(tiny_preset, int8_work, capsys, monkeypatch):
    """--top-k / --top-p: the decode samples with the app's cuts (what a user's reply runs), and says so; the
    warm prefill's first token too (plain sampling there would time loading another sampling path)."""
    from engine.engine import Engine
    asked, generate = [], Engine.generate
    monkeypatch.setattr(Engine, "generate", lambda self, prompt, params: (asked.append(params), generate(self, prompt, params))[1])
    assert main(["bench", "--preset", tiny_preset, "--quant", "int8", "--device", "cpu", "--prompt-tokens", "16",
                 "--new-tokens", "4", "--json", "--work-dir", str(int8_work), "--dtype", "float32",
                 "--top-k", "40", "--top-p", "0.95"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["sampling"] == {"temperature": 1.0, "top_k": 40, "top_p": 0.95}
    assert len(asked) == 2 + WARM_PROMPTS and all((p.top_k, p.top_p) == (40, 0.95) for p in asked)  # + the steady reply
    assert result["decode_tok_s"] > 0
    assert "sampled at temperature 1, top-k 40, top-p 0.95 (" in report(result)


def test_steady_decode_of_a_model_that_fits_in_ram_reads_nothing_from_disk(tiny_preset, int8_work, capsys):
    """The second reply, once the RAM fill has ended: the steady decode a warmed-up peer is compared with. Slots too
    few for the experts, RAM for all of them: it reads nothing from the disk, each slot miss a RAM hit."""
    argv = ["bench", "--preset", tiny_preset, "--quant", "int8", "--device", "cpu", "--prompt-tokens", "16",
            "--new-tokens", "24", "--json", "--work-dir", str(int8_work), "--dtype", "float32", "--ram-cache", "1GB"]
    assert main(argv + ["--vram-budget", "1GB"]) == 0
    stored = json.loads(capsys.readouterr().out)
    kv_bytes = 2 * 3 * 40 * 2 * 16 * 4                  # k and v, 3 layers, 40 tokens, 2 heads x 16, fp32
    budget = str(stored["dense_bytes"] + stored["workspace_bytes"] + kv_bytes + 8 * stored["device_slot_bytes"])
    assert main(argv + ["--vram-budget", budget]) == 0
    r = json.loads(capsys.readouterr().out)
    st = r["steady_decode"]
    assert st["ram_filled"] and 0 <= st["fill_wait_s"] < 30
    assert st["new_tokens"] == 24 and st["tok_s"] > 0 and 0 < st["roofline_s_per_token"] and st["efficiency"] > 0
    assert st["bytes_per_token"]["disk"] == 0 and st["hit_rate"]["ram"] == 1.0 and st["hit_rate"]["vram"] < 1.0
    per = st["bytes_per_token"]                      # the misses served from RAM: copied, or computed where they sit
    assert per["h2d"] + per["cpu"] > 0
    assert "decode steady 24 tokens, a second reply (the RAM fill ended" in report(r)
    assert "RAM hits 100.0%" in report(r)


def test_bench_says_in_a_sentence_when_its_model_cannot_be_written(tiny_preset, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    rc = main(["bench", "--preset", tiny_preset, "--quant", "fp8", "--device", "cpu", "--prompt-tokens", "8",
               "--new-tokens", "2", "--work-dir", str(blocker / "work")])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err
    assert "could not be written into" in err and "--work-dir" in err
