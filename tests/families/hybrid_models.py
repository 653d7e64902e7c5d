"""Small random Gated-DeltaNet hybrids with every quirk on, saved as Hugging Face snapshots.

qwen3_next: layers from full_attention_interval=2 (DeltaNet, attention, ...), a dense-MLP layer
(mlp_only_layers), 2 key heads serving 4 value heads, key dim != value dim, partial rotary.
qwen3_5_moe: the multimodal checkpoint (a small vision tower the engine must skip), layer_types
listed explicitly. Zero-centred norms ((1 + w)) get small random w; A_log, dt_bias and the DeltaNet's
gated norm are randomised so every path of the gating is exercised.
"""
from __future__ import annotations

from pathlib import Path

import torch

TEXT = dict(vocab_size=400, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
            linear_conv_kernel_dim=4, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
            eos_token_id=None, bos_token_id=None, pad_token_id=None,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
QWEN3_NEXT = dict(TEXT, num_hidden_layers=4, full_attention_interval=2, mlp_only_layers=[2], intermediate_size=64)
QWEN3_5_TEXT = dict(TEXT, num_hidden_layers=4,
                    layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"])
VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=8)


def build_hybrid(family: str, dst: str | Path, seed: int = 0, with_tokenizer: bool = False) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    if with_tokenizer:
        from engine.tools.demo import train_tiny_tokenizer
        train_tiny_tokenizer(dst)
    if family == "qwen3_next":
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3_next", **QWEN3_NEXT))
    else:
        config = AutoConfig.for_model("qwen3_5_moe", text_config=QWEN3_5_TEXT, vision_config=VISION)
        model = AutoModelForImageTextToText.from_config(config)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(_random_like(name, param))
    model.eval().to(torch.bfloat16).save_pretrained(str(dst))
    return dst


def _random_like(name: str, param: torch.Tensor) -> torch.Tensor:
    if name.endswith("linear_attn.norm.weight"):                  # plain-weight gated norm
        return 1.0 + 0.2 * torch.randn_like(param)
    if "norm" in name and param.dim() == 1:                        # (1 + w) norms: w near 0
        return 0.2 * torch.randn_like(param)
    if name.endswith("A_log"):
        return torch.empty_like(param).uniform_(0.3, 6.0).log()
    if name.endswith("dt_bias"):
        return 0.5 * torch.randn_like(param)
    if name.endswith("bias"):
        return 0.1 * torch.randn_like(param)
    fan_in = param[0].numel() if param.dim() > 1 else param.shape[-1]
    return torch.randn_like(param) * 0.25 * (64 / fan_in) ** 0.5
