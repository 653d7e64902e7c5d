"""qwen4_exp (Qwen3.8-Flash-Next; the text model of the multimodal checkpoint too): Gated-DeltaNet and QSA
indexed-attention layers, the residual as n hyper-connection streams, per-layer embeddings (PLE) of hashed
n-grams on some DeltaNet layers, a softmax top-k MoE with a sigmoid-gated shared expert, no final norm (the
last hyper-connection mixer feeds the head). The pieces are in engine.model.qwen4.

A PLE layer's rows come from `Qwen4Model.ngram`: the n-gram tables are the largest tensors of the model, kept
out of the dense weights at repack (engine.format.ngram) and read by row from their own file
(engine.runtime.ngram). A prompt's lookups start at the first layer's mix, a decode step's before its first
layer (`before_step`, the token on the host), so their reads are in flight while the layers before a PLE layer
run; a decode step's rows are copied into the layer's static input just before it runs (`before_layer`), so its
pieces read only static buffers and replay in CUDA graphs, as QSA selects from device positions (qsa.py).
"""
from __future__ import annotations

import torch

from engine.model.block import Block, Rope, Router, Mlp, Step
from engine.model.families.hybrid import GatedDeltaNet
from engine.model.layers import embedding, linear
from engine.model.model import Model
from engine.model.qwen4.config import Qwen4Dims, read_qwen4_dims, text_config
from engine.model.qwen4.hyper import GatedResidual
from engine.model.qwen4.ngram_hash import NgramHasher
from engine.model.qwen4.ple import Ple
from engine.model.qwen4.qsa import IndexedAttention, index_specs
from engine.model.spec import ModelSpec, as_ids
from engine.model.state import StateSpec
from engine.model.param_counts import ModelShape, text_config as merged_text_config

EMBEDS_ITSELF = True      # the embedding is repeated into the streams and its ids feed the n-gram hashes
# What `dense_quant` may keep as int8 (engine.model.dense_quant): what only `linear` multiplies by (gated and indexer
# projections, the DeltaNet's qkv, z and output, shared experts, the hyper-connections' low-rank mixers, PLE's key and
# value), the head and the embedding. Norms, convs, routers, gates and the streams' inject weights stay exact.
DENSE_INT8 = (r"^model\.embed_tokens\.weight$|^lm_head\.weight$|\.self_attn\.[qkvo]_proj\.weight$"
              r"|\.self_attn\.indexer\.index_qk_proj\.weight$|\.linear_attn\.(in_proj_qkv|in_proj_z|out_proj)\.weight$"
              r"|\.mlp\.shared_expert\.(gate|up|down)_proj\.weight$|\.input_mix_weight_(down|up)\.weight$"
              r"|\.ple\.(key|value)_proj\.weight$")


def read_spec(cfg) -> ModelSpec:
    text = text_config(cfg)
    read_qwen4_dims(text)                         # refusals before anything is read or written
    rope = dict(text.rope_parameters or {})
    return ModelSpec(
        family=cfg.model_type, num_layers=text.num_hidden_layers, hidden_size=text.hidden_size,
        vocab_size=text.vocab_size, num_heads=text.num_attention_heads, num_kv_heads=text.num_key_value_heads,
        head_dim=text.head_dim, rms_eps=text.rms_norm_eps, num_experts=text.num_experts,
        top_k=text.num_experts_per_tok, expert_intermediate=text.moe_intermediate_size,
        norm_topk_prob=bool(text.norm_topk_prob), moe_layers=tuple(range(text.num_hidden_layers)), dense_intermediate=0,
        shared_expert_intermediate=text.shared_expert_intermediate_size, qk_norm="head", clip_qkv=None,
        sliding_windows=(None,) * text.num_hidden_layers, tie_word_embeddings=bool(text.tie_word_embeddings),
        eos_token_ids=as_ids(text.eos_token_id), max_position_embeddings=text.max_position_embeddings,
        rope_type=rope.get("rope_type", "default"), rope_theta=float(rope.get("rope_theta", 10000.0)), cfg=text)


