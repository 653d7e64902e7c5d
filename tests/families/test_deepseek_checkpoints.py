"""DeepSeek-V3-style checkpoints as they ship: block-FP8 weights whose edge blocks are partial, and a
multi-token-prediction layer after the last decoder layer, which repack skips."""
import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import engine
from engine import GenerationParams
from engine.errors import SluiceError
from engine.format.checkpoint import dequantize_fp8_blocks
from engine.format.repack import repack
from engine.model.spec import read_spec

PROMPT = [5, 17, 42, 99, 3, 250, 7]


def to_block_fp8(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w [R, C] -> float8 weight and a float32 scale per block x block tile (edge tiles partial)."""
    rows, cols = w.shape
    grid = (-(-rows // block), -(-cols // block))
    padded = torch.zeros(grid[0] * block, grid[1] * block)
    padded[:rows, :cols] = w.float()
    tiles = padded.reshape(grid[0], block, grid[1], block)
    scale = tiles.abs().amax(dim=(1, 3)).clamp_min(1e-12) / 448
    q = (tiles / scale[:, None, :, None]).reshape(padded.shape)[:rows, :cols].to(torch.float8_e4m3fn)
    return q, scale


def from_block_fp8(q: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    rows, cols = q.shape
    padded = torch.zeros(scale.shape[0] * block, scale.shape[1] * block)
    padded[:rows, :cols] = q.float()
    tiles = padded.reshape(scale.shape[0], block, scale.shape[1], block) * scale[:, None, :, None]
    return tiles.reshape(padded.shape)[:rows, :cols]


def dequantized_copy(src, dst, block=16):
    """The same model with every block-FP8 weight dequantized to bf16 and no MTP layer: the reference's weights
    (transformers' own CPU FP8 loading refuses partial edge blocks)."""
    shutil.copytree(src, dst)
    stored = load_file(str(src / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    tensors = {n: (from_block_fp8(w, stored[n + "_scale_inv"], block) if n + "_scale_inv" in stored else w).to(torch.bfloat16)
               for n, w in stored.items() if not n.endswith("_scale_inv")
               and not n.startswith(f"model.layers.{config['num_hidden_layers']}.")}
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    del config["quantization_config"]
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def ships_in_fp8(name: str) -> bool:
    """The projections V3's release stores as block-FP8 (V3.2's indexer: wq_b and wk; its weights_proj is not)."""
    if ".indexer." in name:
        return name.endswith(("wq_b.weight", "wk.weight"))
    return name.endswith(("proj.weight", "proj_with_mqa.weight"))


def write_v3_release_like(src, dst, block=16):
    shutil.copytree(src, dst)
    tensors = {}
    for name, w in load_file(str(dst / "model.safetensors")).items():
        if ships_in_fp8(name):
            tensors[name], tensors[name + "_scale_inv"] = to_block_fp8(w, block)
        else:
            tensors[name] = w
    config = json.loads((dst / "config.json").read_text())
    last = config["num_hidden_layers"] - 1
    for name in [n for n in tensors if n.startswith(f"model.layers.{last}.")]:    # an MTP layer, as V3/R1 ship one
        tensors[name.replace(f"layers.{last}.", f"layers.{last + 1}.")] = tensors[name].clone()
    tensors[f"model.layers.{last + 1}.eh_proj.weight"] = torch.randn(64, 128).to(torch.bfloat16)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config.update(num_nextn_predict_layers=1, quantization_config={
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [block, block]})
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_v3_release_layout_repacks_without_mtp_and_matches_transformers(hf_models, tmp_path):
    from tests.engine.reference import load_reference, reference_greedy
    src = write_v3_release_like(hf_models("deepseek_v3"), tmp_path / "fp8")
    out = repack(src, tmp_path / "out")
    with safe_open(str(out / "dense.safetensors"), "pt") as f:
        assert not [n for n in f.keys() if n.startswith("model.layers.3.")]          # the MTP layer is not kept
    reference = load_reference(dequantized_copy(src, tmp_path / "dequantized"))
    eng = engine.load(out)
    ours = [e.token_id for e in eng.generate(PROMPT, GenerationParams(max_new_tokens=24, temperature=0))]
    assert ours == reference_greedy(reference, PROMPT, 24)


def test_partial_edge_blocks_dequantize_with_or_without_the_block_size():
    w = torch.randn(576, 200)                         # V3's kv_a_proj rows: 4.5 blocks of 128
    q, scale = to_block_fp8(w, 128)
    assert scale.shape == (5, 2)
    expected = dequantize_fp8_blocks(q, scale, (128, 128))
    torch.testing.assert_close(expected, w, rtol=0.07, atol=0.02)
    torch.testing.assert_close(dequantize_fp8_blocks(q, scale), expected, rtol=0, atol=0)
    with pytest.raises(SluiceError, match="does not match its 4x2 scale blocks"):
        dequantize_fp8_blocks(q, scale[:4], (128, 128))


@pytest.mark.parametrize("change,message", [
    ({"topk_method": "greedy"}, "topk_method 'greedy'"),
    ({"scoring_func": "softmax"}, "scores experts with 'softmax'"),
    ({"moe_layer_freq": 2}, "moe_layer_freq"),
])
def test_unhandled_variants_are_refused_in_one_sentence(hf_models, change, message):
    config = {**json.loads((hf_models("deepseek_v3") / "config.json").read_text()), **change}
    with pytest.raises(SluiceError, match=message):
        read_spec(config)
