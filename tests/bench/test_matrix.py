"""The benchmark matrix stage (python -m bench matrix): the peer's point within Sluice's VRAM, the -ncmoe points
around a VRAM limit, regimes scaled to a family's size, the files against the disk, the table from recorded
results, the dry run's commands, and one real run of a tiny family on the CPU without llama-bench."""
import json

import pytest

from bench import cgroup, matrix_plan, peer_runs
from bench.__main__ import main as bench_main
from bench.matrix_plan import FAMILIES, Family, Files, format_table, ncmoe_points, scaled_regime, sluice_vram_at
from bench.regimes import REGIMES
from bench.stages import regime as regime_stage
from engine.tools import presets
from tests.bench.test_bench_tree import TINY_OLMOE

GB = 10**9


def _run(ncmoe, decode, vram, prefill=1500.0):
    return {"ncmoe": ncmoe, "decode_tok_s": decode, "prefill_tok_s": prefill, "vram_driver_bytes": vram and int(vram),
            "decode_tok_s_below": None}


def test_peer_point_is_its_fastest_within_the_vram_and_sets_sluices_budget_in_fits_vram_ram():
    # OLMoE on the H100 (BENCHMARKS.md): -ncmoe 9 at 4.2 GB is the fastest, -ncmoe 8 faster still but over
    runs = [_run(8, 130.0, 4.6 * GB), _run(9, 100.9, 4.2 * GB), _run(10, 88.4, 3.97 * GB), _run(16, 20.0, 1.2 * GB)]
    assert peer_runs.best_run(runs, int(4.3 * GB))["ncmoe"] == 9
    assert peer_runs.best_run(runs, int(4.0 * GB))["ncmoe"] == 10
    assert peer_runs.best_run(runs, int(1.0 * GB)) is None
    # Sluice then runs at that point's driver-view VRAM; with no point (or its VRAM unread), the regime's budget
    assert sluice_vram_at(runs[1], "4GB") == str(int(4.2 * GB))
    assert sluice_vram_at(None, "4GB") == "4GB"
    assert sluice_vram_at(_run(9, 100.0, None), "4GB") == "4GB"


def test_ncmoe_points_bracket_the_vram_limit_and_include_every_layer_on_the_cpu():
    # OLMoE's Q8_0 GGUF: 6.85 GiB of which 6.84 GB experts (0.43 GB a layer); -ncmoe 10 showed 3.97 GB
    olmoe = Files(hf_bytes=0, sluice_bytes=0, gguf_bytes=7_355_445_248, gguf_expert_bytes=6_854_082_560)
    assert ncmoe_points(olmoe, 16, 16, 4 * GB) == (9, 10, 11, 12, 16)
    assert ncmoe_points(olmoe, 16, 16, 2 * GB, exceeds=True) == (15, 16)    # every exceeds run takes its timeout
    assert ncmoe_points(olmoe, 16, 16, 40 * GB) == (0, 1, 2, 16)            # everything fits: no negative points
    assert ncmoe_points(olmoe, 16, 16, 0) == (15, 16)                        # nothing fits


def test_flash_next_gguf_quantizes_its_ngram_table_and_keeps_it_and_the_embeddings_off_the_gpu():
    files = matrix_plan.file_bytes(presets.preset_config("qwen3.8-flash-next-4l"), "int8")
    table = 16_001_920 * 160 * 34 // 32                         # 1/20 of the real table's rows, Q8_0 (160 = 5 blocks)
    embeddings = 248_320 * 2560 * 34 // 32
    assert abs(files.gguf_host_bytes - (table + embeddings)) < 10**6 and 15.0 * GB < files.gguf_bytes < 15.2 * GB
    # 1.84 GB on the GPU besides the experts (2.67 GB a layer): 2 layers' experts within 7.75 GiB, none in 4 GiB
    assert ncmoe_points(files, 4, 4, int(7.75 * 2**30)) == (1, 2, 3, 4)
    assert ncmoe_points(files, 4, 4, 4 << 30, exceeds=True) == (4,)


