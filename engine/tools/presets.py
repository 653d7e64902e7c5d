"""Benchmark models: real architectures' dimensions with random weights (nothing can be downloaded).

Two ways to make one:
  * `write_sluice_dir`: dense.safetensors and experts.bin written directly (random valid blocks in
    the quant format; a few distinct blocks reused across (layer, expert), which changes nothing for
    reads that bypass the page cache but saves minutes of checksumming 30 GB).
  * `write_hf_checkpoint` + engine.format.repack: a Hugging Face snapshot in the Hub layout (bf16), which
    the product's repack path converts, and which the transformers/accelerate baseline loads.
"""
from __future__ import annotations

import json
import math
import os
import zlib
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.format.layout import block_layout
from engine.format.modeldir import DENSE_FILE, EXPERTS_FILE, MANIFEST, build_manifest
from engine.format.ngram import TABLE_NAME, write_tables
from engine.model.spec import read_spec

PRESETS = {
    # allenai/OLMoE-1B-7B-0924 config.json
    "olmoe-1b-7b": dict(model_type="olmoe", vocab_size=50304, hidden_size=2048, intermediate_size=1024,
                        num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16, num_experts=64,
                        num_experts_per_tok=8, max_position_embeddings=4096, rope_theta=10000.0,
                        rms_norm_eps=1e-5, norm_topk_prob=False, tie_word_embeddings=False),
    # Qwen/Qwen3-30B-A3B config.json
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                          moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                          max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False),
    # Qwen/Qwen3.5-35B-A3B config.json, text model (all 40 layers: 30 Gated DeltaNet, 10 gated attention;
    # 256 experts + 1 shared, top-8); the vision tower is not part of the benchmark
    "qwen3.5-35b-a3b": dict(model_type="qwen3_5_moe", text_config=dict(
        vocab_size=248320, hidden_size=2048, num_hidden_layers=40, full_attention_interval=4,
        num_attention_heads=16, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
        max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25})),
    # openai/gpt-oss-120b config.json with 12 of its 36 layers (the experts of each layer are its own:
    # 128 x 13.3 MB in mxfp4), so the bench's files stay under ~40 GB at fp8 and ~21 GB at mxfp4
    "gpt-oss-120b": dict(model_type="gpt_oss", vocab_size=201088, hidden_size=2880, intermediate_size=2880,
                         num_hidden_layers=12, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                         num_local_experts=128, num_experts_per_tok=4, sliding_window=128,
                         max_position_embeddings=131072, rms_norm_eps=1e-5, swiglu_limit=7.0,
                         attention_bias=True, tie_word_embeddings=False),
    # openai/gpt-oss-20b config.json, all 24 layers (32 experts a layer, 10.2 GB of mxfp4 experts)
    "gpt-oss-20b": dict(model_type="gpt_oss", vocab_size=201088, hidden_size=2880, intermediate_size=2880,
                        num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                        num_local_experts=32, num_experts_per_tok=4, sliding_window=128,
                        max_position_embeddings=131072, rms_norm_eps=1e-5, swiglu_limit=7.0,
                        attention_bias=True, tie_word_embeddings=False),
    # deepseek-ai/DeepSeek-V4-Flash's shapes (transformers' DeepseekV4Config defaults: hidden 4096, 256 experts of
    # 2048, top-6, 64 heads of 512, hc_mult 4) with 4 of its 43 layers, one of each attention kind.
    "deepseek-v4-flash-4l": dict(model_type="deepseek_v4", num_hidden_layers=4,
                                 layer_types=["sliding_attention", "compressed_sparse_attention",
                                              "heavily_compressed_attention", "compressed_sparse_attention"],
                                 mlp_layer_types=["hash_moe", "moe", "moe", "moe"], tie_word_embeddings=False),
    # Qwen/Qwen3.8-Flash-Next's text model (config.json's text_config) with its first 4 of 48 layers: Gated
    # DeltaNet, DeltaNet with PLE (its one PLE layer, ple_layer_ids [2]), DeltaNet, QSA indexed attention.
    # 512 experts of 640, top-10 + a shared expert. The n-gram table keeps its real row width (16 heads of 160)
    # and 1/20 of its rows (ngram_vocab_size_base 1e6 for 2e7): the real one is 95 GiB in bf16.
    "qwen3.8-flash-next-4l": dict(
        model_type="qwen4_exp_text", vocab_size=248320, hidden_size=2560, num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        num_attention_heads=24, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        num_experts=512, num_experts_per_tok=10, moe_intermediate_size=640, shared_expert_intermediate_size=640,
        hc_count=4, hc_lowrank=320, ple_layer_ids=[2], ple_embed_dim=2560, ple_conv_kernel_size=4, ngram_size=3,
        heads_per_ngram=8, ngram_vocab_size_base=1_000_000, make_ngram_vocab_size_divisible_by=128, seed=1234,
        split_ngram_parts=128, indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=128, indexer_budget=2048,
        indexer_compress_ratio=4, output_gate_type="sigmoid", hidden_act="silu", eos_token_id=248044,
        bos_token_id=248044, max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25}),
}
# DeepSeek-style presets (MLA, shared experts, dense first layers, grouped routers)
_DEEPSEEK_YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096,
                      beta_fast=32.0, beta_slow=1.0)
