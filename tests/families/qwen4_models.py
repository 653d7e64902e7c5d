"""Small random qwen4_exp models (text-only and the multimodal checkpoint) with every quirk on, saved as
Hugging Face snapshots: Gated DeltaNet and QSA indexed-attention layers, 3 hyper-connection streams, PLE on
two DeltaNet layers (2- and 3-grams, 2 heads per order, tables split into 4 shards on disk), a budget of
8 tokens (2 blocks of 4) so the indexer really drops keys, top-2 of 8 experts plus a shared expert."""
from __future__ import annotations

from pathlib import Path

import torch

from tests.families.hybrid_models import VISION, _random_like

EOS = 2
TEXT = dict(vocab_size=400, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
            linear_conv_kernel_dim=4, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
            eos_token_id=EOS, bos_token_id=None, pad_token_id=None, num_hidden_layers=4,
            layer_types=["linear_attention", "indexed_attention", "linear_attention", "indexed_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            hc_count=3, hc_lowrank=8, ple_layer_ids=[1, 3], ple_embed_dim=32, ple_conv_kernel_size=4, ngram_size=3,
            heads_per_ngram=2, ngram_vocab_size_base=97, make_ngram_vocab_size_divisible_by=16, seed=1234,
            split_ngram_parts=4, indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8,
            indexer_compress_ratio=4, output_gate_type="sigmoid")


def build_qwen4(dst: str | Path, multimodal: bool = False, seed: int = 0, with_tokenizer: bool = False,
                **overrides) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    if with_tokenizer:
        from engine.tools.demo import train_tiny_tokenizer
        train_tiny_tokenizer(dst)
    text = dict(TEXT, **overrides)
    if multimodal:
        config = AutoConfig.for_model("qwen4_exp", text_config=text, vision_config=VISION)
        model = AutoModelForImageTextToText.from_config(config)
    else:
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen4_exp_text", **text))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(_random(name, param))
    model.eval().to(torch.bfloat16).save_pretrained(str(dst))
    return dst


def _random(name: str, param: torch.Tensor) -> torch.Tensor:
    if "ngram_embedding" in name:
        return torch.randn_like(param)
    if name.endswith("ple.conv1d.weight"):                    # zero at init in transformers: make it count
        return 0.5 * torch.randn_like(param)
    return _random_like(name, param)