def dims(spec: ModelSpec) -> Qwen4Dims:
    return read_qwen4_dims(spec.cfg)


def _ple_spec(d: Qwen4Dims) -> dict[str, StateSpec]:
    return {"ple_conv": StateSpec((d.hc_count * d.hidden, d.ple_conv_state), per_token=False)}


def state_specs(spec: ModelSpec) -> list[dict[str, StateSpec]]:
    """DeltaNet layers: conv + recurrent state (+ the PLE conv); indexed layers: k, v and the indexer's keys."""
    d = dims(spec)
    out = []
    for layer in range(spec.num_layers):
        if d.hybrid.is_linear(layer):
            specs = dict(GatedDeltaNet.specs(d.hybrid), **(_ple_spec(d) if layer in d.ple_layers else {}))
        else:
            specs = {"k": StateSpec((spec.num_kv_heads, spec.head_dim)),
                     "v": StateSpec((spec.num_kv_heads, spec.head_dim)),
                     **index_specs(d.indexer_head_dim, d.compress_ratio)}
        out.append(specs)
    return out


class DeltaNet(GatedDeltaNet):
    """The hybrids' Gated DeltaNet with the output gate's activation a config choice (silu or sigmoid)."""

    def __init__(self, *args, activation: str):
        super().__init__(*args)
        self.activation = "sigmoid" if activation == "sigmoid" else "silu"


class TokenIds:
    """The step's token ids [T], set by the model's embed, read when the step's n-gram lookups begin."""
    value: torch.Tensor | None = None


class Qwen4Block:
    is_moe = True
    expert_rows_per_token, expert_rows = 1, Block.expert_rows       # the experts run on h, as routed

    def __init__(self, layer: int, mixer, ple: Ple | None, ple_index: int | None, attn_hc: GatedResidual,
                 mlp_hc: GatedResidual, router: Router, shared: Mlp, model_ref: "Qwen4Model"):
        self.layer, self.mixer, self.ple, self.ple_index = layer, mixer, ple, ple_index
        self.attn_hc, self.mlp_hc, self.router, self.shared = attn_hc, mlp_hc, router, shared
        self._model = model_ref

    def state_specs(self) -> dict[str, StateSpec]:
        specs = self.mixer.state_specs()
        if self.ple is not None:
            specs["ple_conv"] = self.ple.state_spec()
        return specs

    def mix(self, x: torch.Tensor, step: Step) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        """x [T, n * H] -> ((streams, ffn stream weights [T, n]), the MoE input h [T, H])."""
        rows = self._model.ple_rows(step)
        if self.ple is not None:
            x = x + self.ple(x, rows(self.ple_index), step.state.fixed(self.layer, "ple_conv"))
        block_in, weights = self.attn_hc.mix(x)
        x = self.attn_hc.add(x, self.mixer(block_in, step), weights)
        h, weights = self.mlp_hc.mix(x)
        return (x, weights), h

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.router(h)

    def combine(self, mixed: tuple[torch.Tensor, torch.Tensor], h: torch.Tensor, moe_out: torch.Tensor) -> torch.Tensor:
        x, weights = mixed
        return self.mlp_hc.add(x, (moe_out + self.shared(h)).to(x.dtype), weights)