PRESETS.update({
    # deepseek-ai/DeepSeek-V2-Lite config.json (15.7B: 64 routed + 2 shared experts, top-6, MLA without q LoRA)
    "deepseek-v2-lite": dict(model_type="deepseek_v2", vocab_size=102400, hidden_size=2048, intermediate_size=10944,
                             moe_intermediate_size=1408, num_hidden_layers=27, num_attention_heads=16,
                             num_key_value_heads=16, n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6,
                             first_k_dense_replace=1, kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128,
                             qk_rope_head_dim=64, v_head_dim=128, topk_method="greedy", routed_scaling_factor=1.0,
                             max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False,
                             rope_parameters=dict(_DEEPSEEK_YARN, mscale=0.707, mscale_all_dim=0.707)),
    # deepseek-ai/DeepSeek-V3 config.json layer shapes (7168 hidden, 256 routed + 1 shared, top-8 of 4 of 8
    # groups, MLA), with 4 of its 61 layers (1 dense + 3 MoE; the full model's experts take 1.3 TB in bf16)
    "deepseek-v3-4-layers": dict(model_type="deepseek_v3", vocab_size=129280, hidden_size=7168, intermediate_size=18432,
                                 moe_intermediate_size=2048, num_hidden_layers=4, num_attention_heads=128,
                                 num_key_value_heads=128, n_routed_experts=256, n_shared_experts=1,
                                 num_experts_per_tok=8, n_group=8, topk_group=4, first_k_dense_replace=1,
                                 kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64,
                                 v_head_dim=128, routed_scaling_factor=2.5, norm_topk_prob=True,
                                 max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                 rope_parameters=dict(_DEEPSEEK_YARN, mscale=1.0, mscale_all_dim=1.0)),
    # zai-org/GLM-4.5-Air config.json (106B: 128 routed + 1 shared experts, top-8, first layer dense, partial
    # rotary); its MTP layer is left out (num_nextn_predict_layers 0): the bench decodes without it
    "glm-4.5-air": dict(model_type="glm4_moe", vocab_size=151552, hidden_size=4096, intermediate_size=10944,
                        moe_intermediate_size=1408, num_hidden_layers=46, num_attention_heads=96,
                        num_key_value_heads=8, head_dim=128, n_routed_experts=128, n_shared_experts=1,
                        num_experts_per_tok=8, first_k_dense_replace=1, n_group=1, topk_group=1,
                        norm_topk_prob=True, routed_scaling_factor=1.0, partial_rotary_factor=0.5,
                        attention_bias=True, use_qk_norm=False, num_nextn_predict_layers=0,
                        max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-5,
                        tie_word_embeddings=False),
})
# said in the bench output: how a preset differs from the real model
PRESET_NOTES = {"deepseek-v3-4-layers": "DeepSeek-V3 layer shapes with 4 of its 61 layers (1 dense + 3 MoE)",
                "gpt-oss-120b": "12 of gpt-oss-120b's 36 layers (every other dimension as released), so that "
                                "the bench's files stay under ~40 GB at fp8 and ~21 GB at mxfp4",
                "deepseek-v4-flash-4l": "DeepSeek-V4-Flash layer shapes with 4 of its 43 layers (sliding, CSA, HCA, CSA)",
                "qwen3.8-flash-next-4l": "Qwen3.8-Flash-Next layer shapes with its first 4 of 48 layers (DeltaNet, "
                                         "DeltaNet + PLE, DeltaNet, QSA) and 1/20 of its n-gram table's rows"}
