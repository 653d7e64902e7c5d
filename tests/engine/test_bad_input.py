"""Bad input: one clear sentence, a non-zero exit, nothing valid-looking left behind."""
import json
import shutil
import threading

import pytest

import engine
import engine.format.repack
from engine.tools.cli import main
from engine.errors import SluiceError
from engine.runtime import store
from engine.format.repack import repack


def sluice(capsys, *args) -> tuple[int, str]:
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


def test_missing_folder(capsys, tmp_path):
    code, err = sluice(capsys, "generate", tmp_path / "nope", "--prompt", "hi")
    assert code == 2 and "does not exist" in err


def test_folder_that_is_not_a_model(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    code, err = sluice(capsys, "generate", tmp_path, "--prompt", "hi")
    assert code == 2 and "no config.json" in err
    code, err = sluice(capsys, "repack", tmp_path, tmp_path / "out")
    assert code == 2 and "config.json" in err and not (tmp_path / "out").exists()


def test_unsupported_architecture_names_type_and_supported_ones(capsys, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "llama")
    code, err = sluice(capsys, "repack", tmp_path / "llama", tmp_path / "out")
    assert code == 2 and "'llama'" in err and "qwen3_moe" in err and "mixtral" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_truncated_safetensors(capsys, hf_models, tmp_path):
    src = shutil.copytree(hf_models("olmoe"), tmp_path / "src")
    shard = next(src.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    code, err = sluice(capsys, "repack", src, tmp_path / "out")
    assert code == 2 and "truncated" in err and shard.name in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("pieces", ["1", "4"])
def test_corrupted_expert_block_names_layer_and_expert(capsys, sluice_models, tmp_path, monkeypatch, pieces):
    monkeypatch.setattr(store, "READ_PIECES", int(pieces))    # read whole, or in parallel pieces
    model = shutil.copytree(sluice_models("qwen3_moe", "bf16"), tmp_path / "m")
    manifest = json.loads((model / "sluice.json").read_text())
    offset = manifest["experts"]["layers"]["1"]["offset"] + 5 * manifest["experts"]["layers"]["1"]["block_bytes"] + 100
    with open(model / "experts.bin", "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    code, err = sluice(capsys, "generate", model, "--prompt-ids", ",".join(str(i) for i in range(1, 120)),
                       "--max-new-tokens", "2")
    assert code == 2 and "Expert 5 of layer 1" in err and "corrupted" in err


def test_budget_below_minimum_says_the_minimum(capsys, sluice_models):
    model = sluice_models("qwen3_moe", "bf16")
    code, err = sluice(capsys, "generate", model, "--prompt", "hi", "--vram-budget", "100KB")
    assert code == 2 and "too small" in err and "at least" in err
    minimum = int(err.split("(")[1].split(" bytes")[0])
    eng = engine.load(model, vram_budget=minimum)              # the stated minimum really works
    assert [e for e in eng.generate([1, 2, 3], engine.GenerationParams(max_new_tokens=4, temperature=0))]
    with pytest.raises(SluiceError):
        engine.load(model, vram_budget=minimum - 1)
    code, err = sluice(capsys, "generate", model, "--prompt", "hi", "--ram-cache", "1KB")
    assert code == 2 and "RAM cache" in err and "at least" in err


def test_not_enough_disk_space_refuses_before_writing(capsys, hf_models, tmp_path, monkeypatch):
    monkeypatch.setattr(engine.format.repack, "free_bytes", lambda path: 10_000)
    code, err = sluice(capsys, "repack", hf_models("qwen3_moe"), tmp_path / "out")
    assert code == 2 and "Not enough disk space" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_interrupted_repack_resumes_without_redoing_layers(hf_models, tmp_path, monkeypatch):
    src = hf_models("qwen2_moe")
    stop = threading.Event()
    messages = []

    def stop_after_first_layer(done, total, message):
        messages.append(message)
        if message.startswith("layer"):
            stop.set()
    with pytest.raises(engine.format.repack.RepackCancelled):
        repack(src, tmp_path / "out", quant="nvfp4", progress=stop_after_first_layer, cancel_event=stop)
    assert not (tmp_path / "out").exists() and (tmp_path / "out.partial").exists()

    quantized_layers = []
    real_quantize = engine.format.repack.quantize
    monkeypatch.setattr(engine.format.repack, "quantize", lambda w, fmt: (quantized_layers.append(1), real_quantize(w, fmt))[1])
    resumed = []
    repack(src, tmp_path / "out", quant="nvfp4", progress=lambda d, t, m: resumed.append(m))
    assert "layer 0 repacked" in messages and "layer 0 repacked" not in resumed and "layer 1 repacked" in resumed
    assert len(quantized_layers) == 3 * 8 * 2        # 2 remaining layers x 8 experts x (gate, up, down)
    assert not (tmp_path / "out.partial").exists()
    reference = repack(src, tmp_path / "ref", quant="nvfp4")
    assert (tmp_path / "out" / "experts.bin").read_bytes() == (reference / "experts.bin").read_bytes()


def test_repack_refuses_to_overwrite_a_model(sluice_models, hf_models):
    with pytest.raises(SluiceError, match="already holds a Sluice model"):
        repack(hf_models("qwen3_moe"), sluice_models("qwen3_moe", "bf16"))
