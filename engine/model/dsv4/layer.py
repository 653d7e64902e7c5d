"""One DeepSeek-V4 decoder layer in the runtime's block shape: mix -> route -> experts -> combine.

The residual x is the mHC streams [T, n, H]. `mix` runs attention between the two hyper-connections
and returns what `combine` needs (the streams, ffn post / comb) plus the MoE input h. Weight names are
transformers' in-memory names below `model.layers.{i}.` (see `canonical_name` for checkpoint spellings).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from engine.model.block import Step
from engine.model.dsv4.attention import SLIDING, AttentionWeights, attention
from engine.model.dsv4.compressor import CompressorWeights, IndexerWeights
from engine.model.dsv4.config import Dsv4Config
from engine.model.dsv4.hyper import HyperWeights, hyper_collapse, hyper_expand
from engine.model.dsv4.moe import clamped_swiglu, route_hash, route_topk
from engine.model.dsv4.norms import rms_norm
from engine.model.dsv4.rope import rope_cos_sin
from engine.model.dsv4.state import layer_buffers
from engine.model.layers import Packed


@dataclass(frozen=True)
class Mixed:
    """What `mix` hands to `combine`: the streams after attention and the ffn hyper-connection's weights."""
    streams: torch.Tensor   # [T, n, H]
    post: torch.Tensor      # [T, n]
    comb: torch.Tensor      # [T, n, n]


def rope_for(cfg: Dsv4Config, positions: torch.Tensor, dtype: torch.dtype) -> dict:
    """cos / sin of both rope sets at `positions`, shared by every layer of a step."""
    return {"main": rope_cos_sin(positions, *cfg.main_rope, dtype),
            "compress": rope_cos_sin(positions, *cfg.compress_rope, dtype),
            "compress_tables": cfg.compress_rope}


def _compressor(get: Callable, prefix: str, overlap: bool) -> CompressorWeights:
    return CompressorWeights(kv=get(f"{prefix}.kv_proj.weight"), gate=get(f"{prefix}.gate_proj.weight"),
                             position_bias=get(f"{prefix}.position_bias"), norm=get(f"{prefix}.kv_norm.weight"),
                             overlap=overlap)


def attention_weights(get: Callable, kind: str, cfg: Dsv4Config) -> AttentionWeights:
    a = "self_attn"
    compressor = indexer = None
    if kind != SLIDING:
        is_csa = kind == "compressed_sparse_attention"
        compressor = _compressor(get, f"{a}.compressor", overlap=is_csa)
        if is_csa:
            indexer = IndexerWeights(compressor=_compressor(get, f"{a}.compressor.indexer", overlap=True),
                                     q_b=get(f"{a}.compressor.indexer.q_b_proj.weight"),
                                     weights_proj=get(f"{a}.compressor.indexer.scorer.weights_proj.weight"),
                                     top_k=cfg.index_topk)
    o_a = get(f"{a}.o_a_proj.weight")
    return AttentionWeights(
        q_a=get(f"{a}.q_a_proj.weight"), q_a_norm=get(f"{a}.q_a_norm.weight"), q_b=get(f"{a}.q_b_proj.weight"),
        kv=get(f"{a}.kv_proj.weight"), kv_norm=get(f"{a}.kv_norm.weight"), o_a=o_a,
        o_b=get(f"{a}.o_b_proj.weight"), sinks=get(f"{a}.sinks"), o_groups=cfg.o_groups,
        compressor=compressor, indexer=indexer,
        o_a_groups=tuple(o_a.row_groups(cfg.o_groups)) if isinstance(o_a, Packed) else None)


class Dsv4Layer:
    def __init__(self, cfg: Dsv4Config, index: int, get: Callable[[str], torch.Tensor]):
        self.cfg, self.index = cfg, index
        self.kind = cfg.layer_types[index]
        self.is_hash = cfg.mlp_layer_types[index] == "hash_moe"
        self.attn = attention_weights(get, self.kind, cfg)
        self.attn_hc = HyperWeights(get("attn_hc.fn"), get("attn_hc.base"), get("attn_hc.scale"))
        self.ffn_hc = HyperWeights(get("ffn_hc.fn"), get("ffn_hc.base"), get("ffn_hc.scale"))
        self.input_norm = get("input_layernorm.weight")
        self.post_attention_norm = get("post_attention_layernorm.weight")
        self.gate = get("mlp.gate.weight")
        self.route_table = get("mlp.gate.tid2eid") if self.is_hash else get("mlp.gate.e_score_correction_bias")
        self.shared = tuple(get(f"mlp.shared_experts.{p}_proj.weight") for p in ("gate", "up", "down"))

    def _collapse(self, x: torch.Tensor, w: HyperWeights):
        c = self.cfg
        return hyper_collapse(x, w, c.hc_sinkhorn_iters, c.hc_eps, c.eps)

    def mix(self, x: torch.Tensor, step: Step, rope: dict) -> tuple[Mixed, torch.Tensor]:
        """x [T, n, H] -> (Mixed, h [T, H]): attention between the attn hyper-connection, then the MoE input.
        The layer's state is step.state's buffers of index `self.index` (dsv4/state.py)."""
        c = self.cfg
        collapsed, post, comb = self._collapse(x, self.attn_hc)
        out = attention(rms_norm(collapsed, self.input_norm, c.eps), step.positions, step.start, self.attn,
                        layer_buffers(step, self.index, self.kind), self.kind, c.sliding_window, c.eps, rope)
        x = hyper_expand(x, out, post, comb)
        collapsed, post, comb = self._collapse(x, self.ffn_hc)
        return Mixed(x, post, comb), rms_norm(collapsed, self.post_attention_norm, c.eps)

    def route(self, h: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h [T, H], token_ids [T] -> weights [T, K], expert ids [T, K]."""
        c = self.cfg
        if self.is_hash:
            return route_hash(h, self.gate, self.route_table, token_ids, c.scoring, c.routed_scaling)
        return route_topk(h, self.gate, self.route_table, c.scoring, c.top_k, c.routed_scaling)

    def expert(self, x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        return clamped_swiglu(x, gate, up, down, self.cfg.swiglu_limit)

    def combine(self, mixed: Mixed, h: torch.Tensor, moe_out: torch.Tensor) -> torch.Tensor:
        """Streams after the layer: routed experts' sum + shared expert(h), spread by the ffn hyper-connection."""
        out = moe_out + self.expert(h, *self.shared)              # moe_out may be float32: summed in it
        return hyper_expand(mixed.streams, out, mixed.post, mixed.comb).to(mixed.streams.dtype)
