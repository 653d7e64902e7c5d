"""DeepSeek-V4 parameter counts from its config (the estimate's model shape; buffers such as the hash
table are not parameters and are left out, as in transformers' num_parameters())."""
from __future__ import annotations

from engine.model.dsv4.attention import CSA, HCA


def layer_dense_params(cfg, layer: int) -> int:
    """Everything of one layer but its routed experts: attention, compressor / indexer, norms, mHC, router,
    shared expert."""
    H, D, heads, q_lora = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.q_lora_rank
    attn = H * q_lora + q_lora + q_lora * heads * D + H * D + D + heads * D * cfg.o_lora_rank
    attn += cfg.o_groups * cfg.o_lora_rank * H + heads
    kind = cfg.layer_types[layer]
    if kind in (CSA, HCA):
        width = 2 * D if kind == CSA else D
        attn += 2 * H * width + cfg.compress_rates[kind] * width + D
    if kind == CSA:
        Di, index_heads = cfg.index_head_dim, cfg.index_n_heads
        attn += 2 * H * 2 * Di + cfg.compress_rates[kind] * 2 * Di + Di + q_lora * index_heads * Di + H * index_heads
    n = cfg.hc_mult
    hyper = 2 * ((2 + n) * n * n * H + (2 + n) * n + 3)
    moe = cfg.n_routed_experts * H + 3 * H * cfg.moe_intermediate_size      # router, shared expert
    return attn + 2 * H + hyper + moe


def model_dense_params(cfg) -> int:
    """All parameters but the routed experts (embeddings and head included)."""
    H, n = cfg.hidden_size, cfg.hc_mult
    top = cfg.vocab_size * H * (1 if cfg.tie_word_embeddings else 2) + H + n * n * H + n + 1
    return top + sum(layer_dense_params(cfg, i) for i in range(cfg.num_hidden_layers))


def int8_dense_params(cfg) -> int:
    """The parameters int8 dense weights quantise (engine.model.families.deepseek_v4.DENSE_INT8): per layer
    q_a, q_b, kv, o_a, o_b and the shared expert; the embedding table and the head."""
    H, D, heads, q_lora = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.q_lora_rank
    o_a = cfg.o_groups * cfg.o_lora_rank * heads * D // cfg.o_groups
    per_layer = (H * q_lora + q_lora * heads * D + H * D + o_a + cfg.o_groups * cfg.o_lora_rank * H
                 + 3 * H * cfg.moe_intermediate_size)
    return cfg.vocab_size * H * (1 if cfg.tie_word_embeddings else 2) + cfg.num_hidden_layers * per_layer
