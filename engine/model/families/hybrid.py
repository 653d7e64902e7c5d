"""qwen3_next, qwen3_5_moe (text model): Gated-DeltaNet hybrids with a softmax top-k MoE.

Each layer mixes tokens either with a Gated DeltaNet (fixed-size conv + recurrent state, see
engine.model.deltanet) or with gated full attention (q projection carries a per-head output gate,
sigmoid(gate) * attention before o_proj; per-head q/k norm; rotary on the first rotary_dim dims
of a head). Every RMSNorm outside the DeltaNet's gated norm scales by (1 + w). The MoE block is the
softmax top-k router plus a sigmoid-gated shared expert. Checkpoint quirks are fixed at load:
Qwen3-Next's head-interleaved in_proj_qkvz / in_proj_ba become Qwen3.5's in_proj_qkv, in_proj_z,
in_proj_b, in_proj_a, so one code path runs both; Qwen3.5's vision tower is skipped at repack.
"""
from __future__ import annotations

import torch

from engine.model import deltanet
from kernels.deltanet_ref import decay_and_beta, deltanet_decode_ref, gated_rms_norm
from engine.model.block import Attention, Block, Mlp, Rope, Router, Step
from engine.model.dense_quant import take_rows
from engine.model.hybrid_spec import HybridDims, read_hybrid_dims
from engine.model.layers import Packed, RmsNorm, attention, linear, rope_pair
from engine.model.model import Model
from engine.model.rotary import rope_frequencies
from engine.model.spec import ModelSpec, as_ids
from kernels.norms import grouped_norm_ref
from engine.model.state import StateSpec
from engine.model.param_counts import ModelShape, Parts, moe_shape

# What `dense_quant` may keep as int8 (engine.model.dense_quant): the projections only `linear` multiplies
# by (gated attention, the DeltaNet's qkv(z) and output, dense MLPs and shared experts), the head and the
# embedding table. The small ones (in_proj_ba / _a / _b, conv, routers, shared_expert_gate) stay exact.
# Names as the Sluice dir stores them (Qwen3.5's `model.language_model.` is `model.` there).
DENSE_INT8 = (r"^model\.embed_tokens\.weight$|^lm_head\.weight$|\.self_attn\.[qkvo]_proj\.weight$"
              r"|\.linear_attn\.(in_proj_qkvz|in_proj_qkv|in_proj_z|out_proj)\.weight$"
              r"|\.mlp\.(shared_expert\.)?(gate|up|down)_proj\.weight$")


def read_spec(cfg) -> ModelSpec:
    family = cfg.model_type
    if family == "qwen3_5_moe":
        cfg = cfg.text_config            # the text model only
    num_layers, num_experts = cfg.num_hidden_layers, cfg.num_experts
    if family == "qwen3_next":
        mlp_only = set(cfg.mlp_only_layers or [])
        moe_layers = tuple(i for i in range(num_layers)
                           if i not in mlp_only and num_experts > 0 and (i + 1) % cfg.decoder_sparse_step == 0)
    else:
        moe_layers = tuple(range(num_layers))
    read_hybrid_dims(cfg)                # refuses unknown layer types early
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    return ModelSpec(
        family=family, num_layers=num_layers, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
        num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads or cfg.num_attention_heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        rms_eps=cfg.rms_norm_eps, num_experts=num_experts, top_k=cfg.num_experts_per_tok,
        expert_intermediate=cfg.moe_intermediate_size,
        norm_topk_prob=bool(getattr(cfg, "norm_topk_prob", True)),    # Qwen3.5 always renormalises
        moe_layers=moe_layers, dense_intermediate=getattr(cfg, "intermediate_size", 0),
        shared_expert_intermediate=cfg.shared_expert_intermediate_size, qk_norm="head", clip_qkv=None,
        sliding_windows=(None,) * num_layers, tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        eos_token_ids=as_ids(getattr(cfg, "eos_token_id", None)), max_position_embeddings=cfg.max_position_embeddings,
        rope_type=rope.get("rope_type", "default"), rope_theta=float(rope.get("rope_theta", 10000.0)), cfg=cfg)


def dims(spec: ModelSpec) -> HybridDims:
    return read_hybrid_dims(spec.cfg)


def state_specs(spec: ModelSpec) -> list[dict[str, StateSpec]]:
    """Per-layer state from the config alone (the estimate uses it): KV for attention layers, fixed
    DeltaNet state for the others."""
    d = dims(spec)
    return [GatedDeltaNet.specs(d) if d.is_linear(layer) else Attention.specs(spec.num_kv_heads, spec.head_dim)
            for layer in range(spec.num_layers)]


