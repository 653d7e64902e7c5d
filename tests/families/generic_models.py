"""Tiny random-weight checkpoints of the families Sluice runs generically (engine.model.generic): transformers'
config class and save_pretrained, every routing quirk on (shared experts, dense first layers, expert groups,
score-correction biases, sliding and global attention, recurrent mixers)."""
from __future__ import annotations

_E8 = dict(num_experts_per_tok=2, moe_intermediate_size=32)
GENERIC_KWARGS = {
    "afmoe": dict(_E8, num_experts=8, num_shared_experts=1, num_dense_layers=1, global_attn_every_n_layers=2,
                  sliding_window=8, route_scale=1.5),
    "hy_v3": dict(_E8, num_experts=8, num_shared_experts=1),
    "mimo_v2_flash": dict(_E8, n_routed_experts=8, head_dim=16, v_head_dim=16, sliding_window=8),
    "lfm2_moe": dict(_E8, num_experts=8, num_dense_layers=1, layer_types=["full_attention", "conv", "full_attention"]),
    "kimi_linear": dict(_E8, num_experts=8, linear_head_dim=16, linear_num_heads=4, num_key_value_heads=4,
                        layer_types=["linear_attention", "full_attention", "linear_attention"]),
    "bailing_hybrid": dict(_E8, num_experts=8, layer_group_size=2, kv_lora_rank=32, q_lora_rank=24, num_key_value_heads=4,
                           qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, head_dim=16, n_group=2,
                           topk_group=1),
    "granitemoehybrid": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, mamba_n_heads=8,
                             mamba_d_state=16, mamba_chunk_size=16,
                             layer_types=["linear_attention", "attention", "linear_attention"]),
    "longcat_flash": dict(n_routed_experts=8, zero_expert_num=4, moe_topk=3, expert_ffn_hidden_size=32,
                          ffn_hidden_size=64, kv_lora_rank=32, q_lora_rank=24, qk_nope_head_dim=16,
                          qk_rope_head_dim=8, v_head_dim=16, head_dim=8, num_key_value_heads=4,
                          routed_scaling_factor=2.0, num_hidden_layers=4),      # two layers of two sublayers
    # Mamba-2, MoE (ungated relu^2 experts, a shared expert, expert groups), attention and a dense MLP layer
    "nemotron_h": dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                       moe_shared_expert_intermediate_size=48, n_group=2, topk_group=1, routed_scaling_factor=2.0,
                       mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=2, chunk_size=16,
                       layers_block_type=["linear_attention", "moe", "full_attention", "moe", "mlp"], num_hidden_layers=5),
    # native (families.llama4; tests/families/test_llama4.py), built here alike. Llama 4 ships top-1; 2 is the harder
    # case (several scaled copies of a token); chunked attention and NoPE on
    "llama4_text": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, intermediate_size_mlp=64,
                        interleave_moe_layer_step=1, attention_chunk_size=8, no_rope_layers=[1, 1, 0]),
}
# families Sluice does not list: adopted on first sight (engine.model.spec), as a new transformers family would be
UNLISTED_KWARGS = {
    "phimoe": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32),
    "minimax": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32),
    "granitemoe": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32),
    "cohere2_moe": dict(num_experts=8, num_experts_per_tok=2, intermediate_size=32, sliding_window=8,
                        sliding_window_pattern=2),
    "exaone_moe": dict(_E8, num_experts=8, sliding_window=8, sliding_window_pattern=2),
    "jamba": dict(num_experts=8, num_experts_per_tok=2, intermediate_size=32, attn_layer_period=2,
                  attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=0, use_mamba_kernels=False),
    "solar_open": dict(_E8, n_routed_experts=8, n_shared_experts=1),
}
GENERIC_KWARGS.update(UNLISTED_KWARGS)


def build_generic_model(family: str, dst, num_layers: int = 3, **overrides):
    from engine.tools.demo import build_hf_model
    return build_hf_model(family, dst, num_layers=num_layers, **{**GENERIC_KWARGS[family], **overrides})

# vision-language checkpoints: a small vision tower the engine must skip, the language model run generically
_TEXT = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             num_hidden_layers=3, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
             eos_token_id=None, bos_token_id=None, pad_token_id=None)
