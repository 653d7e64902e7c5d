"""qwen4_exp's parameter counts from config.json alone (the estimate), as transformers counts them: the n-gram
tables apart (they stay on disk and a token reads a few rows of them, engine.runtime.ngram)."""
from __future__ import annotations

from dataclasses import dataclass



@dataclass(frozen=True)
class Qwen4Counts:
    dense: int             # loaded weights: everything but routed experts and n-gram tables
    exact: int             # of those, what int8 dense weights would leave exact (norms, routers, mixers' gates)
    experts: int           # one routed expert's parameters
    table_params: int      # the n-gram tables, all PLE layers
    table_rows: int        # their rows (each table padded to its multiple)
    rows_per_token: int    # n-gram rows one token reads (PLE layers x heads)


def _layer_types(c: dict) -> list[str]:
    types = c.get("layer_types") or ["indexed_attention" if (i + 1) % 4 == 0 else "linear_attention"
                                     for i in range(c["num_hidden_layers"])]
    return ["linear_attention" if t == "linear_attention" else "indexed_attention" for t in types]


def _mixer(c: dict, kind: str) -> int:
    H = c["hidden_size"]
    if kind == "linear_attention":
        nv, key = c["linear_num_value_heads"], c["linear_num_key_heads"] * c["linear_key_head_dim"]
        value = nv * c["linear_value_head_dim"]
        return (H * (2 * key + 2 * value + 2 * nv) + (2 * key + value) * c.get("linear_conv_kernel_dim", 4)
                + 2 * nv + c["linear_value_head_dim"] + value * H)
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    indexer = H * (c["indexer_n_heads"] + 1) * c["indexer_head_dim"] + 2 * c["indexer_head_dim"]
    return 2 * H * nh * hd + 2 * H * nkv * hd + nh * hd * H + 2 * hd + indexer


def qwen4_counts(c: dict) -> Qwen4Counts:
    """c: the text config as a dict (config.json's text_config for the multimodal checkpoint)."""
    from engine.model.qwen4.ngram_hash import head_vocab_sizes
    H, L, n, R = c["hidden_size"], c["num_hidden_layers"], c.get("hc_count", 4), c.get("hc_lowrank", 320)
    nH, E = n * H, c["num_experts"]
    hyper = nH + 2 * R * nH + n * nH                                     # norm, down, up, inject
    moe = E * H + 3 * H * c["shared_expert_intermediate_size"] + H       # router, shared expert and its gate
    dense = sum(_mixer(c, t) + 2 * hyper + moe for t in _layer_types(c)) + (nH + 2 * R * nH)
    dense += c["vocab_size"] * H * (1 if c.get("tie_word_embeddings") else 2)
    ple_layers = c.get("ple_layer_ids") or []
    heads = (c.get("ngram_size", 3) - 1) * c.get("heads_per_ngram", 8)
    ple_dim = c.get("ple_embed_dim") or H
    dense += len(ple_layers) * (ple_dim * nH + ple_dim * H + 3 * nH + nH * c.get("ple_conv_kernel_size", 4))
    multiple = c.get("make_ngram_vocab_size_divisible_by", 128)
    rows = sum(-(-sum(head_vocab_sizes(c.get("ngram_vocab_size_base", 20_000_000), i, heads)) // multiple) * multiple
               for i in range(len(ple_layers)))
    exact = L * (2 * nH + E * H + H) + nH
    return Qwen4Counts(dense=dense, exact=exact, experts=3 * H * c["moe_intermediate_size"],
                       table_params=rows * (ple_dim // heads if heads else 0), table_rows=rows,
                       rows_per_token=len(ple_layers) * heads)
