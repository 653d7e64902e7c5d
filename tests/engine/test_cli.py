"""The command-line contract (README.md, "Command line"), called exactly as external tests and benchmarks call it."""
import json
import subprocess
import sys
from pathlib import Path

from tests.engine.reference import load_reference, reference_greedy

SLUICE = str(Path(sys.executable).parent / "sluice")
PROMPT_IDS = [9, 8, 7, 100, 200, 300, 33, 44]


def run_sluice(*args, timeout=120):
    return subprocess.run([SLUICE, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          encoding="utf-8")


def test_generate_json_is_token_exact_and_reports_streaming(hf_models, sluice_models):
    model_dir = sluice_models("qwen2_moe", "bf16")
    total = json.loads((model_dir / "sluice.json").read_text())["experts"]["total_bytes"]
    result = run_sluice("generate", model_dir, "--prompt-ids", ",".join(map(str, PROMPT_IDS)), "--temperature", "0",
                        "--max-new-tokens", "32", "--ram-cache", total // 3, "--vram-budget", "2MB", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["token_ids"] == reference_greedy(load_reference(hf_models("qwen2_moe")), PROMPT_IDS, 32)
    tel = out["telemetry"]
    assert tel["ram_cache"]["capacity_bytes"] <= total // 3
    assert tel["ram_cache"]["misses"] > 0 and tel["ram_cache"]["evictions"] > 0
    assert tel["disk"]["bytes_read"] > 0
    assert tel["vram"]["budget_bytes"] == 2_000_000 and 0 < tel["vram"]["peak_bytes"] <= 2_000_000
    assert {"decode_tok_s", "prefill_tok_s", "ttft_s"} <= set(tel["speed"])
    assert tel["speed"]["decode_tok_s"] > 0


def test_repack_then_chat_streams_valid_utf8(hf_models, tmp_path):
    dst = tmp_path / "model-fp8"
    result = run_sluice("repack", hf_models("mixtral"), dst, "--quant", "fp8")
    assert result.returncode == 0, result.stderr
    assert json.loads((dst / "sluice.json").read_text())["quant"] == "fp8"
    result = subprocess.run([SLUICE, "generate", str(dst), "--chat", "--prompt", "Grüße aus Köln 🙂🚀 naïve café",
                             "--max-new-tokens", "40", "--temperature", "0.8", "--seed", "3"], capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    text = result.stdout.decode("utf-8")        # raises if the stream was not valid UTF-8
    assert text.strip()
    assert "decode" in result.stderr.decode()


def test_repack_int8_stores_int8_codes_and_bf16_row_scales_of_the_source(hf_models, tmp_path):
    import torch
    from safetensors import safe_open
    from engine.format.modeldir import open_model_dir
    from engine.format.quant import quantize
    src, dst = hf_models("olmoe"), tmp_path / "model-int8"
    result = run_sluice("repack", src, dst, "--quant", "int8")
    assert result.returncode == 0, result.stderr
    model = open_model_dir(dst, verify_experts=True)
    assert model.quant == "int8"
    layer, expert = model.spec.moe_layers[-1], 3
    with open(dst / "experts.bin", "rb") as f:
        f.seek(model.expert_offset(layer, expert))
        block = torch.frombuffer(bytearray(f.read(model.layout.block_bytes)), dtype=torch.uint8)
    views = model.layout.views(block)
    with safe_open(str(src / "model.safetensors"), "pt") as s:
        source = s.get_tensor(model.spec.expert_tensor_name(layer, expert, "down"))
    expected = quantize(source, "int8")
    assert views["down.w"].dtype == torch.int8 and views["down.scale"].dtype == torch.bfloat16
    assert torch.equal(views["down.w"], expected["w"]) and torch.equal(views["down.scale"], expected["scale"])


def test_quant_choices_are_the_formats():
    from engine.plan.estimate import QUANTS as ESTIMATE_QUANTS
    from engine.tools.cli import QUANTS
    from kernels.formats import FORMATS
    assert set(QUANTS) == set(FORMATS) == set(ESTIMATE_QUANTS)


def test_errors_are_one_sentence_without_traceback(tmp_path):
    result = run_sluice("generate", tmp_path / "missing", "--prompt", "hi")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "does not exist" in result.stderr


def test_every_option_has_help_and_plain_sluice_opens_the_app():
    import argparse
    from engine.tools.cli import build_parser
    parser = build_parser()
    assert "`sluice` with no command to open the desktop app" in parser.format_help()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, f"sluice {name}: {action.dest} has no help text"


def test_demo_builds_the_apps_demo_model_and_prints_a_command_that_chats_with_it(tmp_path, monkeypatch, capsys):
    import shlex
    from engine.tools.cli import main
    from engine.tools.demo import DEMO_DIR_NAME, is_demo_model
    monkeypatch.setenv("SLUICE_DATA_DIR", str(tmp_path / "data"))
    assert main(["demo"]) == 0
    out, err = capsys.readouterr()
    where = tmp_path / "data" / "models" / DEMO_DIR_NAME              # where the app's "Try the demo model" looks
    assert out == f"{where}\n" and is_demo_model(where)
    chat = next(line for line in err.splitlines() if line.startswith("Chat with it:"))
    command = shlex.split(chat.removeprefix("Chat with it:"))
    assert command[:3] == ["sluice", "generate", str(where)]
    assert main([*command[1:], "--max-new-tokens", "4"]) == 0            # the printed command, as a user runs it
    assert "[4 tokens" in capsys.readouterr().err

    assert main(["demo"]) == 0                                           # built once: found again, not rebuilt
    out, err = capsys.readouterr()
    assert out == f"{where}\n" and "Building" not in err and f"sluice serve {where}" in err


def test_demo_and_download_go_to_the_models_folder_chosen_in_the_app(tmp_path, monkeypatch, capsys):
    from app import paths
    from app.models_dir import installed_models
    from app.settings import AppSettings
    from app.store import Store
    from engine.tools.cli import main
    from engine.tools.cli_download import default_download_dir
    monkeypatch.setenv("SLUICE_DATA_DIR", str(tmp_path / "data"))
    store = Store(paths.database_path())
    settings = AppSettings(models_dir=str(tmp_path / "my models"))      # Settings -> Models folder, as saved
    settings.save(store)
    assert main(["demo"]) == 0                                          # while the app holds its database open
    built = Path(capsys.readouterr().out.strip())
    assert built.parent == tmp_path / "my models"
    assert [m.path for m in installed_models(AppSettings.load(store).models_path())] == [built]   # the app lists it
    assert default_download_dir("org/model").parent.parent == tmp_path / "my models"
    store.close()


def test_demo_names_sluice_as_the_user_can_run_it(tmp_path, monkeypatch, capsys):
    from engine.tools.cli import main
    from engine.tools.demo import build_demo_model
    build_demo_model(tmp_path / "demo")
    program = tmp_path / ".venv" / "bin" / "sluice"            # the README's install: nothing on PATH
    program.parent.mkdir(parents=True)
    program.touch()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", [str(program), "demo"])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert main(["demo", "--dir", str(tmp_path / "demo")]) == 0
    assert f".venv/bin/sluice generate {tmp_path / 'demo'}" in capsys.readouterr().err


def test_demo_into_a_wrong_folder_is_one_sentence(tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for dst, sentence in [(a_file, f"sluice: '{a_file}' is a file, not a folder; choose a new or empty destination "
                                   f"folder.\n"),
                          (tmp_path, f"sluice: '{tmp_path}' is not empty; choose a new or empty destination folder.\n"),
                          (a_file / "demo", f"sluice: Sluice could not use '{a_file}': it is a file where a folder "
                                            f"should be; move it away or choose another folder.\n")]:   # no "Building…"
        result = subprocess.run([sys.executable, "-m", "app.main", "demo", "--dir", str(dst)], capture_output=True,
                                text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
        assert (result.returncode, result.stdout, result.stderr) == (2, "", sentence)
    assert a_file.read_text() == "mine"
    if Path("/proc/self").exists():                  # a place no folder can be made in: refused before the build
        result = subprocess.run([sys.executable, "-m", "app.main", "demo", "--dir", "/proc/sluice-demo"],
                                capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
        assert result.returncode == 2 and result.stderr.count("\n") == 1 and "Building" not in result.stderr
