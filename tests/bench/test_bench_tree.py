"""The bench tree (`python -m bench`): the regimes' budgets, the cgroup cap and its fallback, reading llama-bench's
output (a sample in its jsonl format beside this file), the peer run end to end with a stand-in llama-bench
executable, the A/B stage's variants, and the shipped `sluice bench` pointing at the tree (CPU, tiny presets)."""
import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench import cgroup, peer_runs as peer
from bench.__main__ import main as bench_main
from bench.common import summary_line
from bench.llamacpp import parse_compute_apps, parse_llama_bench, summarize
from bench.peer_runs import ratios
from bench.regimes import REGIMES, describe, regime, regime_budgets
from bench.stages import ab, regime as regime_stage
from bench.stages.regime import cap_stat_lines
from engine.errors import SluiceError
from engine.tools import presets
from engine.tools.bench import report
from engine.tools.cli import main

SAMPLE = Path(__file__).parent / "llama_bench_olmoe_ncmoe9.jsonl"
ROOT = Path(__file__).parents[2]
TINY_OLMOE = dict(model_type="olmoe", vocab_size=320, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, num_experts=8, num_experts_per_tok=2,
                  max_position_embeddings=512, norm_topk_prob=False, tie_word_embeddings=False)


@pytest.fixture
def tiny_olmoe(monkeypatch):
    monkeypatch.setitem(presets.PRESETS, "tiny-olmoe", TINY_OLMOE)
    return "tiny-olmoe"


@pytest.fixture
def no_cgroup_here(monkeypatch, tmp_path):
    """A cgroup root that is not a cgroup v2 hierarchy (as on a machine without one), and no cache drops."""
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", tmp_path / "not-a-cgroup")
    monkeypatch.setattr(regime_stage, "drop_page_cache", lambda: False)
    monkeypatch.setattr(peer, "drop_page_cache", lambda: False)


# ---- regimes -----------------------------------------------------------------------------------------------

def test_regime_names_are_checked(capsys):
    with pytest.raises(SluiceError, match="Unknown regime 'nope': choose one of fits-ram, fits-vram-ram, exceeds"):
        regime("nope")
    with pytest.raises(SystemExit) as exc:
        bench_main(["regime", "--regime", "fits-everything"])
    assert exc.value.code == 2 and "invalid choice: 'fits-everything'" in capsys.readouterr().err


def test_shipped_bench_points_regimes_and_the_peer_at_the_bench_tree(capsys):
    for flag in (["--regime", "exceeds"], ["--llama-bench", "/x/llama-bench"]):
        assert main(["bench", "--preset", "olmoe-1b-7b", "--device", "cpu", *flag]) == 2
        assert "run from the repository's bench tree: python -m bench regime" in capsys.readouterr().err


def test_regime_budgets_map_to_the_issue_settings():
    # fits-ram: RAM free, ~4 GB VRAM; the RAM cache is the engine's to choose
    assert regime_budgets(REGIMES["fits-ram"], None, None, capped=False) == ("4GB", None)
    # under a real cap the engine sizes the cache from the cgroup; with budgets only, half the cap
    assert regime_budgets(REGIMES["fits-vram-ram"], None, None, capped=True) == ("4GB", None)
    assert regime_budgets(REGIMES["fits-vram-ram"], None, None, capped=False) == ("4GB", str(2 << 30))
    assert regime_budgets(REGIMES["exceeds"], None, None, capped=False) == ("2GB", str(5 << 28))
    # the user's own flags win
    assert regime_budgets(REGIMES["exceeds"], "3GB", "1GiB", capped=False) == ("3GB", "1GiB")
    assert REGIMES["fits-vram-ram"].memory_cap_bytes == 4 << 30 and REGIMES["exceeds"].memory_cap_bytes == 5 << 29
    assert "budgets only" in describe(REGIMES["exceeds"], capped=False)
    assert "cgroup v2 memory.max" in describe(REGIMES["exceeds"], capped=True)


def test_regime_child_gets_the_users_flags_and_the_regimes_budgets():
    flags = ["--preset", "olmoe-1b-7b", "--quant", "nvfp4", "--prompt-tokens", "512", "--eager", "--set",
             "ram_fill=false", "--dense-quant", "int8", "--top-k", "40"]
    bench = regime_stage.parse_bench_args(flags)
    assert bench.preset == "olmoe-1b-7b" and bench.eager and bench.settings == ["ram_fill=false"] and bench.top_k == 40
    child = regime_stage.regime_flags(bench, REGIMES["exceeds"], flags, via_repack=True, capped=False)
    assert child[:len(flags)] == flags                                         # every flag of the user's, unchanged
    assert child[len(flags):] == ["--vram-budget", "2GB", "--ram-cache", str(5 << 28), "--via-repack"]
    given = flags + ["--vram-budget", "3GB"]                                   # the user's own budget wins
    child = regime_stage.regime_flags(regime_stage.parse_bench_args(given), REGIMES["exceeds"], given, False,
                                       capped=True)
    assert child == given                              # under a real cap the engine sizes its RAM cache


