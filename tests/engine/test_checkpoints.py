"""Snapshots as they come: sharded with an index, v5 fused experts, old config spellings, raw snapshot dirs."""
import json
import shutil

import torch

import engine
from engine import GenerationParams
from engine.format.repack import repack
from engine.model.spec import read_spec

PROMPT = [3, 14, 15, 92, 65, 35, 89, 79]


def greedy(model_dir, **kw):
    eng = engine.load(model_dir, **kw)
    try:
        return [e.token_id for e in eng.generate(PROMPT, GenerationParams(max_new_tokens=12, temperature=0))]
    finally:
        eng.close()


def test_sharded_checkpoint_with_index_repacks_identically(hf_models, sluice_models, tmp_path):
    from transformers import AutoModelForCausalLM
    src = hf_models("qwen3_moe")
    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.bfloat16).save_pretrained(sharded, max_shard_size="50KB")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(src / name, sharded / name)
    assert (sharded / "model.safetensors.index.json").is_file() and len(list(sharded.glob("*.safetensors"))) > 2
    out = repack(sharded, tmp_path / "out")
    assert (out / "experts.bin").read_bytes() == (sluice_models("qwen3_moe", "bf16") / "experts.bin").read_bytes()


def test_fused_v5_expert_tensors_are_read_too(hf_models, sluice_models, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file
    src = hf_models("olmoe")
    spec = read_spec(src)
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    for layer in spec.moe_layers:
        get = lambda e, p: tensors.pop(spec.expert_tensor_name(layer, e, p))  # noqa: E731
        gate_up = torch.stack([torch.cat([get(e, "gate"), get(e, "up")]) for e in range(spec.num_experts)])
        down = torch.stack([get(e, "down") for e in range(spec.num_experts)])
        tensors.update(zip(spec.fused_expert_names(layer), (gate_up, down)))
    fused = tmp_path / "fused"
    fused.mkdir()
    save_file(tensors, str(fused / "model.safetensors"))
    shutil.copy(src / "config.json", fused / "config.json")
    out = repack(fused, tmp_path / "out")
    assert (out / "experts.bin").read_bytes() == (sluice_models("olmoe", "bf16") / "experts.bin").read_bytes()


def test_old_config_spellings_mean_the_same(hf_models):
    config = json.loads((hf_models("qwen3_moe") / "config.json").read_text())
    old = dict(config)
    old["num_experts"] = old.pop("num_local_experts")
    old["rope_theta"] = old.pop("rope_parameters")["rope_theta"]
    assert read_spec(old) == read_spec(config)
    old["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    assert read_spec(old).rope_type == "linear"


def test_raw_snapshot_is_repacked_on_the_fly_into_the_cache(hf_models, sluice_models, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert greedy(hf_models("mixtral")) == greedy(sluice_models("mixtral", "bf16"))
    assert list((tmp_path / "cache").rglob("sluice.json"))


def test_bfloat16_compute_stays_close_to_float32(sluice_models):
    eng32 = engine.load(sluice_models("qwen2_moe", "bf16"))
    eng16 = engine.load(sluice_models("qwen2_moe", "bf16"), dtype="bfloat16")
    with torch.inference_mode():
        l32 = eng32.runner.prefill(PROMPT)
        l16 = eng16.runner.prefill(PROMPT)
    assert torch.isfinite(l16).all()
    assert (l16 - l32).abs().max() < 0.05 * l32.abs().max()
    assert l16.argmax() == l32.argmax()


def test_changed_snapshot_is_repacked_again(hf_models, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    src = shutil.copytree(hf_models("qwen3_moe"), tmp_path / "snap")
    before = greedy(src)
    from engine.tools.demo import build_hf_model
    build_hf_model("qwen3_moe", tmp_path / "other", seed=7)
    shutil.copy(tmp_path / "other" / "model.safetensors", src / "model.safetensors")
    after = greedy(src)
    assert after != before and after == greedy(tmp_path / "other")


def write_block_fp8_checkpoint(src, dst, block=16):
    """src's projection weights stored as float8_e4m3fn with a float32 scale per block x block tile, the way
    DeepSeek-V3 / Qwen3-FP8 checkpoints ship (`weight_scale_inv`, `quantization_config.weight_block_size`)."""
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, dst)
    tensors = {}
    for name, w in load_file(str(dst / "model.safetensors")).items():
        if name.endswith("proj.weight"):
            rows, cols = w.shape
            tiles = w.float().reshape(rows // block, block, cols // block, block)
            scale = tiles.abs().amax(dim=(1, 3)) / 448
            tensors[name] = (tiles / scale[:, None, :, None]).reshape(rows, cols).to(torch.float8_e4m3fn)
            tensors[name + "_scale_inv"] = scale
        else:
            tensors[name] = w
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [block, block]}
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_block_fp8_source_checkpoint_matches_transformers(hf_models, tmp_path):
    from transformers import AutoModelForCausalLM
    from tests.engine.reference import reference_greedy
    src = write_block_fp8_checkpoint(hf_models("qwen3_moe"), tmp_path / "fp8")
    # transformers dequantizes FP8 checkpoints to bf16 without a GPU; compare in float32 from there
    reference = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.bfloat16, experts_implementation="eager",
                                                     attn_implementation="eager").float().eval()
    assert greedy(repack(src, tmp_path / "out")) == reference_greedy(reference, PROMPT, 12)


def test_other_quantized_checkpoints_are_refused_in_one_sentence(hf_models, tmp_path):
    import pytest
    from engine.errors import SluiceError
    src = shutil.copytree(hf_models("mixtral"), tmp_path / "awq")
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(SluiceError, match="quantized with 'awq'"):
        repack(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()
