"""Parameter counts of a MoE config, from config.json alone (what the estimate needs before any download).

The common count is a decoder of grouped-query attention and routed experts; a family whose layers differ gives its
module a `param_counts(config) -> ModelShape`, usually `moe_shape(config, its_adjust)` where `its_adjust(config,
parts)` changes the per-layer pieces before they are summed. The totals match transformers' num_parameters().

  H = hidden, L = layers, V = vocabulary, E = experts, k = experts a token, I = an expert's intermediate width
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from engine.errors import SluiceError

EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


@dataclass
class ModelShape:
    family: str
    num_layers: int
    num_moe_layers: int
    num_experts: int
    top_k: int
    hidden: int
    expert_intermediate: int
    vocab: int
    total_params: int
    active_params: int
    dense_params: int              # everything but routed experts (embeddings included)
    embedding_params: int          # read one row per token, so not counted as moved bytes
    exact_params: int = 0          # dense params int8 dense weights leave in the compute dtype (routers, norms, biases, ...)
    embedding_in_file: bool = False  # the table is read from the model's file, not loaded (engine.format.file_table)
    ngram_rows_per_token: int = 0  # n-gram rows one token reads (qwen4_exp: engine.runtime.ngram)
    ngram_rows: int = 0            # the n-gram tables' rows (ngram.bin in the model dir) and their width
    ngram_row_dim: int = 0
    has_expert_gate: bool = True   # False: an expert is up and down alone (Nemotron-H), two projections, not three
    generic_graphs: bool = False   # a generic family whose decode replays as CUDA graph segments (graph_blocker: none)

    @property
    def expert_params(self) -> int:
        return (3 if self.has_expert_gate else 2) * self.hidden * self.expert_intermediate


@dataclass
class Parts:
    """A config's sizes and the parameters of one layer's pieces, before they are summed (a family adjusts them)."""
    H: int
    L: int
    V: int
    nh: int                        # query heads
    nkv: int                       # key/value heads
    hd: int                        # head width
    E: int
    k: int
    I_dense: int
    I_expert: int
    moe_layer_ids: list[int]
    attn: int = 0                  # one layer's attention
    router: int = 0                # one MoE layer's router
    expert: int = 0                # one routed expert
    shared: int = 0                # one MoE layer's shared expert (and its gate, router bias)
    exact_extra: int = 0           # parameters int8 dense weights keep exact, besides routers and norms
    mixers: int | None = None      # all layers' mixers where they are not L x attn (hybrids)
    extra: dict = field(default_factory=dict)


def text_config(config: dict) -> dict:
    """A vision-language checkpoint's text model: its text_config over the top level, the model_type kept."""
    if isinstance(config.get("text_config"), dict):
        return {**config, **config["text_config"], "model_type": config.get("model_type", "?")}
    return config


def moe_shape(config: dict, adjust: Callable[[dict, Parts], None] | None = None) -> ModelShape:
    """The common count, with the family's `adjust` applied to the per-layer pieces before they are summed."""
    config = text_config(config)
    p = _parts(config)
    if adjust is not None:
        adjust(config, p)
    moe = len(p.moe_layer_ids)
    exact = moe * p.router + p.L * 2 * p.H + p.H + p.exact_extra          # routers, norms
    if config.get("shared_expert_intermediate_size"):
        exact += moe * p.H                                               # the shared expert's sigmoid gate
    mixers = p.L * p.attn if p.mixers is None else p.mixers
    dense = mixers + p.L * 2 * p.H + p.H + (p.L - moe) * 3 * p.H * p.I_dense
    dense += moe * (p.router + p.shared)                                  # routers, shared experts
    embedding = p.V * p.H
    dense += embedding + (0 if config.get("tie_word_embeddings") else p.V * p.H)
    from engine.model.model import table_in_file
    family = config.get("model_type", "?")
    return ModelShape(family, p.L, moe, p.E, p.k, p.H, p.I_expert, p.V, dense + moe * p.E * p.expert,
                      dense + moe * p.k * p.expert, dense, embedding, exact,
                      table_in_file(family, tied=bool(config.get("tie_word_embeddings"))))


def _parts(config: dict) -> Parts:
    family = config.get("model_type", "?")
    try:
        H, L, V = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
        nh = config["num_attention_heads"]
        E = next(config[key] for key in EXPERT_COUNT_KEYS if config.get(key))
        k = config["num_experts_per_tok"]
    except (KeyError, StopIteration, TypeError) as exc:
        raise SluiceError(f"This {family} config.json lacks the MoE sizes Sluice needs ({exc}); the repo may be "
                          f"broken.") from exc
    nkv = config.get("num_key_value_heads") or nh
    hd = config.get("head_dim") or H // nh
    I_dense = config.get("intermediate_size") or 0
    I_expert = config.get("moe_intermediate_size") or I_dense
    p = Parts(H, L, V, nh, nkv, hd, E, k, I_dense, I_expert, moe_layers(config, L, E))
    p.attn = H * nh * hd + 2 * H * nkv * hd + nh * hd * H
    if config.get("qkv_bias") or config.get("attention_bias"):
        p.attn += nh * hd + 2 * nkv * hd
    p.expert, p.router = 3 * H * I_expert, E * H
    if config.get("shared_expert_intermediate_size"):
        p.shared = 3 * H * config["shared_expert_intermediate_size"] + H      # shared expert + its sigmoid gate
    return p


def moe_layers(config: dict, num_layers: int, num_experts: int) -> list[int]:
    """The layers with routed experts (the others have a dense MLP)."""
    skip = set(config.get("mlp_only_layers") or [])
    step = config.get("decoder_sparse_step") or 1
    first_dense = config.get("first_k_dense_replace") or 0
    types = config.get("mlp_layer_types") or ["sparse"] * num_layers        # glm4_moe_lite
    return [i for i in range(num_layers)
            if num_experts > 0 and i not in skip and (i + 1) % step == 0 and i >= first_dense and types[i] == "sparse"]
