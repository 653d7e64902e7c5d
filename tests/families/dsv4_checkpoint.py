"""Small random DeepSeek-V4 checkpoints with every layer kind: sliding, CSA (indexer top-k smaller than
the entries), HCA, hash-routed and score-routed MoE layers, YaRN compress rope, non-zero sinks,
position biases, correction biases and mHC bases."""
from __future__ import annotations

from pathlib import Path

import torch

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
TINY = dict(
    vocab_size=512, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=6, num_attention_heads=4,
    num_key_value_heads=1, head_dim=32, q_lora_rank=48, num_experts_per_tok=2, n_routed_experts=8,
    partial_rotary_factor=0.25, sliding_window=8, o_groups=2, o_lora_rank=24, index_n_heads=16,
    index_head_dim=16, index_topk=2, compress_rates={CSA: 4, HCA: 8},
    layer_types=[SLIDING, CSA, HCA, CSA, HCA, SLIDING], mlp_layer_types=["hash_moe"] * 2 + ["moe"] * 4,
    hc_mult=3, swiglu_limit=1.5, routed_scaling_factor=1.5, max_position_embeddings=256,
    eos_token_id=None, bos_token_id=None, pad_token_id=None,
    rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                     "beta_fast": 32, "beta_slow": 1},
)


def tiny_config(**overrides):
    from transformers import AutoConfig
    return AutoConfig.for_model("deepseek_v4", **{**TINY, **overrides})


def randomise(model, seed: int = 0, weight_std: float = 0.25) -> None:
    """Weights large enough that greedy tokens are not decided by rounding, every bias non-zero."""
    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name and p.dim() == 1:
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith(("sinks", "position_bias", "base", "hc_base")):
                p.copy_(0.5 * noise)
            elif name.endswith(("scale", "hc_scale")):
                p.copy_(1.0 + 0.3 * noise)
            else:
                p.copy_(noise * weight_std * (64 / p.shape[-1]) ** 0.5)
        for name, b in model.named_buffers():
            if name.endswith("tid2eid"):
                rows = [torch.randperm(cfg.n_routed_experts, generator=gen)[: cfg.num_experts_per_tok]
                        for _ in range(b.shape[0])]
                b.copy_(torch.stack(rows))
            elif name.endswith("e_score_correction_bias"):
                b.copy_(0.5 * torch.randn(b.shape, generator=gen))


def tiny_model(seed: int = 0, **overrides):
    """A random DeepseekV4ForCausalLM (float32, eager) in memory."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_config(tiny_config(**overrides), attn_implementation="eager",
                                             experts_implementation="eager").eval()
    randomise(model, seed)
    return model


def build_dsv4(dst: str | Path, seed: int = 0, with_tokenizer: bool = True, **overrides) -> Path:
    """Save a tiny random model as a Hub-style snapshot (DeepSeek's tensor names, as save_pretrained writes
    them), bf16 like shipped dense weights, so a bf16 repack is lossless."""
    from engine.tools.demo import train_tiny_tokenizer
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    if with_tokenizer:
        train_tiny_tokenizer(dst)
    tiny_model(seed, **overrides).to(torch.bfloat16).save_pretrained(str(dst))
    return dst


E2M1_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _ue8m0(amax: torch.Tensor, top: float) -> torch.Tensor:
    """Power-of-two scales (as ue8m0 stores them) with amax / scale <= top."""
    return torch.exp2(torch.ceil(torch.log2(amax.clamp_min(1e-30) / top)))


def fp8_blocks(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w [R, C] -> e4m3 weight and ue8m0 scale per block x block (DeepSeek-V4's dense layout)."""
    rows, cols = w.shape
    blocks = w.float().reshape(rows // block, block, cols // block, block)
    scale = _ue8m0(blocks.abs().amax(dim=(1, 3)), 448.0)                               # [R/b, C/b]
    q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn).reshape(rows, cols)
    return q, scale.to(torch.float8_e8m0fnu)


def fp4_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [R, C] -> int8 [R, C/2] (two e2m1 codes, the low nibble first) and a ue8m0 scale per 32 of a row."""
    rows, cols = w.shape
    groups = w.float().reshape(rows, cols // 32, 32)
    scale = _ue8m0(groups.abs().amax(dim=2), 6.0)                                      # [R, C/32]
    scaled = groups / scale[..., None]
    codes = (scaled.abs()[..., None] - E2M1_MAGNITUDES).abs().argmin(dim=-1) | ((scaled < 0).long() << 3)
    codes = codes.reshape(rows, cols).to(torch.uint8)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).view(torch.int8), scale.to(torch.float8_e8m0fnu)


SHIPPED_TOP_NAMES = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight",
                     "model.hc_head.hc_fn": "hc_head_fn", "model.hc_head.hc_base": "hc_head_base",
                     "model.hc_head.hc_scale": "hc_head_scale"}


def shipped_name(name: str) -> str:
    """save_pretrained's spelling -> DeepSeek's own (no `model.` prefix), as the Hub checkpoint names tensors."""
    return SHIPPED_TOP_NAMES.get(name, name.removeprefix("model."))


def quantize_like_flash(hf_dir: Path, block: int = 16) -> Path:
    """Rewrite a tiny snapshot as DeepSeek-V4-Flash ships: DeepSeek's tensor names, FP8 linears with ue8m0
    block scales under `X.scale`, routed experts FP4 (`expert_dtype: fp4`); compressor / indexer
    projections, router, norms, mHC and embeddings stay as they are (bf16 / fp32)."""
    import json
    from safetensors.torch import load_file, save_file
    path = Path(hf_dir) / "model.safetensors"
    tensors, out = load_file(str(path)), {}
    plain = (".compressor.wkv.", ".compressor.wgate.", ".indexer.weights_proj.", "ffn.gate.")
    for name, t in tensors.items():
        name = shipped_name(name)
        if ".experts." in name and "shared" not in name:
            out[name], out[name.removesuffix("weight") + "scale"] = fp4_rows(t)
        elif name.endswith(".weight") and t.dim() == 2 and ".layers." in name and not any(p in name for p in plain):
            out[name], out[name.removesuffix("weight") + "scale"] = fp8_blocks(t, block)
        else:
            out[name] = t
    save_file(out, str(path), metadata={"format": "pt"})
    config_path = Path(hf_dir) / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [block, block], "scale_fmt": "ue8m0", "expert_dtype": "fp4"}
    config_path.write_text(json.dumps(config, indent=1))
    return Path(hf_dir)