class OffsetRmsNorm(RmsNorm):
    """RMSNorm scaled by (1 + w), computed in float32 and cast back (as the reference rounds): one group of the
    grouped norm, whose scale (1 + w in float32) is made once here; `kernel` (kernels/rms_norm.grouped_norm_kernel)
    where engine.runtime.attach set it."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__(weight, eps)
        self.scale = 1.0 + weight.float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (self.kernel or grouped_norm_ref)(x, self.scale, self.scale.shape[-1], self.eps)


def split_qwen3_next_projections(weights: dict[str, torch.Tensor | Packed], d: HybridDims) -> None:
    """Qwen3-Next's fused DeltaNet input projections -> Qwen3.5's separate ones (rows reordered, in place;
    int8 weights too: their codes and row scales move together).

    in_proj_qkvz rows are grouped per key head: [q_i, k_i, v of its value heads, z of its value heads];
    in_proj_ba rows likewise [b of its value heads, a of its value heads]."""
    nk, dk, per_group = d.num_k_heads, d.k_head_dim, d.num_v_heads // d.num_k_heads * d.v_head_dim
    for name in [n for n in weights if n.endswith("linear_attn.in_proj_qkvz.weight")]:
        p = name.removesuffix("in_proj_qkvz.weight")
        qkvz, ba = weights.pop(name), weights.pop(p + "in_proj_ba.weight")
        rows = torch.arange(qkvz.shape[0]).view(nk, -1)                 # [nk, rows per key head]: row ids
        q, k, v, z = rows.split([dk, dk, per_group, per_group], dim=1)
        weights[p + "in_proj_qkv.weight"] = take_rows(qkvz, torch.cat([q.flatten(), k.flatten(), v.flatten()]))
        weights[p + "in_proj_z.weight"] = take_rows(qkvz, z.flatten())
        b, a = torch.arange(ba.shape[0]).view(nk, -1).chunk(2, dim=1)
        weights[p + "in_proj_b.weight"] = take_rows(ba, b.flatten())
        weights[p + "in_proj_a.weight"] = take_rows(ba, a.flatten())


class GatedAttention:
    """GQA with a sigmoid output gate per query head, (1 + w) q/k norm per head, partial rotary.
    KV goes to the step's state as "k" and "v". `rope_kernel` / `attention_kernel`: as Attention's."""

    def __init__(self, layer: int, w: dict[str, torch.Tensor], prefix: str, spec: ModelSpec, rope: Rope):
        self.layer, self.rope = layer, rope
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q, self.k, self.v, self.o = ((w[f"{prefix}{n}_proj.weight"], w.get(f"{prefix}{n}_proj.bias")) for n in "qkvo")
        self.q_norm, self.k_norm = (OffsetRmsNorm(w[prefix + n], spec.rms_eps)
                                    for n in ("q_norm.weight", "k_norm.weight"))
        self.rope_kernel = self.attention_kernel = None

    def state_specs(self) -> dict[str, StateSpec]:
        return Attention.specs(self.num_kv_heads, self.head_dim)

    def __call__(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        # T = tokens, Hq / Hkv = query / kv heads, D = head dim
        q, gate = linear(x, *self.q).view(-1, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)   # [T, Hq, D] x2
        k = linear(x, *self.k).view(-1, self.num_kv_heads, self.head_dim)
        v = linear(x, *self.v).view(-1, self.num_kv_heads, self.head_dim)
        q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = self.rope.cos_sin(step)
        q, k = (self.rope_kernel or rope_pair)(q, k, cos, sin)              # the first R dims of a head rotate
        keys = step.state.append(self.layer, "k", step.positions, step.start, k)
        values = step.state.append(self.layer, "v", step.positions, step.start, v)
        out = (self.attention_kernel or attention)(q, keys, values, step.positions, None)    # [T, Hq*D]
        return linear(out * torch.sigmoid(gate.reshape(out.shape)), *self.o)


class GatedDeltaNet:
    """Short causal conv over q, k, v, then the gated delta rule (chunked for a prompt, one recurrent
    step for one token: static shapes, state updated in place), gated RMSNorm, out_proj. A decode token's step
    and norm run as `decode_kernel` where engine.runtime.attach set it."""

    def __init__(self, layer: int, w: dict[str, torch.Tensor], prefix: str, d: HybridDims, eps: float):
        self.layer, self.d, self.eps = layer, d, eps
        self.in_qkv, self.in_z = w[prefix + "in_proj_qkv.weight"], w[prefix + "in_proj_z.weight"]
        self.in_a, self.in_b = w[prefix + "in_proj_a.weight"], w[prefix + "in_proj_b.weight"]
        self.conv = w[prefix + "conv1d.weight"].view(d.conv_channels, -1)               # [C, K]
        self.a_log, self.dt_bias = w[prefix + "A_log"], w[prefix + "dt_bias"]
        self.norm, self.out = w[prefix + "norm.weight"], w[prefix + "out_proj.weight"]
        self.activation = "silu"        # the output gate's (deltanet_ref.GATE_ACTIVATIONS)
        self.decode_kernel = None       # kernels.deltanet_decode (deltanet_decode_ref's signature), attached at load

    @staticmethod
    def specs(d: HybridDims) -> dict[str, StateSpec]:
        """Fixed size: the conv window (compute dtype) and the recurrent state (float32)."""
        return {"conv": StateSpec((d.conv_channels, d.conv_kernel - 1), per_token=False),
                "recurrent": StateSpec((d.num_v_heads, d.k_head_dim, d.v_head_dim), per_token=False, dtype=torch.float32)}

    def state_specs(self) -> dict[str, StateSpec]:
        return self.specs(self.d)

    def __call__(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        # T = tokens, Hk / Hv = key / value heads, Dk / Dv = their dims, C = conv channels
        d, T = self.d, x.shape[0]
        qkv = deltanet.causal_conv(linear(x, self.in_qkv), step.state.fixed(self.layer, "conv"), self.conv)   # [T, C]
        key_dim = d.num_k_heads * d.k_head_dim
        q, k, v = qkv.split([key_dim, key_dim, d.num_v_heads * d.v_head_dim], dim=-1)
        q, k = q.view(T, d.num_k_heads, d.k_head_dim), k.view(T, d.num_k_heads, d.k_head_dim)
        v = v.view(T, d.num_v_heads, d.v_head_dim)
        a, b = linear(x, self.in_a), linear(x, self.in_b)                               # [T, Hv]
        z = linear(x, self.in_z).view(T, d.num_v_heads, d.v_head_dim)
        state = step.state.fixed(self.layer, "recurrent")                               # [Hv, Dk, Dv], in place
        if T == 1:          # the decay, the step and the gated norm: one launch where the kernel is attached
            out = (self.decode_kernel or deltanet_decode_ref)(q, k, v, a, b, self.a_log, self.dt_bias, state, z,
                                                              self.norm, self.eps, self.activation)
        else:
            g, beta = decay_and_beta(a, b, self.a_log, self.dt_bias)
            out = gated_rms_norm(deltanet.chunked_delta_rule(q, k, v, g, beta, state), z, self.norm, self.eps,
                                 self.activation)                                     # [T, Hv, Dv]
        return linear(out.reshape(T, -1), self.out)


class OffsetNormBlock(Block):
    """Block with (1 + w) pre- and post-norms."""
    norm_type = OffsetRmsNorm


class HybridModel(Model):
    norm_type = OffsetRmsNorm


def build(spec: ModelSpec, w: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device) -> Model:
    d = dims(spec)
    if spec.family == "qwen3_next":
        split_qwen3_next_projections(w, d)
    inv_freq, scaling = rope_frequencies(spec.cfg)       # partial rotary: covers rotary_dim only
    rope = Rope(inv_freq.to(device), scaling, dtype)
    blocks = []
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        mixer = GatedDeltaNet(layer, w, p + "linear_attn.", d, spec.rms_eps) if d.is_linear(layer) \
            else GatedAttention(layer, w, p + "self_attn.", spec, rope)
        norms = (w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"], spec.rms_eps)
        if not spec.is_moe_layer(layer):
            blocks.append(OffsetNormBlock(mixer, *norms, mlp=Mlp(w, p + "mlp.")))
            continue
        router = Router(w[p + "mlp.gate.weight"], spec.top_k, spec.norm_topk_prob)
        shared = Mlp(w, p + "mlp.shared_expert.", gate=w[p + "mlp.shared_expert_gate.weight"])
        blocks.append(OffsetNormBlock(mixer, *norms, router=router, shared=shared))
    embed = w["model.embed_tokens.weight"]
    return HybridModel(spec, blocks, embed, w["model.norm.weight"], w.get("lm_head.weight", embed), spec.rms_eps)


def param_counts(config: dict) -> ModelShape:
    """The estimate's parameter counts (engine.model.param_counts): DeltaNet layers between gated attention."""
    return moe_shape(config, _adjust_counts)


