"""Validation at the edges: sampling ranges and prompt ids (one place: GenerationParams.validate),
RAM cache sizes, allocation failures, configs and checkpoints checked before "Repacked", the
estimate of an impossible quant."""
import json
import os
import shutil

import pytest

import engine
from engine.errors import SluiceError
from engine.params import GenerationParams
from engine.plan.estimate import QUANTS, Machine, estimate


@pytest.mark.parametrize("option, value, words", [
    ("--top-p", "-0.5", "top-p must be above 0"), ("--top-p", "0", "top-p must be above 0"),
    ("--top-p", "1.5", "top-p must be above 0"), ("--temperature", "nan", "temperature must be a finite"),
    ("--temperature", "inf", "temperature must be a finite"), ("--temperature", "-1", "temperature must be"),
    ("--top-k", "-1", "top-k must be"), ("--seed", str(2**64), "seed must be a whole number from 0 to 2^64-1"),
    ("--seed", "-1", "seed must be"), ("--max-new-tokens", "0", "max new tokens must be"),
])
def test_sampling_values_out_of_range_are_refused_before_loading(cli, tmp_path, option, value, words):
    code, err = cli("generate", tmp_path / "not-even-a-model", "--prompt", "hi", option, value)
    assert code == 2 and words in err and "Traceback" not in err


@pytest.mark.parametrize("ids, bad", [("1,2,999999", 999999), ("-1,2", -1), ("3,400", 400)])
def test_prompt_ids_outside_the_vocabulary_are_refused(cli, tiny_model, ids, bad):
    code, err = cli("generate", tiny_model, f"--prompt-ids={ids}", "--max-new-tokens", "1")
    assert code == 2 and f"Prompt token id {bad} is outside this model's vocabulary (ids 0 to 399)" in err


def test_the_engine_checks_what_every_caller_passes(tiny_model):
    eng = engine.load(tiny_model)
    try:
        with pytest.raises(SluiceError, match="top-p"):
            list(eng.generate([1, 2], GenerationParams(top_p=float("nan"))))
        with pytest.raises(SluiceError, match="outside this model's vocabulary"):
            list(eng.generate([1, 400], GenerationParams()))
        assert list(eng.generate([1, 399], GenerationParams(max_new_tokens=1, seed=2**64 - 1, top_k=3)))
    finally:
        eng.close()


def test_ram_cache_larger_than_the_machine_is_refused_with_the_numbers(cli, tiny_model):
    code, err = cli("generate", tiny_model, "--prompt-ids", "1,2", "--ram-cache", "1000TB")
    assert code == 2 and "A RAM cache of 909.49 TiB is larger than" in err and "GiB)" in err


def test_allocation_failure_is_a_sentence(cli, tiny_model, monkeypatch):
    """A real failed allocation (torch's CPU allocator refuses 4 EiB) during load reaches the user as a sentence."""
    import torch
    from engine.engine import Engine
    real_load = Engine.load

    def load_then_allocate(*args, **kwargs):
        eng = real_load(*args, **kwargs)
        eng.close()
        torch.empty(1 << 62, dtype=torch.uint8)
    monkeypatch.setattr(Engine, "load", load_then_allocate)
    code, err = cli("generate", tiny_model, "--prompt-ids", "1,2")
    assert code == 1 and "Sluice ran out of memory; choose a smaller RAM cache" in err and "Traceback" not in err


