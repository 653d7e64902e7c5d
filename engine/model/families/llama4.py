"""Llama 4 (llama4_text, and the language model of a llama4 checkpoint): GQA where some layers rotate (RoPE, chunked
attention, an L2 norm of q and k after the rope) and the others do not (NoPE: full attention, queries scaled by a
temperature growing with the position), `no_rope_layers`; MoE layers (`moe_layers`, from interleave_moe_layer_step)
with a shared expert and a top-k router of sigmoid scores, dense MLPs (intermediate_size_mlp) elsewhere.

A routed expert receives its input scaled by its score, expert(s * x), not s * expert(x): each (token, choice) goes
to the runtime as a row of its own, the scaled input with weight 1 (`Llama4Block.expert_rows`).
Its rope rotates pairs (x[2i], x[2i+1]); the query and key rows are de-interleaved per head at load, as ERNIE's
(families.ernie), so Sluice's rope computes the same rotation (the L2 norm and the dot products do not see the order).
"""
from __future__ import annotations

import torch

from engine.errors import SluiceError
from engine.model.block import Attention, Block, Mlp, Rope, Step
from engine.model.families import standard
from engine.model.families.ernie import deinterleave_rope_rows
from engine.model.layers import attention, linear, rope_pair
from engine.model.model import Model
from engine.model.param_counts import ModelShape, Parts, moe_shape
from engine.model.rotary import rope_frequencies
from engine.model.spec import ModelSpec, as_ids
from engine.model.state import StateSpec
from kernels.norms import rms_normalized

# What `dense_quant` may keep as int8 (engine.model.dense_quant): the projections `linear` multiplies by (the Sluice
# dir's `mlp.`, transformers' `feed_forward.`: a reference quantises the same tensors); the routers stay exact.
DENSE_INT8 = (r"^model\.embed_tokens\.weight$|^lm_head\.weight$|\.self_attn\.[qkvo]_proj\.weight$"
              r"|\.(mlp|feed_forward)\.(shared_expert\.)?(gate|up|down)_proj\.weight$")


def refuse_unhandled(config: dict) -> None:
    """One sentence for a config Sluice cannot run exactly (raw config.json, before transformers reads it)."""
    act = (config.get("text_config") or config).get("hidden_act", "silu")
    if act != "silu":
        raise SluiceError(f"This Llama 4 model's experts use the '{act}' activation; Sluice runs Llama 4 with SiLU.")


def read_spec(full_cfg) -> ModelSpec:
    """full_cfg: a Llama4TextConfig, or a Llama4Config whose text config gives the language model."""
    cfg = full_cfg.get_text_config()
    num_layers = cfg.num_hidden_layers
    rope = dict(cfg.rope_parameters or {})
    return ModelSpec(
        family=full_cfg.model_type, num_layers=num_layers, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
        num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads or cfg.num_attention_heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        rms_eps=cfg.rms_norm_eps, num_experts=cfg.num_local_experts, top_k=cfg.num_experts_per_tok,
        expert_intermediate=cfg.intermediate_size, norm_topk_prob=False, moe_layers=tuple(cfg.moe_layers),
        dense_intermediate=cfg.intermediate_size_mlp, shared_expert_intermediate=cfg.intermediate_size,
        qk_norm="none", clip_qkv=None, sliding_windows=(None,) * num_layers,
        tie_word_embeddings=bool(cfg.tie_word_embeddings), eos_token_ids=as_ids(getattr(cfg, "eos_token_id", None)),
        max_position_embeddings=cfg.max_position_embeddings, rope_type=rope.get("rope_type", "default"),
        rope_theta=float(rope.get("rope_theta", 10000.0)), cfg=cfg)


def state_specs(spec: ModelSpec) -> list[dict[str, StateSpec]]:
    """Keys and values per layer, as the standard families keep them (chunked layers too)."""
    return standard.state_specs(spec)