# Presets with fewer layers than the model they take their shapes from: the full model's layer count, and
# what the engine the project was created from did on it (DeepSeek-V4.1-Flash: 4.2 GiB read a token;
# Qwen3.8-Flash-Next: 11.65 tok/s on an 8 GB RTX 5060, 31 GiB of RAM, a Gen5 NVMe). The full model's PLE
# layers are the preset's (Flash-Next has one), so its n-gram rows a token are the preset's, unscaled.
FULL_MODEL = {"deepseek-v4-flash-4l": {"name": "DeepSeek-V4-Flash", "num_layers": 43,
                                       "reference_bytes_per_token": 4.2 * 2**30},
              "qwen3.8-flash-next-4l": {"name": "Qwen3.8-Flash-Next", "num_layers": 48, "reference_tok_s": 11.65}}
# what turns a preset's config into its whole model's (the estimate of it: bench/stages/flash_next.py)
FULL_CONFIG = {"qwen3.8-flash-next-4l": {"num_hidden_layers": 48, "layer_types": None,
                                         "ngram_vocab_size_base": 20_000_000}}


def full_model_config(preset: str) -> dict:
    """The config of the model a preset takes its layers from (num_layers, its own layer schedule, its real tables)."""
    return {**preset_config(preset), **FULL_CONFIG[preset]}
NUM_DISTINCT_BLOCKS = 16
HF_INDEX = "model.safetensors.index.json"     # written after every shard: a checkpoint with it is complete


def preset_config(name: str) -> dict:
    from transformers import AutoConfig
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}")
    kw = dict(PRESETS[name])
    config = AutoConfig.for_model(kw.pop("model_type"), **kw).to_dict()
    config.pop("transformers_version", None)
    return config


def _dense_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Non-expert tensor names and shapes of the HF model (built on the meta device: no memory)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    cfg = AutoConfig.for_model(config["model_type"], **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    # state_dict: parameters and persistent buffers (correction biases, DeepSeek-V4's tid2eid table); the n-gram
    # tables apart (_table_shards)
    return {n: tuple(p.shape) for n, p in model.state_dict().items()
            if ".experts." not in n and not TABLE_NAME.match(n)}


def _hash_constants(config: dict) -> dict[str, torch.Tensor]:
    """A PLE layer's n-gram hash constants (int64 buffers: each n-gram order's multipliers, each head's prime vocabulary
    and its offset), as transformers computes them: a checkpoint carries them, and llama.cpp's converter reads them."""
    import sys
    from transformers import AutoConfig, AutoModelForCausalLM
    if config["model_type"] != "qwen4_exp_text" or not config.get("ple_layer_ids"):
        return {}
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **fields))
    out = {}
    for name, m in model.named_modules():
        if hasattr(m, "head_vocab_sizes") and hasattr(m, "layer_multipliers"):
            build = sys.modules[type(m).__module__]._build_layer_multipliers
            out[f"{name}.layer_multipliers"] = build(m.unigram_vocab_size, m.ngram_size, m.ple_layer_index, m.seed)
            out[f"{name}.ngram_heads_vocab_sizes"] = torch.tensor(m.head_vocab_sizes, dtype=torch.long)
            out[f"{name}.ngram_heads_offsets"] = torch.tensor(m.head_offsets, dtype=torch.long)
    return out