def test_regimes_scale_with_the_model_and_olmoes_are_the_regimes_own():
    r = REGIMES["fits-vram-ram"]
    assert scaled_regime(r, 7_355_445_248, 7_355_445_248) is r
    double = scaled_regime(r, 2 * 7_355_445_248, 7_355_445_248)
    assert double.memory_cap_bytes == 8 << 30 and double.vram_budget == "7.5GiB"      # 4 GB = 3.73 GiB, rounded up
    assert "scaled by 2.00" in double.summary and double.name == "fits-vram-ram"
    assert scaled_regime(REGIMES["fits-ram"], 10**6, 7_355_445_248).memory_cap_bytes is None
    assert scaled_regime(REGIMES["exceeds"], 10**6, 7_355_445_248).vram_budget == "0.25GiB"   # at least 256 MiB


def test_a_family_too_big_for_the_disk_runs_a_subset_of_its_layers():
    known = dict(presets.PRESETS)
    plan = matrix_plan.plan_family(FAMILIES["qwen3-30b-a3b"], known, 64 * GB, with_peer=True)
    assert plan.preset == "qwen3-30b-a3b-20l" and plan.num_layers == 20 and plan.fits
    assert plan.layers_note() == "20 of 48 layers (the files of more would not fit a 64 GB disk)"
    assert plan.config["num_hidden_layers"] == 20 and known == presets.PRESETS      # registering is the caller's
    assert plan.layout == "same" and plan.layout_note() == ""
    alone = matrix_plan.plan_family(FAMILIES["qwen3-30b-a3b"], presets.PRESETS, 64 * GB, with_peer=False)
    assert alone.preset == "qwen3-30b-a3b" and alone.layers_note() == "all 48 layers"      # 29 GB of int8 alone
    assert alone.layout == "alone" and not alone.peer_left_out
    # fixed layers (an explicit schedule; a count llama.cpp requires): the peer on a separate draw, where that fits
    for name, disk in (("qwen3.8-flash-next", 64), ("deepseek-v2-lite", 64)):
        fixed = matrix_plan.plan_family(FAMILIES[name], presets.PRESETS, disk * GB, with_peer=True)
        assert fixed.preset == FAMILIES[name].preset and fixed.layout == "separate" and fixed.fits
        assert fixed.files.peak("separate") < fixed.files.peak("same")
        assert "another random draw of the same shapes" in fixed.layout_note()
    lite = matrix_plan.plan_family(FAMILIES["deepseek-v2-lite"], presets.PRESETS, 40 * GB, with_peer=True)
    assert lite.layout == "alone" and lite.peer_left_out and lite.num_layers == 27    # never a subset llama.cpp refuses


def _sluice(decode, vram, warm, cold, eff, reads_ms, syncs_ms, token_ms, steady=None):
    return {**({"steady_decode": {"tok_s": steady[0], "efficiency": steady[1]}} if steady else {}),
            "decode_tok_s": decode, "vram_driver_bytes": vram, "warm_prefill_tok_s": warm, "prefill_tok_s": cold,
            "decode_efficiency": eff, "decode_read_wait_s_per_token": reads_ms / 1e3,
            "decode_sync_wait_s_per_token": syncs_ms / 1e3, "decode_s_per_token": token_ms / 1e3,
            "decode_cpu_per_token": {"experts": 0.0}}