def _adjust_counts(config: dict, p: Parts) -> None:
    full_attention = p.attn + p.nh * p.hd * p.H + 2 * p.hd            # q_proj doubled (output gate), q/k norm
    H, kernel = config["hidden_size"], config.get("linear_conv_kernel_dim", 4)
    key, value, nv = _deltanet_widths(config)
    deltanet = (H * (2 * key + 2 * value + 2 * nv)                   # in_proj q, k, v, z, b, a
                + (2 * key + value) * kernel + 2 * nv                # conv1d, A_log, dt_bias
                + value // nv + value * H)                           # gated norm, out_proj
    # int8 dense weights leave exact (DENSE_INT8): the DeltaNet's b/a projections, conv, A_log, dt_bias and gated
    # norm; the attention's q/k norms
    deltanet_exact = 2 * H * nv + (2 * key + value) * kernel + 2 * nv + value // nv
    is_full = [t == "full_attention" for t in _layer_types(config)]
    p.mixers = sum(full_attention if full else deltanet for full in is_full)
    p.exact_extra += sum(2 * p.hd if full else deltanet_exact for full in is_full)


def _layer_types(config: dict) -> list[str]:
    interval = config.get("full_attention_interval") or 4
    return config.get("layer_types") or ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                         for i in range(config["num_hidden_layers"])]


def _deltanet_widths(config: dict) -> tuple[int, int, int]:
    """(key width, value width, value heads) of a DeltaNet layer."""
    nv = config.get("linear_num_value_heads", 32)
    return (config.get("linear_num_key_heads", 16) * config.get("linear_key_head_dim", 128),
            nv * config.get("linear_value_head_dim", 128), nv)