VL_KWARGS = {
    "qwen3_vl_moe": (dict(_TEXT, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32),
                     dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                          patch_size=8, deepstack_visual_indexes=[0])),
    "glm4v_moe": (dict(_TEXT, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                       first_k_dense_replace=1, routed_scaling_factor=2.0,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                        "mrope_section": [2, 1, 1]}),
                  dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)),
    "minimax_m3_vl": (dict(_TEXT, num_local_experts=8, num_experts_per_tok=2, intermediate_size=32,
                           dense_intermediate_size=64, shared_intermediate_size=32, rotary_dim=8, swiglu_limit=1.5,
                           index_head_dim=16, index_block_size=4, index_topk_blocks=2, mlp_layer_types=None),
                      dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)),
    # hyper-connections, linear attention and an indexed (DSA) attention layer, a clamped SwiGLU
    "glm5_next": (dict(_TEXT, num_hidden_layers=4, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                       num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=24, v_head_dim=16, qk_nope_head_dim=16,
                       index_head_dim=16, index_n_heads=2, index_topk=4, index_kpool=2, linear_head_dim=16,
                       linear_num_heads=4,
                       swiglu_limit=1.5, mlp_layer_types=["dense", "sparse", "sparse", "sparse"]),
                  dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                       projection_intermediate_size=64)),
    # Kimi-K2.5: DeepSeek-V3 as its language model, MoonViT (whose q/k/v transformers splits) as its vision tower;
    # its own head, as released (the wrapper's config would tie it to the embeddings)
    "kimi_k25": (dict(_TEXT, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                      first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
                      head_dim=8, v_head_dim=16, num_key_value_heads=4, n_group=2, topk_group=1,
                      routed_scaling_factor=2.0),
                 dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2),
                 dict(tie_word_embeddings=False)),
    # its language model is a causal LM of its own (`language_model.model.`, `language_model.lm_head`), run natively
    "llama4": (dict(_TEXT, num_local_experts=8, num_experts_per_tok=1, intermediate_size=32, intermediate_size_mlp=64,
                    interleave_moe_layer_step=1, attention_chunk_size=8, no_rope_layers=[1, 1, 0]),
               dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=56,
                    patch_size=14, vision_output_dim=64, projector_input_dim=64, projector_output_dim=64)),
}


def built_once(root, build):
    """family -> (HF dir, its bf16 Sluice repack), each built the first time a test asks (a module fixture's)."""
    from engine.format.repack import repack
    built = {}

    def get(family: str):
        if family not in built:
            hf = build(family, root / family / "hf")
            built[family] = hf, repack(hf, root / family / "sluice")
        return built[family]
    return get


def build_vl_model(family: str, dst, seed: int = 0):
    """A vision-language checkpoint as transformers saves it (bf16), with a tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from engine.tools.demo import randomize_weights, train_tiny_tokenizer
    dst.mkdir(parents=True, exist_ok=True)
    vocab_size = len(train_tiny_tokenizer(dst))
    text, vision, *outer = VL_KWARGS[family]
    config = AutoConfig.for_model(family, text_config=dict(text, vocab_size=vocab_size), vision_config=vision,
                                  **(outer[0] if outer else {}))
    model = AutoModelForImageTextToText.from_config(config).eval()
    torch.manual_seed(seed)
    randomize_weights(model)
    model.to(torch.bfloat16).save_pretrained(str(dst))
    return dst


def vl_reference_greedy(hf_dir, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own vision-language model on a text prompt, float32, greedy."""
    import torch
    from transformers import AutoModelForImageTextToText
    model = AutoModelForImageTextToText.from_pretrained(str(hf_dir), dtype=torch.float32, experts_implementation="eager",
                                                        attn_implementation="eager").eval()
    if hasattr(model, "language_model") and hasattr(model.language_model, "generate"):
        model = model.language_model      # Llama 4: its wrapper fails on a text-only output in transformers 5.24
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0, min_new_tokens=max_new_tokens)
    return out[0, len(prompt_ids):].tolist()


def vl_streamed_tokens(model_dir, prompt_ids: list[int], max_new_tokens: int, **load) -> tuple[list[int], int]:
    """(Sluice's greedy tokens, the RAM cache's evictions) with the experts streaming. load: engine.load options
    (device, dtype); without them the VRAM budget too is set far below the experts (the CPU's plan)."""
    import engine
    from engine import GenerationParams
    from tests.streaming.sized import streaming_budgets
    vram, ram = streaming_budgets(model_dir)
    eng = engine.load(model_dir, vram_budget=None if load else vram, ram_cache=ram, **load)
    try:
        ours = [e.token_id for e in eng.generate(prompt_ids, GenerationParams(max_new_tokens=max_new_tokens,
                                                                               temperature=0))]
        return ours, eng.telemetry()["ram_cache"]["evictions"]
    finally:
        eng.close()