def test_table_is_built_from_recorded_results():
    peer = {"runs": [_run(9, 100.9, 4.2 * GB, prefill=855.0), _run(10, 96.2, 3.97 * GB, prefill=850.0)],
            "vram_limit_bytes": int(4.2 * GB)}
    peer["best"] = peer["runs"][0]
    peer["ratio"] = peer_runs.ratios(_sluice(138.5, 0, 4018.0, 131.0, 0.6, 0, 0, 1, steady=(160.0, 0.5)), peer)
    stopped = {"runs": [{**_run(13, None, 1.9 * GB, prefill=151.0), "decode_tok_s_below": 0.53}],
               "vram_limit_bytes": 2 * GB, "best": None}
    stopped["ratio"] = peer_runs.ratios(_sluice(6.57, 0, 262.0, 100.0, 0.81, 0, 0, 1), stopped)
    matrix = {"families": {
        "olmoe": {"preset": "olmoe-1b-7b", "layers": 16, "full_layers": 16, "layers_note": "all 16 layers",
                  "regimes": {"fits-ram": {"sluice": _sluice(138.5, 3.6 * 2**30, 4018.0, 131.0, 0.6, 0.0, 2.9, 7.2,
                                                             steady=(160.0, 0.5)),
                                           "peer": peer},
                              "exceeds": {"sluice": _sluice(6.57, 1.76 * 2**30, 262.0, 100.0, 0.81, 127.0, 3.0, 152.0),
                                          "peer": stopped}}},
        "qwen3-30b-a3b": {"preset": "qwen3-30b-a3b-20l", "layers": 20, "full_layers": 48,
                          "layers_note": "20 of 48 layers (the files of more would not fit a 64 GB disk)",
                          "regimes": {"fits-ram": {"sluice": {"error": "sluice bench failed with exit 1"},
                                                   "peer": {"not_run": "Sluice failed"}}}},
        "deepseek-v4-flash": {"preset": "deepseek-v4-flash-4l", "layers": 4, "full_layers": 43,
                              "layers_note": "4 of 43 layers (the preset deepseek-v4-flash-4l's subset)",
                              "regimes": {"fits-ram": {"sluice": _sluice(16.2, 8 * 2**30, 300.0, 50.0, 0.53, 1, 5, 61.7),
                                                       "peer": {"not_run": "llama.cpp cannot take it"}}}}}}
    rows = matrix_plan.table_rows(matrix)
    # the ratio: Sluice's steady decode (its second reply, after the RAM fill) against llama-bench's warmed-up one
    assert rows[0] == ["olmoe (16/16)", "fits-ram", "160.00 / 138.50 (3.60 GiB)", "100.90 (-ncmoe 9, 3.91 GiB)",
                       "1.59x", "4018 / 131 vs 855", "0.50 / 0.60", "syncs 2.9 of 7.2 ms; CPU 0.0 experts a token"]
    assert peer["ratio"]["first_reply_decode"] == 138.5 / 100.9
    assert rows[1][2] == "- / 6.57 (1.76 GiB)" and rows[1][6] == "- / 0.81"     # a record from before the steady run
    assert rows[1][3:5] == ["< 0.53 (timed out)", ">= 12.4x"]
    assert rows[1][7].startswith("reads 127.0 of 152.0 ms")
    assert rows[2][:3] == ["qwen3-30b-a3b (20/48)", "fits-ram", "failed: sluice bench failed with exit 1"]
    assert rows[3][3:5] == ["not run (llama.cpp cannot take it)", "n/a"]
    text = format_table(matrix)
    assert text.splitlines()[0].startswith("| family (layers) | regime | Sluice decode")
    assert "qwen3-30b-a3b: preset qwen3-30b-a3b-20l, 20 of 48 layers (the files of more would not fit" in text


