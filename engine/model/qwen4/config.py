"""qwen4_exp config quirks: which layers are DeltaNet, QSA-indexed attention or carry PLE, and the dimensions
of the hyper-connections, the n-gram tables and the indexer (cfg: transformers' Qwen4ExpTextConfig)."""
from __future__ import annotations

from dataclasses import dataclass

from engine.errors import SluiceError
from engine.model.hybrid_spec import HybridDims, read_hybrid_dims
from engine.model.qwen4.ngram_hash import head_vocab_sizes

LINEAR, INDEXED = "linear_attention", "indexed_attention"


@dataclass(frozen=True)
class Qwen4Dims:
    hybrid: HybridDims             # DeltaNet dims; layer_types there say LINEAR or INDEXED
    hidden: int
    hc_count: int                  # residual streams
    hc_lowrank: int
    ple_layers: tuple[int, ...]    # zero-based layers with PLE, in order (their rank = the PLE index)
    ple_embed_dim: int             # the concatenated rows of one token: ngram_heads * row_dim
    ple_conv_kernel: int
    ngram_size: int                # largest n (orders 2..n)
    heads_per_ngram: int
    vocab_size: int                # token vocabulary (the hash multipliers depend on it)
    ngram_vocab_base: int
    ngram_vocab_multiple: int
    seed: int
    eos_token_id: int              # resets the n-gram history
    indexer_heads: int
    indexer_head_dim: int
    indexer_budget: int            # tokens selected from complete blocks
    compress_ratio: int            # tokens per index block
    output_gate: str               # "silu" | "sigmoid": the DeltaNet's gated norm

    @property
    def ngram_heads(self) -> int:
        return (self.ngram_size - 1) * self.heads_per_ngram

    @property
    def row_dim(self) -> int:
        return self.ple_embed_dim // self.ngram_heads

    @property
    def conv_dilation(self) -> int:
        return self.ngram_size

    @property
    def ple_conv_state(self) -> int:
        return (self.ple_conv_kernel - 1) * self.conv_dilation

    def ple_index(self, layer: int) -> int | None:
        return self.ple_layers.index(layer) if layer in self.ple_layers else None

    def table_rows(self, ple_index: int) -> int:
        """Rows of one PLE layer's table: its heads' prime vocabularies, padded to the multiple."""
        total = sum(head_vocab_sizes(self.ngram_vocab_base, ple_index, self.ngram_heads))
        return -(-total // self.ngram_vocab_multiple) * self.ngram_vocab_multiple


def text_config(cfg):
    return cfg.text_config if cfg.model_type == "qwen4_exp" else cfg


def read_qwen4_dims(cfg) -> Qwen4Dims:
    """cfg: the text config. Refuses what the family does not run in one sentence."""
    if cfg.indexer_n_heads is None:
        raise SluiceError("This qwen4_exp model has no QSA indexer settings in its config.json; Sluice runs the "
                          "published layout only (indexer_n_heads, indexer_budget, ...): use that model.")
    eos = cfg.eos_token_id[0] if isinstance(cfg.eos_token_id, (list, tuple)) else cfg.eos_token_id
    layer_types = tuple(LINEAR if t == LINEAR else "full_attention" for t in cfg.layer_types)
    hybrid = read_hybrid_dims(_WithTypes(cfg, layer_types))
    return Qwen4Dims(
        hybrid=hybrid, hidden=cfg.hidden_size, hc_count=cfg.hc_count, hc_lowrank=cfg.hc_lowrank,
        ple_layers=tuple(i - 1 for i in cfg.ple_layer_ids), ple_embed_dim=cfg.ple_embed_dim,
        ple_conv_kernel=cfg.ple_conv_kernel_size, ngram_size=cfg.ngram_size, heads_per_ngram=cfg.heads_per_ngram,
        vocab_size=cfg.vocab_size, ngram_vocab_base=cfg.ngram_vocab_size_base,
        ngram_vocab_multiple=cfg.make_ngram_vocab_size_divisible_by, seed=cfg.seed,
        eos_token_id=-1 if eos is None else int(eos), indexer_heads=cfg.indexer_n_heads,
        indexer_head_dim=cfg.indexer_head_dim, indexer_budget=cfg.indexer_budget,
        compress_ratio=cfg.indexer_compress_ratio, output_gate=cfg.output_gate_type or cfg.hidden_act)


class _WithTypes:
    """cfg seen with its indexed layers spelled as full attention (read_hybrid_dims' vocabulary)."""

    def __init__(self, cfg, layer_types: tuple[str, ...]):
        self._cfg, self.layer_types = cfg, layer_types

    def __getattr__(self, name):
        return getattr(self._cfg, name)
