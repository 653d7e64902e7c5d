"""`sluice bench` where no GPU is: one sentence saying --device cpu runs it, and a CPU report in the CPU's words."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.tools import presets
from engine.tools.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(model_type="qwen3_moe", vocab_size=300, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=16,
            num_experts_per_tok=4, max_position_embeddings=512, norm_topk_prob=True, tie_word_embeddings=False)


def _sluice(*argv: str) -> subprocess.CompletedProcess:
    """The real CLI in a child that sees no GPU, even on a machine with one."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "engine.tools.cli", *argv], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("device", [[], ["--device", "cuda"], ["--device", "cuda:0"]])
def test_bench_without_a_gpu_says_device_cpu_runs_it(device, tmp_path):
    done = _sluice("bench", "--preset", "olmoe-1b-7b", "--work-dir", str(tmp_path), *device)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith("sluice: ") and "--device cpu" in lines[0]
    assert not any(tmp_path.iterdir())                          # refused before a model was written


def test_bench_refuses_an_unknown_device_in_one_sentence(tmp_path):
    done = _sluice("bench", "--preset", "olmoe-1b-7b", "--device", "tpu", "--work-dir", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip() == "sluice: Unknown device 'tpu': use --device cuda (a GPU) or --device cpu."


def test_bench_help_has_one_options_heading():
    done = _sluice("bench", "--help")
    assert done.returncode == 0
    headings = [line for line in done.stdout.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert headings == ["options:"]
    for flag in ("--preset", "--device", "--set KEY=VALUE", "--work-dir", "--eager", "--dense-quant", "--json"):
        assert flag in done.stdout
    assert "--regime" not in done.stdout and "--device cpu runs it" in " ".join(done.stdout.split())


def test_bench_report_on_the_cpu_speaks_of_no_gpu(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(presets.PRESETS, "tiny-qwen3", TINY)
    argv = ["bench", "--preset", "tiny-qwen3", "--quant", "int8", "--device", "cpu", "--prompt-tokens", "16",
            "--new-tokens", "4", "--work-dir", str(tmp_path), "--vram-budget", "1GB", "--ram-cache", "1GB"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    text = out[out.index("tiny-qwen3 int8 on cpu"):]            # the report, after the model's build lines
    for word in ("CUDA", "HBM", "VRAM", "GPU", "h2d", "driver"):
        assert word not in text, word
    assert "slot budget 953.67 MiB" in text and "memory copy" in text and "slots peak" in text


def test_generate_takes_engine_options_and_refuses_a_bad_one(tmp_path):
    done = _sluice("generate", str(tmp_path), "--prompt-ids", "1,2", "--set", "no_such_option=1")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("sluice: 'no_such_option=1' is not an option setting: use KEY=VALUE")