def test_dry_run_prints_every_command_for_two_families(tmp_path, capsys):
    argv = ["--out", str(tmp_path), "--work-dir", "/w", "matrix", "olmoe", "deepseek-v4-flash", "--dry-run",
            "--llama-bench", "/x/llama-bench", "--llama-src", "/src"]
    assert bench_main(argv) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("matrix: 2 families x 3 regimes; llama-bench /x/llama-bench; disk 64 GB")
    assert "== olmoe: preset olmoe-1b-7b, all 16 layers" in lines
    assert "   files ~28.6 GB at most (HF checkpoint 13.8 GB + Sluice int8 7.4 GB + GGUF 7.4 GB)" in lines
    assert ("   python -m bench.gguf_convert /src /w/olmoe-1b-7b-hf /w/olmoe-1b-7b-q8_0.gguf --outtype q8_0   "
            "# after writing the HF checkpoint") in lines
    flags = "--preset olmoe-1b-7b --quant int8 --dense-quant int8 --prompt-tokens 512"
    assert (f"   sluice bench {flags} --new-tokens 128 --device cuda --vram-budget 4GB --via-repack --json "
            "--work-dir /w") in lines
    # fits-vram-ram: llama-bench first, under the cap; Sluice then at its best point's VRAM
    i = lines.index("   -- fits-vram-ram: VRAM budget 3.73 GiB, cap 4.00 GiB (cgroup v2 memory.max, page cache "
                    "dropped before each run)")
    assert [line.split("-ncmoe ")[1].split()[0] for line in lines[i + 1:i + 6]] == ["9", "10", "11", "12", "16"]
    assert lines[i + 1] == ("   /x/llama-bench -m /w/olmoe-1b-7b-q8_0.gguf -ngl 99 -ncmoe 9 -lzm on -t 16 -p 512 -n 64 -r 2 "
                            "-o jsonl")
    assert lines[i + 7] == (f"   sluice bench {flags} --new-tokens 64 --device cuda --vram-budget PEER_VRAM "
                            "--via-repack --json --work-dir /w")
    assert "-ncmoe 15 -lzm on -t 16 -p 512 -n 16 -r 1" in out                          # exceeds: fewer tokens, one repetition
    # DeepSeek-V4-Flash: the converter cannot take it; Sluice alone, its preset written directly, scaled regimes
    assert "== deepseek-v4-flash: preset deepseek-v4-flash-4l, 4 of 43 layers (the preset deepseek-v4-flash-4l's subset)" in lines
    assert any(line.startswith("   llama.cpp: not run (llama.cpp cannot take it: llama.cpp's DeepSeek-V4") for line in lines)
    v4 = [line for line in lines if "--preset deepseek-v4-flash-4l" in line]
    assert len(v4) == 3 and not any("--via-repack" in line for line in v4)
    assert "GiB" in v4[0].split("--vram-budget ")[1]                           # scaled from OLMoE's 4 GB
    assert lines[-2].startswith("files of all 2 families together: ~46 GB")
    assert not (tmp_path / "matrix.json").exists()                             # nothing ran


