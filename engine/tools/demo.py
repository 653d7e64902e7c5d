"""Small random-weight MoE models of real architectures, built with `transformers`.

Used by the built-in demo (the app's first-run page: try the streaming machinery without a
download; the model produces noise) and by the tests as the reference checkpoint.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_CORPUS_WORDS = ("the quick brown fox jumps over the lazy dog while experts stream from disk into memory "
                 "a mixture of experts routes every token to a few experts per layer and the cache keeps "
                 "hot experts close to the compute units so that decoding stays fast on ordinary computers "
                 "hello world python code def return import class print for while if else true false none "
                 "über café naïve straße日本語 中文 emoji 🙂 🚀 ✨ résumé façade").split()
COMMON = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=None, bos_token_id=None,
              pad_token_id=None, rms_norm_eps=1e-6)
FAMILY_KWARGS = {
    "qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32),
    "olmoe": dict(num_experts=8, num_experts_per_tok=2, intermediate_size=32),
    "qwen2_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64, qkv_bias=True),
    # Every quirk on: sinks, q/k/v/o and expert biases, a window shorter than the test prompts on
    # alternate layers, yarn that changes the frequencies in range, a clamp limit the activations reach.
    "gpt_oss": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=64, sliding_window=8,
                    swiglu_limit=1.5, rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0,
                                                       "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                                       "original_max_position_embeddings": 64}),
}
# DeepSeek-style families with every quirk on: a dense first layer, shared experts, more than one
# expert group, YaRN with mscale, partial rotary, QK norm, attention biases (engine.model.families.deepseek_style).
_MLA = dict(num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
            head_dim=8, moe_intermediate_size=32, n_shared_experts=2, first_k_dense_replace=1)
_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 64,
         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}
_DSA = dict(n_routed_experts=16, num_experts_per_tok=3, q_lora_rank=24, n_group=4, topk_group=2,
            routed_scaling_factor=2.5, norm_topk_prob=True, index_topk=6, index_head_dim=16, index_n_heads=8)
FAMILY_KWARGS.update({
    "deepseek_v2": dict(_MLA, n_routed_experts=16, num_experts_per_tok=3, q_lora_rank=24, topk_method="group_limited_greedy",
                        n_group=4, topk_group=2, routed_scaling_factor=1.5, rope_parameters=_YARN),
    "deepseek_v3": dict(_MLA, n_routed_experts=16, num_experts_per_tok=3, q_lora_rank=24, n_group=4, topk_group=2,
                        routed_scaling_factor=2.5, norm_topk_prob=True, rope_parameters=_YARN),
    "glm4_moe": dict(n_routed_experts=16, num_experts_per_tok=3, moe_intermediate_size=32, n_shared_experts=1,
                     first_k_dense_replace=1, n_group=4, topk_group=2, routed_scaling_factor=2.5, use_qk_norm=True,
                     attention_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                           "partial_rotary_factor": 0.5}),
    "glm4_moe_lite": dict(_MLA, n_routed_experts=16, num_experts_per_tok=3, q_lora_rank=24, n_group=4, topk_group=2,
                          routed_scaling_factor=1.8, norm_topk_prob=True),
    "minimax_m2": dict(num_local_experts=16, num_experts_per_tok=3, intermediate_size=32,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    # a window shorter than the test prompts on the layers from max_window_layers on
    "dots1": dict(n_routed_experts=16, num_experts_per_tok=3, moe_intermediate_size=32, n_shared_experts=1,
                  first_k_dense_replace=1, n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
                  attention_bias=True, sliding_window=8, max_window_layers=2),
    # DeepSeek Sparse Attention: an indexer that keeps fewer keys than the tests' context, so its selection decides;
    # 8 indexer heads (a key scores exactly 0, a tie, only where every head's relu is 0); GLM-5 with a layer that
    # reuses the previous indexer's selection
    "deepseek_v32": dict(_MLA, **_DSA, rope_parameters=_YARN),
    "glm_moe_dsa": dict(_MLA, **_DSA, indexer_types=["full", "shared", "full"]),
    # ERNIE-4.5's defaults: tied embeddings, a dense first layer; its own names for the MoE sizes
    "ernie4_5_moe": dict(moe_num_experts=16, moe_k=3, moe_intermediate_size=32, moe_num_shared_experts=1,
                         moe_layer_start_index=1, tie_word_embeddings=True),
})


def train_tiny_tokenizer(dst_dir: str | Path):
    """A byte-level BPE trained offline, with a ChatML template; saved into dst_dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    lines = [" ".join(_CORPUS_WORDS[i:] + _CORPUS_WORDS[:i]) for i in range(len(_CORPUS_WORDS))]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None, chat_template=CHAT_TEMPLATE)
    fast.save_pretrained(str(dst_dir))
    return fast


