"""Tiny random-weight checkpoints of the families Sluice runs generically (engine.model.generic): transformers'
config class and save_pretrained, every routing quirk on (shared experts, dense first layers, expert groups,
score-correction biases, sliding and global attention, recurrent mixers)."""
from __future__ import annotations

_E8 = dict(num_experts_per_tok=2, moe_intermediate_size=32)
# DSA: an indexer that keeps fewer keys than the test's context, so the sparse selection decides
_DSA = dict(_E8, n_routed_experts=8, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
            kv_lora_rank=32, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, head_dim=8,
            num_key_value_heads=4, index_topk=6, index_head_dim=16, index_n_heads=2)
GENERIC_KWARGS = {
    "dots1": dict(_E8, n_routed_experts=8, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
                  norm_topk_prob=True, routed_scaling_factor=2.0, sliding_window=None),
    "ernie4_5_moe": dict(_E8, moe_num_experts=8, moe_k=2, moe_num_shared_experts=1, moe_layer_start_index=1),
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
    "deepseek_v32": _DSA,
    "glm_moe_dsa": _DSA,
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