def test_unknown_family_is_refused_in_one_sentence(tmp_path, capsys):
    assert bench_main(["--out", str(tmp_path), "matrix", "olmoe", "mixtral", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err == f"bench: Unknown family mixtral: choose among {', '.join(FAMILIES)}.\n"


@pytest.fixture
def tiny_family(monkeypatch, tmp_path):
    """A two-layer OLMoE as the matrix's family "tiny", run with budgets only (no cgroup) and the page cache kept."""
    monkeypatch.setitem(presets.PRESETS, "tiny-olmoe", TINY_OLMOE)
    monkeypatch.setitem(FAMILIES, "tiny", Family("tiny", "tiny-olmoe", "int8", 2))
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", tmp_path / "not-a-cgroup")       # budgets only, as without cgroups
    monkeypatch.setattr(regime_stage, "drop_page_cache", lambda: False)
    monkeypatch.setattr(peer_runs, "drop_page_cache", lambda: False)


def test_matrix_runs_a_tiny_family_on_the_cpu_without_llama_bench(tiny_family, tmp_path, capsys):
    # two regimes: without a peer every regime's cell runs the same code, at its own budgets (the default of all
    # three is the dry run's above; fits-vram-ram runs for real in the test below)
    argv = ["--out", str(tmp_path / "out"), "--work-dir", str(tmp_path), "matrix", "tiny", "--device", "cpu",
            "--regime", "fits-ram", "exceeds", "--", "--dtype", "float32", "--prompt-tokens", "24", "--new-tokens", "6"]
    assert bench_main(argv) == 0
    out = capsys.readouterr().out
    matrix = json.loads((tmp_path / "out" / "matrix.json").read_text())
    fam = matrix["families"]["tiny"]
    assert fam["preset"] == "tiny-olmoe" and fam["layers_note"] == "all 2 layers"
    assert list(fam["regimes"]) == ["fits-ram", "exceeds"]
    for name, cell in fam["regimes"].items():
        s = cell["sluice"]
        assert s["decode_tok_s"] > 0 and s["warm_prefill_tok_s"] > 0 and s["regime"]["name"] == name
        assert cell["peer"] == {"not_run": "no --llama-bench"}
    assert fam["regimes"]["exceeds"]["sluice"]["regime"]["memory_cap"]["method"] == "budgets only"
    table = out[out.index("| family (layers)"):]
    assert table.count("| tiny (2/2) |") == 2 and table.count("not run (no --llama-bench)") == 2
    assert "placement    " in out or "per token    " in out                     # the bench's own lines, per cell


def test_matrix_runs_llama_bench_first_in_fits_vram_ram_and_after_sluice_elsewhere(tiny_family, monkeypatch, tmp_path,
                                                                                     capsys):
    from bench import llamacpp
    from tests.bench.test_bench_tree import _fake_llama_bench
    order = []
    monkeypatch.setattr(llamacpp, "convert_preset", lambda preset, work, *a: tmp_path / f"{preset}.gguf")
    sweep, sluice = peer_runs.sweep, regime_stage.sluice_in_regime
    monkeypatch.setattr("bench.stages.matrix.sweep", lambda *a, **kw: order.append("peer") or sweep(*a, **kw))
    monkeypatch.setattr(regime_stage, "sluice_in_regime", lambda *a, **kw: order.append("sluice") or sluice(*a, **kw))
    exe = _fake_llama_bench(tmp_path, decode_sleep_s=0)
    argv = ["--out", str(tmp_path / "out"), "--work-dir", str(tmp_path), "matrix", "tiny", "--device", "cpu",
            "--regime", "fits-ram", "fits-vram-ram", "--llama-bench", str(exe), "--llama-ncmoe", "1", "2", "--",
            "--dtype", "float32", "--prompt-tokens", "24", "--new-tokens", "6"]
    assert bench_main(argv) == 0
    assert order == ["sluice", "peer", "peer", "sluice"]
    cells = json.loads((tmp_path / "out" / "matrix.json").read_text())["families"]["tiny"]["regimes"]
    for cell in cells.values():
        assert [r["ncmoe"] for r in cell["peer"]["runs"]] == [1, 2] and cell["peer"]["best"]["decode_tok_s"] > 120
        best = cell["peer"]["best"]["decode_tok_s"]
        assert cell["peer"]["ratio"]["decode"] == cell["sluice"]["steady_decode"]["tok_s"] / best   # warm against warm
        assert cell["peer"]["ratio"]["first_reply_decode"] == cell["sluice"]["decode_tok_s"] / best
        assert cell["sluice"]["model_dir"].endswith("-repacked")                # the GGUF's checkpoint, repacked
    assert cells["fits-vram-ram"]["sluice"]["vram_budget_bytes"] == 256 << 20   # no VRAM read: the regime's budget
    out = capsys.readouterr().out
    assert "vs llama.cpp Sluice / llama.cpp (best -ncmoe within" in out and "120.30 (-ncmoe 1, VRAM n/a)" in out


def test_a_separate_draw_deletes_the_checkpoint_once_converted(monkeypatch, tmp_path):
    import argparse
    from dataclasses import replace
    from bench import llamacpp
    from bench.stages import matrix
    monkeypatch.setitem(presets.PRESETS, "tiny-olmoe", TINY_OLMOE)
    plan = matrix_plan.plan_family(Family("tiny", "tiny-olmoe", "int8", 2), presets.PRESETS, 64 * GB, with_peer=True)
    hf = presets.hf_checkpoint_dir(tmp_path, "tiny-olmoe")

    def convert(preset, work, *a):
        hf.mkdir(exist_ok=True)
        return tmp_path / "tiny.gguf"
    monkeypatch.setattr(llamacpp, "convert_preset", convert)
    args = argparse.Namespace(llama_bench=tmp_path / "llama-bench", work_dir=tmp_path, llama_src=tmp_path, device="cpu")
    assert matrix._gguf(plan, args) == (tmp_path / "tiny.gguf", None) and hf.is_dir()       # one checkpoint for both
    assert matrix._gguf(replace(plan, layout="separate"), args) == (tmp_path / "tiny.gguf", None) and not hf.exists()
    assert matrix._gguf(replace(plan, layout="alone", peer_left_out=True), args)[1].startswith(
        "its HF checkpoint and GGUF beside Sluice's files")


def test_a_flash_next_cell_carries_its_speed_on_the_origins_machine_computed(monkeypatch):
    """The model the project was made for: its cell adds the whole model's computed speed on the origin's machine
    (the estimate there times the efficiency this run measured), beside the origin's measured 11.65 tok/s."""
    from argparse import Namespace

    from bench.stages.matrix import run_cell
    from bench.origin import ORIGIN
    from engine.plan.estimate import estimate
    from engine.tools.presets import full_model_config
    measured = {"preset": "qwen3.8-flash-next-4l", "quant": "int8", "dense_quant": "int8", "decode_efficiency": 0.61}
    monkeypatch.setattr(regime_stage, "sluice_in_regime", lambda *a, **kw: dict(measured))
    plan = matrix_plan.plan_family(FAMILIES["qwen3.8-flash-next"], presets.PRESETS, 64 * GB, with_peer=False)
    cell = run_cell(plan, REGIMES["exceeds"], None, "no --llama-bench", Namespace(bench_args=[], device="cuda"))
    origin = cell["sluice"]["origin"]
    roofline = estimate(full_model_config("qwen3.8-flash-next-4l"), 0, ORIGIN, "int8", dense_quant="int8").tok_s
    assert origin["computed"] and origin["reference_tok_s"] == 11.65
    assert origin["tok_s"] == roofline * 0.61 and 0 < origin["tok_s"] < 11.65


def test_prepare_only_builds_the_peer_and_writes_the_files_then_the_same_command_times_them(tiny_family, monkeypatch, tmp_path,
                                                                                             capfd):
    import subprocess
    from bench import llamacpp
    from tests.bench.test_bench_tree import _fake_llama_bench
    fake, binary, builds = _fake_llama_bench(tmp_path, decode_sleep_s=0), tmp_path / "build" / "bin" / "llama-bench", []

    def start_build(src, build_dir, jobs, log_path, cuda=True):     # a build that takes a moment, in the background
        if llamacpp.bench_binary(build_dir).is_file():
            return None
        builds.append(build_dir)
        return subprocess.Popen(["sh", "-c", f"sleep 0.5; mkdir -p {binary.parent} && cp {fake} {binary}"])

    def convert(preset, work, *a):
        out = llamacpp.gguf_path(work, preset)
        out.write_bytes(b"GGUF")
        return out
    monkeypatch.setattr(llamacpp, "start_build", start_build)
    monkeypatch.setattr(llamacpp, "convert_preset", convert)
    argv = ["--out", str(tmp_path / "out"), "--work-dir", str(tmp_path), "matrix", "tiny", "--device", "cpu",
            "--regime", "fits-ram", "--llama-bench", str(binary), "--llama-ncmoe", "1", "--build-peer"]
    assert bench_main([*argv, "--prepare-only"]) == 0
    assert builds == [tmp_path / "build"] and binary.is_file() and (tmp_path / "tiny-olmoe-q8_0.gguf").is_file()
    assert (tmp_path / "tiny-olmoe-int8-repacked" / "sluice.json").is_file()    # Sluice's model, from the same checkpoint
    assert not (tmp_path / "out" / "matrix.json").exists()                       # nothing timed
    assert "model ready in" in capfd.readouterr().err
    assert bench_main([*argv, "--", "--dtype", "float32", "--prompt-tokens", "24", "--new-tokens", "6"]) == 0
    assert builds == [tmp_path / "build"]                                         # built once
    cell = json.loads((tmp_path / "out" / "matrix.json").read_text())["families"]["tiny"]["regimes"]["fits-ram"]
    assert cell["sluice"]["decode_tok_s"] > 0 and cell["peer"]["best"]["ncmoe"] == 1
    assert "model ready in" not in capfd.readouterr().err                       # the prepared model, not rewritten


def test_build_peer_needs_a_builds_binary_path(tmp_path, capsys):
    argv = ["--out", str(tmp_path / "out"), "matrix", "olmoe", "--llama-bench", str(tmp_path / "llama-bench"),
            "--build-peer"]
    assert bench_main(argv) != 0
    assert "is not a build's bin/llama-bench" in capsys.readouterr().err