def build_hf_model(family: str, dst_dir: str | Path, seed: int = 0, num_layers: int = 3,
                   weight_std: float = 0.25, dtype: str = "bfloat16", with_tokenizer: bool = True,
                   **overrides) -> Path:
    """Build a random-weight `family` model and save it as a Hugging Face snapshot in dst_dir.

    Weights are drawn with std `weight_std` (larger than the default 0.02) so that top-1 logits are
    well separated and greedy comparisons with the reference are not decided by rounding noise.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dst = Path(dst_dir)
    dst.mkdir(parents=True, exist_ok=True)
    vocab_size = 512
    if with_tokenizer:
        vocab_size = len(train_tiny_tokenizer(dst))
    kwargs = {**COMMON, **FAMILY_KWARGS.get(family, {}), "num_hidden_layers": num_layers, "vocab_size": vocab_size,
              **overrides}
    config = AutoConfig.for_model(family, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    randomize_weights(model, weight_std)
    model.to(getattr(torch, dtype)).save_pretrained(str(dst))
    return dst


def randomize_weights(model, weight_std: float = 0.25) -> None:
    """Weights that make a tiny model's tokens depend on every piece: norms near 1, small biases, matrices scaled
    to their fan-in, and the routers' selection-only correction bias (zero at init) non-zero."""
    import torch
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):                 # a LayerNorm's too (DSA's indexer keys: one shared offset
                param.copy_(0.1 * torch.randn_like(param))     # near 1 would zero most of their scores, ties)
            elif "norm" in name and param.dim() == 1:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.copy_(torch.randn_like(param) * weight_std * (64 / param.shape[-1]) ** 0.5)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.5 * torch.randn_like(buffer))


def write_mxfp4_checkpoint(src_dir: str | Path, dst_dir: str | Path) -> Path:
    """A gpt-oss snapshot with its experts stored as the Hub ships them: `*_blocks` uint8
    [E, out, in/32, 16] and `*_scales` uint8 (e8m0) [E, out, in/32] (rows in the fused order, gate
    and up interleaved), with the quantization_config transformers reads. Other tensors are copied."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    from engine.format.quant import quantize_mxfp4

    src, dst = Path(src_dir), Path(dst_dir)
    dst.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name != "config.json":
            shutil.copy2(path, dst / path.name)
    tensors = load_file(str(src / "model.safetensors"))
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        fused = tensors.pop(name)                                   # [E, in, out] as transformers holds it
        parts = [quantize_mxfp4(fused[e].float().T) for e in range(fused.shape[0])]   # [out, in] each
        tensors[name + "_blocks"] = torch.stack([p["w"].reshape(p["w"].shape[0], -1, 16) for p in parts])
        tensors[name + "_scales"] = torch.stack([p["scale"] for p in parts])
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


DEMO_NAME = "Sluice demo (random weights, produces noise)"
DEMO_DIR_NAME = "sluice-demo-random-moe"        # its folder in the models folder (the app's and `sluice demo`'s)
DEMO_CONTEXT_TOKENS = 4096      # holds a real multi-turn chat: several exchanges of 512-token answers
# Budgets that make the demo really stream, so its panels show hits and misses: 6 device slots per bank
# and a 32-block RAM cache, against its 64 experts (tests/app/test_demo_model.py checks these numbers).
DEMO_LOAD_OPTIONS = {"vram_budget": 5_060_000, "ram_cache": 400_000, "max_context": DEMO_CONTEXT_TOKENS}


def build_demo_model(dst_dir: str | Path, progress=None) -> Path:
    """Build the demo model (a tiny random qwen3_moe) and repack it into the Sluice model dir dst_dir."""
    from engine.format.repack import repack

    dst = Path(dst_dir)
    check_demo_folder(dst)                  # before building: a wrong folder is one sentence, not a wasted build
    with tempfile.TemporaryDirectory(prefix="sluice-demo-") as tmp:
        if progress:
            progress(0, 1, "Building a small random-weight model")
        build_hf_model("qwen3_moe", tmp, num_layers=4, num_experts=16, num_experts_per_tok=4,
                       max_position_embeddings=DEMO_CONTEXT_TOKENS)
        _mute_unprintable_tokens(Path(tmp))
        repack(tmp, dst, quant="bf16", progress=progress, display_name=DEMO_NAME)
    return dst


def check_demo_folder(dst: Path) -> None:
    """Raises SluiceError (or OSError) unless dst can take the demo model: a new or empty folder."""
    from engine.format.repack import check_destination
    dst.parent.mkdir(parents=True, exist_ok=True)
    check_destination(dst)
    dst.mkdir(exist_ok=True)            # a place no folder can be made in fails here, before the build


def is_demo_model(model_dir: str | Path) -> bool:
    """Whether model_dir holds the demo model (its manifest's name)."""
    import json
    try:
        manifest = json.loads((Path(model_dir) / "sluice.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("name") == DEMO_NAME


def demo_load_options(model_dir: str | Path) -> dict:
    """engine.load options for the demo model (its budgets and context), {} for any other model."""
    return dict(DEMO_LOAD_OPTIONS) if is_demo_model(model_dir) else {}


_PRINTABLE_LOGIT_SCALE = 3.0


def _mute_unprintable_tokens(model_dir: Path) -> None:
    """Zero the output rows of tokens that are half a character or a control byte on their own.

    Noise is what the demo promises, but noise made of '\ufffd' looks like a bug; with a zero row
    such a token's logit is 0, and the printable rows, scaled, put the top logits far enough above it that even
    temperature 1 does not sample it (unscaled, one token in ten was muted at temperature 1).
    """
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    head = tensors["lm_head.weight"]
    for token_id in range(min(len(tok), head.shape[0])):
        text = tok.decode([token_id])
        if "\ufffd" in text or not (text.isprintable() or text == "\n") or token_id in tok.all_special_ids:
            head[token_id] = 0
    head *= _PRINTABLE_LOGIT_SCALE
    save_file(tensors, str(path), metadata={"format": "pt"})


def remove_tree(path: str | Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