def _tables(config: dict) -> dict[int, tuple[int, int, int]]:
    """A PLE model's n-gram tables as the Hub splits them: {layer: (shards, rows a shard, row dim)}."""
    from engine.model.qwen4.config import read_qwen4_dims
    if config["model_type"] != "qwen4_exp_text" or not config.get("ple_layer_ids"):
        return {}
    d = read_qwen4_dims(read_spec(config).cfg)
    parts = config["split_ngram_parts"]
    return {layer: (parts, d.table_rows(i) // parts, d.row_dim) for i, layer in enumerate(d.ple_layers)}


def _table_shards(config: dict) -> dict[int, list[str]]:
    """The Hub's names of each table's shards, in order."""
    return {layer: [f"model.layers.{layer}.ple.ple_embedding.ngram_embedding.shard_{i}.weight" for i in range(parts)]
            for layer, (parts, _, _) in _tables(config).items()}


def _random_table_shard(config: dict, name: str, device, seed: int) -> torch.Tensor:
    """One shard of a table [rows, row dim], bf16 of unit size like the token embeddings (its own seed: a shard
    is written alone, never the whole table in memory)."""
    layer, shard = (int(v) for v in TABLE_NAME.match(name).groups())
    _, rows, dim = _tables(config)[layer]
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + layer * 10_007 + shard)
    return torch.randn((rows, dim), device=device, generator=gen).to(torch.bfloat16).cpu()


def _random_dense(shapes: dict, device, generator: torch.Generator, num_experts: int = 0) -> dict[str, torch.Tensor]:
    """Random dense weights that route like a trained model: token embeddings of unit size dominate
    the residual stream, so each token picks its own experts (with 0.02-std embeddings, near-uniform
    random attention adds the same vector to every token and all tokens collapse onto a few experts,
    which would make any expert cache look perfect)."""
    out = {}
    for name, shape in shapes.items():
        if name.endswith("tid2eid"):               # hash routing: each token's k distinct experts
            order = torch.rand(shape[0], num_experts, device=device, generator=generator).argsort(dim=1)
            out[name] = order[:, :shape[1]].contiguous().cpu()
            continue
        if len(shape) == 1:                                                  # norms
            t = 1.0 + 0.1 * torch.randn(shape, device=device, generator=generator)
        elif name.endswith("embed_tokens.weight"):
            t = torch.randn(shape, device=device, generator=generator)
        else:
            t = torch.randn(shape, device=device, generator=generator) * shape[-1] ** -0.5
        out[name] = t.to(torch.bfloat16).cpu()
    return out


def _begin(preset: str, dst: Path):
    """The preset's config and spec, its folder made (a writer's first step)."""
    dst.mkdir(parents=True, exist_ok=True)
    config = preset_config(preset)
    return config, read_spec(config)


def write_sluice_dir(preset: str, dst: Path, quant: str, device="cuda", seed: int = 0, progress=print) -> Path:
    """A complete Sluice model dir for `preset`, written directly (no bf16 source)."""
    from kernels.formats import random_bank
    dst = Path(dst)
    if (dst / MANIFEST).is_file():
        return dst
    config, spec = _begin(preset, dst)
    layout = block_layout(spec.expert_intermediate, spec.hidden_size, quant, bias=spec.has_expert_bias,
                          gated=spec.has_expert_gate)
    gen_dev = torch.Generator(device=device).manual_seed(seed)
    dense = _random_dense(_dense_shapes(config), device, gen_dev, spec.num_experts)
    save_file(dense, str(dst / DENSE_FILE), metadata={"format": "pt"})
    progress(f"{preset}: dense weights written ({sum(t.numel() * 2 for t in dense.values()) / 1e9:.2f} GB)")
    if _tables(config):
        index = write_tables(dst, _table_shards(config), lambda n: _random_table_shard(config, n, device, seed),
                             tuple(_tables(config)))
        progress(f"{preset}: n-gram tables written ({index.total_bytes / 1e9:.2f} GB)")

    offsets = {f.name: f.offset for f in layout.fields}
    blocks = random_bank(NUM_DISTINCT_BLOCKS, layout.block_bytes, quant, offsets, layout.intermediate,
                         layout.hidden, generator=torch.Generator().manual_seed(seed)).numpy()
    crcs = [zlib.crc32(b) for b in blocks]
    rng = torch.Generator().manual_seed(seed + 1)
    checksums = {}
    with open(dst / EXPERTS_FILE, "wb") as f:
        for layer in spec.moe_layers:
            choice = torch.randint(0, NUM_DISTINCT_BLOCKS, (spec.num_experts,), generator=rng).tolist()
            f.write(b"".join(blocks[c].tobytes() for c in choice))
            checksums[layer] = [crcs[c] for c in choice]
        f.flush()
        os.fsync(f.fileno())
    progress(f"{preset}: experts written ({(dst / EXPERTS_FILE).stat().st_size / 1e9:.2f} GB, {quant})")
    manifest = build_manifest(name=f"{preset} (random, {quant})", spec=spec, config=config, quant=quant, layout=layout,
                              layer_checksums=checksums,
                              dense_tensors={n: {"shape": list(t.shape)} for n, t in dense.items()},
                              tokenizer_files=[], source={"preset": preset, "seed": seed})
    (dst / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return dst


def hf_checkpoint_dir(work: Path, preset: str) -> Path:
    """Where the bench keeps a preset's HF checkpoint (repacked for Sluice, converted to GGUF for llama.cpp)."""
    return Path(work) / f"{preset}-hf"


def write_hf_checkpoint(preset: str, dst: Path, device="cuda", seed: int = 0, shard_bytes: int = 4 << 30,
                        progress=print) -> Path:
    """A Hugging Face snapshot of `preset` (bf16, Hub layout: one tensor per expert projection)."""
    dst = Path(dst)
    if (dst / HF_INDEX).is_file():
        return dst
    config, spec = _begin(preset, dst)
    gen = torch.Generator(device=device).manual_seed(seed)
    weight_map, shard, shard_size, shard_index = {}, {}, 0, 0

    def flush():
        nonlocal shard, shard_size, shard_index
        if shard:
            name = f"model-{shard_index:05d}.safetensors"
            save_file(shard, str(dst / name), metadata={"format": "pt"})
            weight_map.update({k: name for k in shard})
            shard, shard_size, shard_index = {}, 0, shard_index + 1

    def add(name, tensor):
        nonlocal shard_size
        shard[name] = tensor
        shard_size += tensor.numel() * tensor.element_size()
        if shard_size >= shard_bytes:
            flush()

    dense = {**_random_dense(_dense_shapes(config), device, gen, spec.num_experts), **_hash_constants(config)}
    for name, tensor in dense.items():
        add(name, tensor)
    for name in (n for names in _table_shards(config).values() for n in names):
        add(name, _random_table_shard(config, name, device, seed))
    if spec.family == "gpt_oss":
        _add_gpt_oss_mxfp4_experts(spec, add, gen, progress)
        config = {**config, "quantization_config": {"quant_method": "mxfp4"}}
    shapes = {"gate": (spec.expert_intermediate, spec.hidden_size), "up": (spec.expert_intermediate, spec.hidden_size),
              "down": (spec.hidden_size, spec.expert_intermediate)}
    for layer in spec.moe_layers if spec.family != "gpt_oss" else ():
        for expert in range(spec.num_experts):
            for proj, shape in shapes.items():
                w = torch.randn(shape, device=device, generator=gen) * shape[1] ** -0.5
                add(spec.expert_tensor_name(layer, expert, proj), w.to(torch.bfloat16).cpu())
        if layer % 8 == 7:
            progress(f"{preset}: HF checkpoint, layer {layer} written")
    flush()
    (dst / HF_INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (dst / "config.json").write_text(json.dumps({**_hub_spelling(config), "architectures": [_architecture(config)]},
                                                indent=1))
    return dst


def _hub_spelling(config: dict) -> dict:
    """The config as the Hub writes it: Flash-Next's indexed-attention layers are "full_attention" in its
    config.json (transformers renames them on load; llama.cpp's converter gives only those a compress ratio)."""
    if config["model_type"] != "qwen4_exp_text":
        return config
    return {**config, "layer_types": ["full_attention" if t == "indexed_attention" else t for t in config["layer_types"]]}


def _add_gpt_oss_mxfp4_experts(spec, add, gen: torch.Generator, progress) -> None:
    """gpt-oss experts as the Hub ships them: fused per layer, `*_blocks` / `*_scales` (mxfp4) and
    bf16 biases; random valid blocks with weights of magnitude ~ 1/sqrt(in)."""
    E, H, I = spec.num_experts, spec.hidden_size, spec.expert_intermediate
    device = gen.device
    for layer in spec.moe_layers:
        p = f"model.layers.{layer}.mlp.experts."
        for name, (out_f, in_f) in {"gate_up_proj": (2 * I, H), "down_proj": (H, I)}.items():
            blocks = torch.randint(0, 256, (E, out_f, in_f // 32, 16), device=device, generator=gen, dtype=torch.uint8)
            center = 127 + round(math.log2(in_f ** -0.5 / 3))
            scales = torch.randint(center - 1, center + 1, (E, out_f, in_f // 32), device=device, generator=gen)
            add(p + name + "_blocks", blocks.cpu())
            add(p + name + "_scales", scales.to(torch.uint8).cpu())
            add(p + name + "_bias", (0.1 * torch.randn(E, out_f, device=device, generator=gen)).to(torch.bfloat16).cpu())
        if layer % 8 == 7:
            progress(f"gpt-oss: HF checkpoint, layer {layer} written")


def _architecture(config: dict) -> str:
    return {"olmoe": "OlmoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
            "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration", "gpt_oss": "GptOssForCausalLM",
            "deepseek_v4": "DeepseekV4ForCausalLM", "qwen4_exp_text": "Qwen4ExpForCausalLM",
            "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
            "glm4_moe": "Glm4MoeForCausalLM"}[config["model_type"]]