def write_config(snapshot, **changes):
    config = json.loads((snapshot / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (snapshot / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("changes, words", [
    ({"num_experts_per_tok": 9}, "only 8"),
    ({"num_local_experts": 0}, "num_experts is 0"),
    ({"num_attention_heads": 0}, "num_heads is 0"),
    ({"hidden_size": "sixty-four"}, "missing or wrong value"),
    ({"num_key_value_heads": 3}, "do not divide"),
    ({"rms_norm_eps": -1.0}, "rms_norm_eps"),
    ({"num_local_experts": 4}, "has shape [8, 64] but the config implies [4, 64]"),
    ({"moe_intermediate_size": 48}, "the config implies"),
    ({"vocab_size": 600}, "the config implies [600, 64]"),
    ({"num_hidden_layers": 3}, "no expert weights for layer 2"),
])
def test_inconsistent_config_is_refused_before_anything_is_written(cli, tiny_snapshot, tmp_path, changes, words):
    src = shutil.copytree(tiny_snapshot, tmp_path / "src")
    write_config(src, **changes)
    code, err = cli("repack", src, tmp_path / "out")
    assert code == 2 and words in err and "Repacked" not in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_missing_tensor_is_refused_before_anything_is_written(cli, tiny_snapshot, tmp_path):
    from safetensors.torch import load_file, save_file
    src = shutil.copytree(tiny_snapshot, tmp_path / "src")
    shard = next(src.glob("*.safetensors"))
    tensors = load_file(shard)
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    save_file(tensors, shard, metadata={"format": "pt"})
    code, err = cli("repack", src, tmp_path / "out")
    assert code == 2 and "no tensor 'model.layers.1.self_attn.k_norm.weight'" in err
    assert not (tmp_path / "out.partial").exists()


@pytest.mark.parametrize("index_text, words", [
    ("{not json", "is damaged (no readable weight_map)"),
    ('{"weight_map": {"a": 5}}', "does not name .safetensors files"),
    ('{"metadata": {}}', "no readable weight_map"),
])
def test_malformed_index_is_one_sentence(cli, tiny_snapshot, tmp_path, index_text, words):
    src = shutil.copytree(tiny_snapshot, tmp_path / "src")
    (src / "model.safetensors.index.json").write_text(index_text)
    code, err = cli("repack", src, tmp_path / "out")
    assert code == 2 and words in err


@pytest.mark.parametrize("header", [b"[1, 2]", b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 3]}}',
                                    b'{"w": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}',
                                    b'{"w": {"shape": "big", "dtype": "F32", "data_offsets": [0, 4]}}'])
def test_malformed_safetensors_header_is_one_sentence(cli, tiny_snapshot, tmp_path, header):
    src = shutil.copytree(tiny_snapshot, tmp_path / "src")
    shard = next(src.glob("*.safetensors"))
    shard.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 64)
    code, err = cli("repack", src, tmp_path / "out")
    assert code == 2 and "damaged header" in err and shard.name in err


def test_shard_that_is_a_broken_link_without_an_index(cli, tiny_snapshot, tmp_path):
    src = shutil.copytree(tiny_snapshot, tmp_path / "src")
    os.symlink(tmp_path / "gone.safetensors", src / "model-00002.safetensors")
    code, err = cli("repack", src, tmp_path / "out")
    assert code == 2 and "listed in the index" not in err and "broken link" in err


def test_a_file_given_as_a_folder(cli, tmp_path, tiny_model):
    (tmp_path / "a.txt").write_text("x")
    for args in (("generate", tmp_path / "a.txt", "--prompt", "hi"), ("repack", tmp_path / "a.txt", tmp_path / "o")):
        code, err = cli(*args)
        assert code == 2 and "is a file, not a folder" in err and "does not exist" not in err
        assert err.count("\n") == 1 and "%" not in err              # the sentence alone: no empty progress bar
    from engine.format.modeldir import open_model_dir
    with pytest.raises(SluiceError, match="is a file, not a folder"):
        open_model_dir(tiny_model / "sluice.json")


def test_impossible_quant_is_unavailable_and_the_others_are_estimated(tiny_snapshot, qtbot):
    config = json.loads((tiny_snapshot / "config.json").read_text())
    config["moe_intermediate_size"] = 40                               # nvfp4 needs widths divisible by 16
    machine = Machine("cpu", 16 << 30, 10e9, 1e9, 1 << 40)
    estimates = {q: estimate(config, 1 << 20, machine, q) for q in QUANTS}
    assert estimates["nvfp4"].verdict == "unavailable" and "divisible by 16" in estimates["nvfp4"].reason
    assert all(estimates[q].is_usable for q in ("bf16", "fp8"))
    from app.setup.quant_table import QuantTable
    table = QuantTable()
    qtbot.addWidget(table)
    table.set_estimates(estimates, preferred="nvfp4")
    assert table.quant() == "bf16"                                     # the preferred one is impossible: a usable one
    row = list(estimates).index("nvfp4")
    assert table.item(row, 5).text().startswith("unavailable: nvfp4 needs") and table.item(row, 1).text() == "—"
