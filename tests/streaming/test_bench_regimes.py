"""`sluice bench --regime` and `--llama-bench`: the regimes' budgets, the cgroup cap and its fallback, reading
llama-bench's output (a sample in its jsonl format, tests/streaming/data), and the peer run end to end with a
stand-in llama-bench executable (CPU, tiny preset)."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.errors import SluiceError
from engine.tools import bench_regime, cgroup, peer, presets
from engine.tools.bench import _extra_args, report
from engine.tools.bench_peer import ratios
from engine.tools.cli import build_parser, main
from engine.tools.llamacpp import parse_compute_apps, parse_llama_bench, summarize
from engine.tools.regimes import REGIMES, describe, regime, regime_budgets

SAMPLE = Path(__file__).parent / "data" / "llama_bench_olmoe_ncmoe9.jsonl"
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
    monkeypatch.setattr(bench_regime, "drop_page_cache", lambda: False)
    monkeypatch.setattr(peer, "drop_page_cache", lambda: False)


# ---- regimes -----------------------------------------------------------------------------------------------

def test_regime_option_is_parsed_and_checked():
    assert _extra_args(["--regime", "exceeds"]).regime == "exceeds"
    assert _extra_args([]).regime is None
    with pytest.raises(SystemExit) as exc:
        _extra_args(["--regime", "fits-everything"])
    assert exc.value.code == 2
    with pytest.raises(SluiceError, match="Unknown regime 'nope': choose one of fits-ram, fits-vram-ram, exceeds"):
        regime("nope")


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


def test_child_bench_gets_the_same_settings(tmp_path):
    argv = ["bench", "--preset", "olmoe-1b-7b", "--quant", "nvfp4", "--prompt-tokens", "512", "--new-tokens", "64",
            "--vram-budget", "3GB", "--regime", "exceeds", "--eager", "--llama-bench", "/x/llama-bench",
            "--dense-quant", "int8", "--dtype", "float32", "--keep-page-cache", "--via-repack", "--top-k", "40",
            "--top-p", "0.95"]
    args, extra = build_parser().parse_known_args(argv)
    opts = _extra_args(extra)
    child = bench_regime.child_argv(args, opts, tmp_path)
    assert child[:3] == [sys.executable, "-m", "engine.tools.cli"]
    c_args, c_extra = build_parser().parse_known_args(child[3:])
    c_opts = _extra_args(c_extra)
    for name in ("preset", "quant", "device", "prompt_tokens", "new_tokens", "vram_budget", "ram_cache", "baseline"):
        assert getattr(c_args, name) == getattr(args, name), name
    assert c_args.json and c_opts.work_dir == str(tmp_path)
    parent_only = {"work_dir"} | {name for name in vars(opts) if name.startswith("llama_")}
    for name in set(vars(opts)) - parent_only:           # every bench option reaches the child
        assert getattr(c_opts, name) == getattr(opts, name), name
    assert c_opts.llama_bench is None          # the parent runs the peer, outside the child's cap


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
    code = "import json, os; from engine.tools.cgroup import own_cap; print(json.dumps([os.getpid(), own_cap()]))"
    proc = subprocess.run(cap.command([sys.executable, "-c", code]), capture_output=True, text=True, env=cap.env(),
                          cwd=Path(__file__).parents[2], check=True)
    pid, inside = json.loads(proc.stdout)
    assert (cap.path / "cgroup.procs").read_text().split() == [str(pid)]
    assert inside == {"cgroup": str(cap.path), "memory_max_bytes": 5 << 29, "this_process_inside": True}
    (cap.path / "memory.peak").write_text("123456\n")
    assert cap.peak_bytes() == 123456
    # where the cap's memory sits, as the bench reads it inside the cap at the end of its decode
    (cap.path / "memory.stat").write_text("anon 100\nfile 300\nkernel 7\nshmem 200\nactive_file 50\npgfault 9\n")
    code = "import json; from engine.tools.cgroup import own_cap_stat; print(json.dumps(own_cap_stat()))"
    proc = subprocess.run(cap.command([sys.executable, "-c", code]), capture_output=True, text=True, env=cap.env(),
                          cwd=Path(__file__).parents[2], check=True)
    assert json.loads(proc.stdout) == {"anon": 100, "file": 300, "kernel": 7, "shmem": 200, "active_file": 50}
    assert cgroup.own_cap_stat() is None                           # this process runs under no cap


def test_bench_regime_falls_back_to_budgets_and_says_so(tiny_olmoe, no_cgroup_here, tmp_path, capsys):
    argv = ["bench", "--preset", tiny_olmoe, "--device", "cpu", "--prompt-tokens", "24", "--new-tokens", "6",
            "--work-dir", str(tmp_path), "--dtype", "float32", "--regime", "fits-vram-ram", "--vram-budget", "1GB"]
    assert main(argv + ["--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    cap = r["regime"]["memory_cap"]
    assert r["regime"]["name"] == "fits-vram-ram" and cap["method"] == "budgets only"
    assert "not a cgroup v2 hierarchy" in cap["why"]
    assert r["ram_cache_bytes"] == 2 << 30                      # half the 4 GiB cap
    assert r["warm_prefill_tok_s"] > 0 and r["warm_ttft_s"] > 0 and r["ttft_s"] > 0
    assert set(r["decode_bytes_per_token"]) == {"disk", "h2d", "cpu", "gpu_reads"}
    assert set(r["warm_prefill_bytes"]) == {"disk", "h2d", "cpu"}
    text = report(r)
    assert "memory cap: budgets only (" in text and "RAM cache 2.00 GiB" in text and "prefill warm" in text


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
    argv = ["bench", "--preset", tiny_olmoe, "--device", "cpu", "--prompt-tokens", "24", "--new-tokens", "6",
            "--work-dir", str(tmp_path), "--dtype", "float32", "--vram-budget", "1GB", "--ram-cache", "1GB",
            "--llama-bench", str(exe), "--llama-gguf", str(gguf), "--llama-ncmoe", "1", "2"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "llama.cpp    llama.cpp as-given -ncmoe 1: decode 120.30 tok/s, pp512 1644.0 tok/s" in text
    assert "vs llama.cpp Sluice / llama.cpp (best -ncmoe within 1.00 GB: 1): decode " in text
    assert (tmp_path / f"{tiny_olmoe}-hf" / "config.json").is_file()     # Sluice ran the same HF checkpoint's repack
    assert main(argv + ["--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert [run["ncmoe"] for run in r["llama_cpp"]["runs"]] == [1, 2]
    assert r["llama_cpp"]["ratio"]["decode"] == pytest.approx(r["decode_tok_s"] / 120.302)
    assert r["model_dir"].endswith("-repacked")


def test_bench_says_when_llama_bench_is_missing(tiny_olmoe, tmp_path, capsys):
    argv = ["bench", "--preset", tiny_olmoe, "--device", "cpu", "--prompt-tokens", "8", "--new-tokens", "2",
            "--work-dir", str(tmp_path), "--dtype", "float32", "--llama-bench", str(tmp_path / "nope")]
    assert main(argv) == 2
    assert "is not a file: give the path of llama.cpp's llama-bench" in capsys.readouterr().err


# ---- the converter (needs the llama.cpp tree: scripts/peer/fetch_llamacpp.sh) -----------------------------------

LLAMA_SRC = Path(__file__).parents[2] / "peer" / "llama.cpp"


@pytest.mark.skipif(not (LLAMA_SRC / "convert_hf_to_gguf.py").is_file(), reason="no llama.cpp tree (fetch_llamacpp.sh)")
def test_random_checkpoint_converts_to_q8_gguf_without_a_tokenizer(tiny_olmoe, tmp_path):
    from engine.tools.llamacpp import convert_preset, gguf_path
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