class Llama4Attention(Attention):
    """RoPE layers: rope, then an L2 norm of q and k (use_qk_norm), chunked attention (`chunk`). NoPE layers: no rope,
    queries scaled by log1p(floor((p + 1) / floor_scale)) * attn_scale + 1 at position p (attn_temperature_tuning).
    Its mask differs from the pieces the GPU kernels check, so none attach (the reference core runs)."""

    takes_kernels = False

    def __init__(self, layer: int, w: dict[str, torch.Tensor], spec: ModelSpec, rope):
        cfg = spec.cfg
        super().__init__(layer, w, f"model.layers.{layer}.self_attn.", num_heads=spec.num_heads,
                         num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, rope=rope, eps=spec.rms_eps)
        self.eps, self.uses_rope = spec.rms_eps, bool(cfg.no_rope_layers[layer])
        self.is_l2_normed = self.uses_rope and cfg.use_qk_norm
        self.chunk = cfg.attention_chunk_size if cfg.layer_types[layer] == "chunked_attention" else None
        is_tuned = cfg.attn_temperature_tuning and not self.uses_rope
        self.temperature = (cfg.floor_scale, cfg.attn_scale) if is_tuned else None

    def __call__(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        # T = tokens, Hq / Hkv = query / kv heads, D = head dim, S = positions held
        q = linear(x, *self.q).view(-1, self.num_heads, self.head_dim)                 # [T, Hq, D]
        k = linear(x, *self.k).view(-1, self.num_kv_heads, self.head_dim)              # [T, Hkv, D]
        v = linear(x, *self.v).view(-1, self.num_kv_heads, self.head_dim)
        if self.uses_rope:                                       # in float32, cast back (its complex product)
            cos, sin = self.rope.cos_sin(step)
            q, k = (t.to(x.dtype) for t in rope_pair(q.float(), k.float(), cos, sin))
        if self.is_l2_normed:
            q, k = (rms_normalized(t, self.eps).to(t.dtype) for t in (q, k))
        if self.temperature is not None:
            floor_scale, attn_scale = self.temperature
            scales = torch.log1p(torch.floor((step.positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0   # [T]
            q = (q * scales[:, None, None]).to(q.dtype)
        keys = step.state.append(self.layer, "k", step.positions, step.start, k)     # [S, Hkv, D]
        values = step.state.append(self.layer, "v", step.positions, step.start, v)
        return linear(attention(q, keys, values, step.positions, chunk=self.chunk), *self.o)   # [T, H]


class Llama4Router:
    """The top-k of the router's logits, each scored sigmoid(logit) (computed in float32, cast back)."""

    best_first = True               # torch.topk: sorted

    def __init__(self, weight: torch.Tensor, top_k: int):
        self.weight, self.top_k = weight, top_k

    def __call__(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # h [T, H] -> scores [T, K] (h's dtype), expert ids [T, K]
        logits, ids = linear(h, self.weight).topk(self.top_k, dim=-1)
        return torch.sigmoid(logits.float()).to(h.dtype), ids


class Llama4Block(Block):
    """Its routed experts run on rows of their own: token t's input scaled by its k-th score, weight 1."""

    def __init__(self, *args, top_k: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.expert_rows_per_token = top_k

    def expert_rows(self, h: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor):
        # T = tokens, K = choices a token, H = hidden -> rows [T*K, H], weights [T*K, 1] (ones), ids [T*K, 1]
        rows = (h[:, None, :] * weights[..., None]).reshape(-1, h.shape[-1])
        return rows, torch.ones(rows.shape[0], 1, dtype=weights.dtype, device=h.device), ids.reshape(-1, 1)

    def combine(self, x: torch.Tensor, h: torch.Tensor, moe_out: torch.Tensor | None) -> torch.Tensor:
        if moe_out is None:
            return x + self.mlp(h)
        routed = moe_out.view(h.shape[0], -1, h.shape[-1]).sum(1)                      # [T*K, H] -> [T, H]
        return (x + (routed + self.shared(h))).to(x.dtype)


def build(spec: ModelSpec, w: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device) -> Model:
    inv_freq, scaling = rope_frequencies(spec.cfg)
    rope = Rope(inv_freq.to(device), scaling, torch.float32)            # float32 tables: the rope runs in float32
    deinterleave_rope_rows(w, spec)
    blocks = []
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        attn = Llama4Attention(layer, w, spec, rope)
        norms = (w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"], spec.rms_eps)
        if not spec.is_moe_layer(layer):
            blocks.append(Llama4Block(attn, *norms, mlp=Mlp(w, p + "mlp."), top_k=spec.top_k))
            continue
        router = Llama4Router(w[p + "mlp.router.weight"], spec.top_k)
        blocks.append(Llama4Block(attn, *norms, router=router, shared=Mlp(w, p + "mlp.shared_expert."),
                                  top_k=spec.top_k))
    return standard.assemble(spec, w, blocks)


def param_counts(config: dict) -> ModelShape:
    """The estimate's parameter counts (engine.model.param_counts), with transformers' defaults for what config.json
    leaves out (moe_layers from interleave_moe_layer_step)."""
    from engine.model.spec import hf_config
    cfg = hf_config(config).get_text_config()
    return moe_shape({**cfg.to_dict(), "model_type": config["model_type"]}, _adjust_counts)


def _adjust_counts(config: dict, p: Parts) -> None:
    p.moe_layer_ids = list(config["moe_layers"])
    p.I_dense = config["intermediate_size_mlp"]
    p.shared = 3 * p.H * config["intermediate_size"]              # the shared expert (no gate)