# ---- the cgroup helper --------------------------------------------------------------------------------------

def test_memory_cap_says_why_it_cannot_be_set(tmp_path):
    with pytest.raises(cgroup.CgroupUnavailable, match="is not a cgroup v2 hierarchy"):
        cgroup.MemoryCap.create("x", 1 << 30, root=tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpu io pids\n")
    with pytest.raises(cgroup.CgroupUnavailable, match="memory controller is not available"):
        cgroup.MemoryCap.create("x", 1 << 30, root=tmp_path)


def test_memory_cap_starts_the_command_inside_its_group(tmp_path):
    # a directory laid out like a cgroup v2 root (its files are plain files here): the group gets memory.max,
    # and the command moves itself into cgroup.procs before it execs, keeping its pid
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    cap = cgroup.MemoryCap.create("bench", 5 << 29, root=tmp_path)
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+memory"
    assert (cap.path / "memory.max").read_text() == str(5 << 29)
    code = "import os; print(os.getpid())"
    proc = subprocess.run(cap.command([sys.executable, "-c", code]), capture_output=True, text=True, check=True)
    assert (cap.path / "cgroup.procs").read_text().split() == [proc.stdout.strip()]
    (cap.path / "memory.peak").write_text("123456\n")
    assert cap.peak_bytes() == 123456
    # where the cap's memory sits: polled while the command runs, the sample at the group's highest use kept
    (cap.path / "memory.stat").write_text("anon 100\nfile 300\nkernel 7\nshmem 200\nactive_file 50\npgfault 9\n")
    with cgroup.StatPoller(cap, interval_s=0.01) as poller:
        while poller.at_peak is None:
            pass
        (cap.path / "memory.stat").write_text("anon 10\nfile 30\n")               # lower use later: not kept
        time.sleep(0.05)
    assert poller.at_peak == {"anon": 100, "file": 300, "kernel": 7, "shmem": 200, "active_file": 50}
    r = {"cgroup_stat": {"anon": 1 << 30, "file": 3 << 30, "shmem": 2 << 30, "active_file": 1 << 29, "kernel": 1 << 25}}
    assert "anonymous 1.00 GiB, page cache 3.00 GiB (of which shared memory, the RAM cache: 2.00 GiB" in \
        cap_stat_lines(r)[0]
    assert cap_stat_lines({"cgroup_stat": None}) == []


def test_bench_regime_falls_back_to_budgets_and_says_so(tiny_olmoe, no_cgroup_here, tmp_path, capsys):
    flags = ["--preset", tiny_olmoe, "--device", "cpu", "--prompt-tokens", "24", "--new-tokens", "6", "--dtype",
             "float32", "--vram-budget", "1GB"]
    base = ["--out", str(tmp_path / "out"), "--work-dir", str(tmp_path)]
    assert bench_main([*base, "regime", "--regime", "fits-vram-ram", "--json", "--", *flags]) == 0
    r = json.loads(capsys.readouterr().out)            # after the regime's one line
    cap = r["regime"]["memory_cap"]
    assert r["regime"]["name"] == "fits-vram-ram" and cap["method"] == "budgets only"
    assert "not a cgroup v2 hierarchy" in cap["why"]
    assert r["ram_cache_bytes"] == 2 << 30                      # half the 4 GiB cap
    assert r["warm_prefill_tok_s"] > 0 and r["warm_ttft_s"] > 0 and r["ttft_s"] > 0
    assert set(r["decode_bytes_per_token"]) == {"disk", "h2d", "cpu", "gpu_reads"}
    assert r["cgroup_stat"] is None
    text = "\n".join(regime_stage.regime_lines(r))
    assert "memory cap: budgets only (" in text and "RAM cache 2.00 GiB" in text
    assert (tmp_path / "out" / "bench.log").read_text().startswith("===== sluice bench --preset tiny-olmoe")


# ---- llama-bench's output -----------------------------------------------------------------------------------

def _as_json_array(rows: list[dict]) -> str:
    """llama-bench's json_printer layout: '[', one indented object per test, ']'."""
    objs = ["  {\n" + ",\n".join(f'    "{k}": {json.dumps(v)}' for k, v in row.items()) + "\n  }" for row in rows]
    return "[\n" + ",\n".join(objs) + "\n]\n"


def test_llama_bench_output_is_read_in_each_format():
    text = SAMPLE.read_text()
    rows = parse_llama_bench(text)
    assert [(r["n_prompt"], r["n_gen"]) for r in rows] == [(512, 0), (0, 64)]
    s = summarize(rows)
    assert s["prefill_tok_s"] == pytest.approx(1643.995) and s["prefill_tokens"] == 512
    assert s["decode_tok_s"] == pytest.approx(120.302) and s["n_cpu_moe"] == 9
    assert s["model_size_bytes"] == 7355445248 and s["gpu_info"] == "NVIDIA H200"
    assert summarize(parse_llama_bench(_as_json_array(rows))) == s
    # stopped during the decode test: the prefill row is kept, decode is unknown
    partial = summarize(parse_llama_bench(text.splitlines()[0] + "\n" + text.splitlines()[1][:300]))
    assert partial["prefill_tok_s"] == pytest.approx(1643.995) and partial["decode_tok_s"] is None
    array_cut = _as_json_array(rows)
    partial = summarize(parse_llama_bench(array_cut[:array_cut.index('"n_gen": 64') + 5]))
    assert partial["prefill_tok_s"] == pytest.approx(1643.995) and partial["decode_tok_s"] is None
    assert parse_llama_bench("") == []


def test_nvidia_smi_compute_apps_are_read_per_process():
    text = "4242, 4301\n977, 512\n1234, [N/A]\n"
    assert parse_compute_apps(text, 4242) == (4301 << 20, (4301 + 512) << 20)
    assert parse_compute_apps(text, 5) == (None, (4301 + 512) << 20)
    assert parse_compute_apps("No running processes found\n", 5) == (None, 0)


def _run(ncmoe, decode, prefill, vram, below=None):
    return {"ncmoe": ncmoe, "decode_tok_s": decode, "prefill_tok_s": prefill, "vram_driver_bytes": vram,
            "decode_tok_s_below": below}


def test_best_ncmoe_is_the_fastest_within_the_vram_limit():
    runs = [_run(8, 130.0, 1700.0, 4.6e9), _run(9, 120.3, 1644.0, 4.2e9), _run(12, 95.0, 1500.0, 3.1e9)]
    assert peer.best_run(runs, int(4.3e9))["ncmoe"] == 9
    assert peer.best_run(runs, int(3e9)) is None
    result = {"runs": runs, "vram_limit_bytes": int(4.3e9), "best": runs[1]}
    x = ratios({"decode_tok_s": 240.6, "prefill_tok_s": 822.0, "warm_prefill_tok_s": 3288.0}, result)
    assert x["ncmoe"] == 9 and x["decode"] == pytest.approx(2.0)
    assert x["warm_prefill_vs_pp"] == pytest.approx(2.0) and x["cold_prefill_vs_pp"] == pytest.approx(0.5)
    # exceeds: every run stopped before its decode finished; a lower bound from the slowest-possible speed
    stopped = [_run(13, None, 90.0, 1.9e9, below=0.25), _run(16, None, 80.0, 1.2e9, below=0.2)]
    x = ratios({"decode_tok_s": 5.0, "prefill_tok_s": 95.0}, {"runs": stopped, "vram_limit_bytes": 2e9, "best": None})
    assert x["decode_at_least"] == pytest.approx(20.0) and "decode" not in x


# ---- the peer end to end, with a stand-in llama-bench ----------------------------------------------------------

def _fake_llama_bench(tmp_path: Path, decode_sleep_s: float) -> Path:
    """An executable that answers like llama-bench -o jsonl: the sample's prefill line, then (after a while) its
    decode line, with -ncmoe echoed into the rows."""
    exe = tmp_path / "llama-bench"
    exe.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys, time
        ncmoe = sys.argv[sys.argv.index("-ncmoe") + 1]
        assert sys.argv[sys.argv.index("-o") + 1] == "jsonl"
        pp, tg = open({str(SAMPLE)!r}).read().splitlines()
        print(pp.replace('"n_cpu_moe": 9', '"n_cpu_moe": ' + ncmoe), flush=True)
        time.sleep({decode_sleep_s})
        print(tg.replace('"n_cpu_moe": 9', '"n_cpu_moe": ' + ncmoe), flush=True)
        """))
    exe.chmod(0o755)
    return exe


def test_peer_run_in_a_capped_regime_without_cgroup(no_cgroup_here, tmp_path):
    exe = _fake_llama_bench(tmp_path, decode_sleep_s=0.1)
    row = peer.run_peer(exe, tmp_path / "m.gguf", 9, REGIMES["fits-vram-ram"], n_prompt=512, log_dir=tmp_path)
    assert row["decode_tok_s"] == pytest.approx(120.302) and row["prefill_tok_s"] == pytest.approx(1643.995)
    assert row["ncmoe"] == 9 and row["n_cpu_moe"] == 9 and not row["timed_out"] and row["returncode"] == 0
    assert row["memory_cap_bytes"] is None and "not a cgroup v2 hierarchy" in row["memory_cap_note"]
    assert row["argv"][row["argv"].index("-p") + 1] == "512" and row["argv"][row["argv"].index("-n") + 1] == "64"
    assert row["argv"][row["argv"].index("-lzm") + 1] == "on"           # an n-gram table read by row, as Sluice does
    assert "decode 120.30 tok/s" in peer.peer_line(row)


def test_peer_run_stopped_at_its_timeout_gives_a_decode_bound(no_cgroup_here, tmp_path):
    exe = _fake_llama_bench(tmp_path, decode_sleep_s=30)
    row = peer.run_peer(exe, tmp_path / "m.gguf", 16, REGIMES["exceeds"], n_prompt=512, timeout_s=1.5, log_dir=tmp_path)
    assert row["timed_out"] and row["decode_tok_s"] is None and row["prefill_tok_s"] == pytest.approx(1643.995)
    assert row["n_gen"] == 16 and row["reps"] == 1                    # exceeds: fewer tokens, one repetition
    assert 16 / 2.5 < row["decode_tok_s_below"] < 16 / 0.5            # 16 tokens not done in the ~1.4 s left
    assert "< " in peer.peer_line(row) and "stopped at the timeout" in peer.peer_line(row)


def test_bench_runs_llama_bench_beside_sluice(tiny_olmoe, no_cgroup_here, tmp_path, capsys):
    exe = _fake_llama_bench(tmp_path, decode_sleep_s=0)
    gguf = tmp_path / "given.gguf"
    gguf.write_bytes(b"GGUF")
    flags = ["--preset", tiny_olmoe, "--device", "cpu", "--prompt-tokens", "24", "--new-tokens", "6", "--dtype",
             "float32", "--ram-cache", "1GB", "--vram-budget", "1GB"]
    argv = ["--out", str(tmp_path), "--work-dir", str(tmp_path), "regime", "--regime", "fits-ram", "--llama-bench",
            str(exe), "--llama-gguf", str(gguf), "--llama-ncmoe", "1", "2"]
    assert bench_main([*argv, "--", *flags]) == 0
    text = capsys.readouterr().out
    assert "llama.cpp    llama.cpp fits-ram -ncmoe 1: decode 120.30 tok/s, pp512 1644.0 tok/s" in text
    assert "vs llama.cpp Sluice / llama.cpp (best -ncmoe within 1.00 GB: 1): decode " in text
    assert (tmp_path / f"{tiny_olmoe}-hf" / "config.json").is_file()     # Sluice ran the same HF checkpoint's repack
    assert bench_main([*argv, "--json", "--", *flags]) == 0
    r = json.loads(capsys.readouterr().out)
    assert [run["ncmoe"] for run in r["llama_cpp"]["runs"]] == [1, 2]
    assert r["llama_cpp"]["ratio"]["decode"] == pytest.approx(r["steady_decode"]["tok_s"] / 120.302)
    assert r["llama_cpp"]["ratio"]["first_reply_decode"] == pytest.approx(r["decode_tok_s"] / 120.302)
    assert r["model_dir"].endswith("-repacked")


def test_regime_says_when_llama_bench_is_missing(tmp_path, capsys):
    argv = ["--out", str(tmp_path), "regime", "--regime", "fits-ram", "--llama-bench", str(tmp_path / "nope"), "--",
            "--preset", "olmoe-1b-7b", "--device", "cpu"]
    assert bench_main(argv) == 2
    assert "is not a file: give the path of llama.cpp's llama-bench" in capsys.readouterr().err


# ---- alternated runs --------------------------------------------------------------------------------------------

def test_ab_variants_become_set_flags_and_the_trees_run_last(tmp_path):
    args = argparse.Namespace(variant=["-", "prefetch_reads=2 ram_fill=false"], tree=[tmp_path, tmp_path / "b"])
    assert ab.variants(args) == [("defaults", [], None),
                                 ("prefetch_reads=2 ram_fill=false", ["--set", "prefetch_reads=2", "--set", "ram_fill=false"], None),
                                 (f"tree {tmp_path}", [], tmp_path.resolve()),
                                 (f"tree {tmp_path / 'b'}", [], (tmp_path / "b").resolve())]
    assert ab.variants(argparse.Namespace(variant=[], tree=[])) == [("defaults", [], None)]


def test_ab_alternates_settings_through_sluice_bench(tiny_olmoe, tmp_path, capsys):
    flags = ["--preset", tiny_olmoe, "--device", "cpu", "--prompt-tokens", "16", "--new-tokens", "4", "--dtype",
             "float32", "--vram-budget", "1GB", "--ram-cache", "1GB"]
    argv = ["--out", str(tmp_path / "out"), "--work-dir", str(tmp_path), "ab", "--rounds", "2", "--variant", "-",
            "--variant", "prefetch_reads=0", "--"]
    assert bench_main(argv + flags) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("round ")]
    assert [line.split(":")[0] for line in lines] == ["round 1 [defaults]", "round 1 [prefetch_reads=0]",
                                                      "round 2 [prefetch_reads=0]", "round 2 [defaults]"]   # ABBA
    assert all(" tok/s (" in line and "VRAM hits" in line for line in lines)
    runs = json.loads((tmp_path / "out" / "ab.json").read_text())
    assert [r["result"]["settings"] for r in runs] == [[], ["prefetch_reads=0"], ["prefetch_reads=0"], []]
    (tmp_path / "out" / "ab.json").unlink()
    assert bench_main(argv[:-1] + ["--variant", "prefetch=2", "--"] + flags) == 2    # a typo: one sentence, no run
    err = capsys.readouterr().err
    assert "'prefetch=2' is not an option setting" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "ab.json").exists()


def test_bench_tree_is_found_from_the_repository_root(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0
    stages = [line.split()[0] for line in proc.stdout.splitlines()           # a help line wrapped: more indent
              if line.startswith("    ") and not line.startswith("     ")]
    assert stages[:3] == ["kernels", "prefill-kernel", "gpu-tests"] and len(set(stages)) <= 13


# ---- the converter (needs the llama.cpp tree: bench/fetch_llamacpp.sh) ------------------------------------------

LLAMA_SRC = ROOT / "peer" / "llama.cpp"


@pytest.mark.skipif(not (LLAMA_SRC / "convert_hf_to_gguf.py").is_file(), reason="no llama.cpp tree (fetch_llamacpp.sh)")
def test_random_checkpoint_converts_to_q8_gguf_without_a_tokenizer(tiny_olmoe, tmp_path):
    from bench.llamacpp import convert_preset, gguf_path
    out = convert_preset(tiny_olmoe, tmp_path, LLAMA_SRC, "cpu", log=lambda m: None)
    assert out == gguf_path(tmp_path, tiny_olmoe) and out.is_file()
    sys.path.insert(0, str(LLAMA_SRC / "gguf-py"))
    try:
        import gguf
        reader = gguf.GGUFReader(str(out))
    finally:
        sys.path.remove(str(LLAMA_SRC / "gguf-py"))
    assert reader.fields["tokenizer.ggml.model"].contents() == "no_vocab"
    assert reader.fields["olmoe.vocab_size"].contents() == 320
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.1.ffn_gate_exps.weight"] == "Q8_0" and types["blk.0.ffn_down_exps.weight"] == "Q8_0"


def test_a_regime_on_a_simulated_slower_link_says_so(tiny_olmoe, no_cgroup_here, tmp_path, capsys):
    """`--copy-rate-gbps` reaches the engine through the regime stage: the roofline's copy term is the simulated
    link's, and the report and the summary line say the copies were paced."""
    flags = ["--preset", tiny_olmoe, "--quant", "bf16", "--device", "cpu", "--prompt-tokens", "16", "--new-tokens",
             "4", "--dtype", "float32", "--vram-budget", "1GB", "--copy-rate-gbps", "0.5"]
    base = ["--out", str(tmp_path / "out"), "--work-dir", str(tmp_path)]
    assert bench_main([*base, "regime", "--regime", "fits-ram", "--json", "--", *flags]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["copy_pacing"]["rate_gbps"] == 0.5 and r["bandwidth_gbps"]["h2d"] <= 0.5
    assert 0 < r["copy_pacing"]["copied_gbps"] <= 0.5 * 1.05             # the copies really ran at the link's rate
    assert any("paced to 0.5 GB/s" in w for w in r["warnings"])
    assert "SIMULATED LINK: copies into the slots paced to 0.5 GB/s" in report(r)
    assert summary_line(r).endswith("| copies paced to 0.5 GB/s")