class Qwen4Model(Model):
    def __init__(self, spec: ModelSpec, d: Qwen4Dims, w: dict[str, torch.Tensor], mixer: GatedResidual,
                 dtype: torch.dtype, device: torch.device):
        super().__init__(spec, [], w["model.embed_tokens.weight"], None, w["lm_head.weight"], spec.rms_eps)
        self.d, self.mixer, self.token_ids = d, mixer, TokenIds()
        self.hasher = NgramHasher(d.vocab_size, d.ngram_size, d.heads_per_ngram, d.ngram_vocab_base, d.seed,
                                  d.eos_token_id, len(d.ple_layers))
        self.ngram = None            # the row source: engine.runtime.ngram's tier, attached by the runner
        self.compute_dtype, self.device = dtype, torch.device(device)      # the rows'
        # A decode step's rows: one static input [1, E] per PLE layer, filled from a host buffer (pinned on CUDA)
        self.ple_in = [torch.zeros(1, d.ple_embed_dim, dtype=dtype, device=self.device) for _ in d.ple_layers]
        self._ple_stage = [torch.zeros(1, d.ple_embed_dim, dtype=dtype, pin_memory=self.device.type == "cuda")
                           for _ in d.ple_layers]
        self._lookups = None         # the decode step's, begun by before_step

    def ple_rows(self, step: Step):
        """index -> a PLE layer's rows [T, E]: a decode step's static inputs, or a prompt's lookups (begun by the
        first layer that asks)."""
        if step.decode:
            return lambda index: self.ple_in[index]
        return step.memo("ngram", lambda: self.ngram.begin(self.token_ids.value.tolist(), step.start)).rows

    def before_step(self, token: int, position: int) -> None:
        if self.d.ple_layers:
            self._lookups = self.ngram.begin([token], position, self._ple_stage)

    def before_layer(self, layer: int) -> None:
        """A PLE layer's rows, read into their host buffer on the worker, copied into its static input (from pinned
        memory: the copy is queued, and the host does not wait for the layers before it)."""
        index = self.d.ple_index(layer)
        if index is not None:
            self.ple_in[index].copy_(self._lookups.rows(index), non_blocking=True)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """[T] -> the n streams [T, n * H], each the token's embedding."""
        self.token_ids.value = token_ids
        return embedding(token_ids, self.embed_tokens).repeat(1, self.d.hc_count)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return linear(self.mixer.mix(x[-1:])[0], self.lm_head)[0].float()


def build(spec: ModelSpec, w: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device) -> Qwen4Model:
    d, eps = dims(spec), spec.rms_eps
    inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(0, d.hybrid.rotary_dim, 2, dtype=torch.float)
                                          / d.hybrid.rotary_dim))
    rope = Rope(inv_freq.to(device), 1.0, dtype)
    hc = dict(count=d.hc_count, hidden=d.hidden, eps=eps)
    model = Qwen4Model(spec, d, w, GatedResidual.load(w, "model.hyper_connection_mixer.", **hc), dtype, device)
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        if d.hybrid.is_linear(layer):
            mixer = DeltaNet(layer, w, p + "linear_attn.", d.hybrid, eps, activation=d.output_gate)
        else:
            mixer = IndexedAttention(layer, w, p + "self_attn.", spec, rope, heads=d.indexer_heads,
                                     head_dim=d.indexer_head_dim, budget=d.indexer_budget, ratio=d.compress_ratio)
        index = d.ple_index(layer)
        ple = Ple(w, p + "ple.", d.hc_count, d.hidden, d.conv_dilation, eps) if index is not None else None
        router = Router(w[p + "mlp.gate.weight"], spec.top_k, spec.norm_topk_prob)
        shared = Mlp(w, p + "mlp.shared_expert.", gate=w[p + "mlp.shared_expert_gate.weight"])
        model.blocks.append(Qwen4Block(layer, mixer, ple, index, GatedResidual.load(w, p + "attn_hyper_connection.", **hc),
                                       GatedResidual.load(w, p + "mlp_hyper_connection.", **hc), router, shared, model))
    return model


def param_counts(config: dict) -> ModelShape:
    """The estimate's parameter counts (engine.model.qwen4.sizes); the n-gram tables stay on disk, a few rows a
    token."""
    from engine.model.qwen4.sizes import qwen4_counts
    config = merged_text_config(config)
    c = qwen4_counts(config)
    L, E, k, H, V = (config[n] for n in ("num_hidden_layers", "num_experts", "num_experts_per_tok", "hidden_size",
                                         "vocab_size"))
    return ModelShape(config["model_type"], L, L, E, k, H, config["moe_intermediate_size"], V,
                      c.dense + L * E * c.experts + c.table_params, c.dense + L * k * c.experts, c.dense, V * H,
                      c.exact, ngram_rows_per_token=c.rows_per_token, ngram_rows=c.table_rows,
                      ngram_row_dim=c.table_params // c.table_rows if c.table_rows else 0)
