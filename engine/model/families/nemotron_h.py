"""nemotron_h (Nemotron-H, e.g. Nemotron-3-Nano-30B-A3B): a hybrid whose every layer is one pre-norm residual
x + f(norm(x)), f one of four kinds (`layers_block_type`, or the Hub's `hybrid_override_pattern` M E * -):
  linear_attention  a Mamba-2 mixer (engine.model.mamba2): in_proj -> z, xBC, dt; causal conv + SiLU over xBC;
                    the selective scan; an RMSNorm per group gated by z; out_proj. Fixed-size conv and ssm state.
  full_attention    GQA without any position encoding (the Mamba-2 layers carry the order)
  moe               DeepSeek-V3's router (sigmoid scores, correction bias, expert groups, scaling), ungated relu²
                    experts down(relu(up x)²) and one relu² shared expert
  mlp               a dense relu² MLP
Checkpoints name the text model `backbone.` (its embedding `embeddings`, its final norm `norm_f`); repack renames
them to every family's `model.`, `model.embed_tokens`, `model.norm` (engine.model.nemotron_names). A layer's module is `mixer`
whatever its kind, as there.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import SluiceError
from engine.model import deltanet, mamba2
from engine.model.block import Attention, Block, Step
from engine.model.families.deepseek_style import RouterPiece
from engine.model.layers import attention, linear
from engine.model.model import Model, table_in_file
from engine.model.param_counts import ModelShape
from engine.model.routers import GroupedRouter
from engine.model.spec import ModelSpec, as_ids
from engine.model.state import StateSpec
from kernels.activation import RELU2

MAMBA, ATTENTION, MOE, MLP = "linear_attention", "full_attention", "moe", "mlp"
# What `dense_quant` may keep as int8 (engine.model.dense_quant): the projections only `linear` multiplies by (Mamba's
# in/out, attention, MLPs and shared experts), the head and the embedding table (the Sluice dir's name and transformers'
# `embeddings`: a reference quantises the same tensors). Routers, convs, A_log, D, dt_bias and norms stay exact.
DENSE_INT8 = (r"^model\.(embed_tokens|embeddings)\.weight$|^lm_head\.weight$"
              r"|\.mixer\.([qkvo]_proj|in_proj|out_proj|(shared_experts\.)?(up|down)_proj)\.weight$")


def refuse_unhandled(config: dict) -> None:
    """One sentence for a config Sluice cannot run exactly (raw config.json, before transformers reads it)."""
    if config.get("moe_latent_size"):
        raise SluiceError("This Nemotron-H model's experts work in a latent width apart from the hidden size "
                          "(moe_latent_size), which Sluice does not run yet.")
    biased = [key for key in ("mlp_bias", "use_bias", "attention_bias") if config.get(key)]
    if biased:
        raise SluiceError(f"This Nemotron-H model has projection biases ({', '.join(biased)}), which Sluice does not "
                          "run.")
    acts = {"mlp_hidden_act": "relu2", "mamba_hidden_act": "silu"}
    odd = [f"{key} '{config[key]}'" for key, act in acts.items() if config.get(key, act) != act]
    if odd:
        raise SluiceError(f"This Nemotron-H model uses {', '.join(odd)}; Sluice runs Nemotron-H with relu2 MLPs and "
                          "a SiLU Mamba-2 convolution.")


@dataclass(frozen=True)
class MambaDims:
    num_heads: int
    head_dim: int
    groups: int            # B and C are shared by num_heads / groups heads; the gated norm works per group
    state_size: int        # N
    conv_kernel: int
    chunk: int             # prefill scans this many tokens at a time
    dt_floor: float        # prefill clamps dt to at least this (time_step_min)

    @property
    def inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        return self.inner + 2 * self.groups * self.state_size

    @classmethod
    def from_config(cls, cfg) -> "MambaDims":
        if cfg.mamba_num_heads % cfg.n_groups:
            raise SluiceError("This Nemotron-H model's Mamba heads are not a multiple of its groups (n_groups); the "
                              "config.json is damaged.")
        return cls(cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.n_groups, cfg.ssm_state_size, cfg.conv_kernel,
                   cfg.chunk_size, float(cfg.time_step_min))


def read_spec(cfg) -> ModelSpec:
    types = tuple(cfg.layers_block_type)
    MambaDims.from_config(cfg)                    # refuses inconsistent Mamba sizes early
    router = GroupedRouter.from_config(cfg)       # DeepSeek-V3's, read from the same config names
    router.check(cfg.n_routed_experts)
    return ModelSpec(
        family=cfg.model_type, num_layers=len(types), hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
        num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads or cfg.num_attention_heads,
        head_dim=cfg.head_dim, rms_eps=cfg.layer_norm_epsilon, num_experts=cfg.n_routed_experts,
        top_k=cfg.num_experts_per_tok, expert_intermediate=cfg.moe_intermediate_size,
        norm_topk_prob=router.renormalize, moe_layers=tuple(i for i, t in enumerate(types) if t == MOE),
        dense_intermediate=cfg.intermediate_size, shared_expert_intermediate=cfg.moe_shared_expert_intermediate_size,
        qk_norm="none", clip_qkv=None, sliding_windows=(None,) * len(types),
        tie_word_embeddings=bool(cfg.tie_word_embeddings), eos_token_ids=as_ids(getattr(cfg, "eos_token_id", None)),
        max_position_embeddings=cfg.max_position_embeddings, rope_type="none", rope_theta=10000.0,   # no rope: unused
        cfg=cfg)


def state_specs(spec: ModelSpec) -> list[dict[str, StateSpec]]:
    """Per-layer state from the config alone (the estimate uses it): fixed Mamba-2 state, KV for attention, none for
    the MoE and MLP layers."""
    d = MambaDims.from_config(spec.cfg)
    kinds = {MAMBA: Mamba2Mixer.specs(d), ATTENTION: Attention.specs(spec.num_kv_heads, spec.head_dim)}
    return [kinds.get(t, {}) for t in spec.cfg.layers_block_type]


class Mamba2Mixer:
    """in_proj -> z, xBC, dt; causal conv (+ bias) and SiLU over xBC; the selective scan (chunked for a prompt, one
    recurrent step for one token: static shapes, state updated in place); gated RMSNorm per group; out_proj."""

    def __init__(self, layer: int, w: dict[str, torch.Tensor], prefix: str, d: MambaDims, eps: float):
        self.layer, self.d, self.eps = layer, d, eps
        self.in_proj, self.out_proj = w[prefix + "in_proj.weight"], w[prefix + "out_proj.weight"]
        self.conv, self.conv_bias = w[prefix + "conv1d.weight"].view(d.conv_channels, -1), w.get(prefix + "conv1d.bias")
        self.a = -torch.exp(w[prefix + "A_log"].float())                                  # A [Hs], negative
        self.skip, self.dt_bias, self.norm = w[prefix + "D"], w[prefix + "dt_bias"], w[prefix + "norm.weight"]

    @staticmethod
    def specs(d: MambaDims) -> dict[str, StateSpec]:
        """Fixed size: the conv window (compute dtype) and the ssm state (float32)."""
        return {"conv": StateSpec((d.conv_channels, d.conv_kernel - 1), per_token=False),
                "ssm": StateSpec((d.num_heads, d.head_dim, d.state_size), per_token=False, dtype=torch.float32)}

    def state_specs(self) -> dict[str, StateSpec]:
        return self.specs(self.d)

    def __call__(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        # T = tokens, I = Hs*P inner width, C = conv channels (x, B, C), Hs = heads, P = head dim, G = groups
        d, T = self.d, x.shape[0]
        z, xbc, dt = linear(x, self.in_proj).split([d.inner, d.conv_channels, d.num_heads], dim=-1)  # [T, I|C|Hs]
        xbc = deltanet.causal_conv(xbc, step.state.fixed(self.layer, "conv"), self.conv, self.conv_bias)
        xs, b, c = xbc.split([d.inner, d.groups * d.state_size, d.groups * d.state_size], dim=-1)
        xs, b, c = xs.view(T, d.num_heads, d.head_dim), b.view(T, d.groups, -1), c.view(T, d.groups, -1)
        ssm = step.state.fixed(self.layer, "ssm")
        if T == 1:
            y = mamba2.recurrent_step(xs, mamba2.time_steps(dt, self.dt_bias), self.a, b, c, self.skip, ssm)
        else:
            dt = mamba2.time_steps(dt, self.dt_bias, d.dt_floor)
            y = mamba2.chunked_scan(xs, dt, self.a, b, c, self.skip, ssm, d.chunk)       # [T, Hs, P]
        y = mamba2.gated_group_rms_norm(y.reshape(T, -1), z, self.norm, d.groups, self.eps)
        return linear(y.to(x.dtype), self.out_proj)


class PlainAttention(Attention):
    """GQA with no position encoding: no rope, no q/k norm. KV goes to the step's state as "k" and "v"."""

    def __call__(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        # T = tokens, Hq / Hkv = query / kv heads, D = head dim, S = positions held
        q = linear(x, *self.q).view(-1, self.num_heads, self.head_dim)                 # [T, Hq, D]
        k = linear(x, *self.k).view(-1, self.num_kv_heads, self.head_dim)              # [T, Hkv, D]
        v = linear(x, *self.v).view(-1, self.num_kv_heads, self.head_dim)
        keys = step.state.append(self.layer, "k", step.positions, step.start, k)     # [S, Hkv, D]
        values = step.state.append(self.layer, "v", step.positions, step.start, v)
        return linear((self.attention_kernel or attention)(q, keys, values, step.positions, None), *self.o)


class Relu2Mlp:
    """down(relu(up h)²): a dense layer's MLP or the shared expert."""

    def __init__(self, w: dict[str, torch.Tensor], prefix: str):
        self.up, self.down = w[prefix + "up_proj.weight"], w[prefix + "down_proj.weight"]

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return linear(RELU2(None, linear(h, self.up)), self.down)


def relu2_expert(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """One routed expert: x [T, H] and its dequantised up [I, H], down [H, I] -> [T, H]."""
    return linear(RELU2(None, linear(x, w["up"])), w["down"])


class NemotronBlock(Block):
    """One layer, x + f(norm(x)). A mixer (Mamba-2, attention) adds its output in `mix`; the MoE and MLP layers hand
    norm(x) to the runtime as h and add theirs in `combine` (the MoE: routed experts + shared expert)."""

    def __init__(self, norm: torch.Tensor, eps: float, *, mixer=None, router=None, shared=None, mlp=None):
        self.norm = self.norm_type(norm, eps)
        self.mixer, self.router, self.shared, self.mlp = mixer, router, shared, mlp
        self.is_moe = router is not None

    def state_specs(self) -> dict[str, StateSpec]:
        return {} if self.mixer is None else self.mixer.state_specs()

    def mix(self, x: torch.Tensor, step: Step) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.mixer is None:
            return x, self.norm(x)
        return x + self.mixer(self.norm(x), step), None

    def combine(self, x: torch.Tensor, h: torch.Tensor | None, moe_out: torch.Tensor | None) -> torch.Tensor:
        if moe_out is not None:
            return super().combine(x, h, moe_out)
        return x if self.mlp is None else x + self.mlp(h)


def build(spec: ModelSpec, w: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device) -> Model:
    cfg = spec.cfg
    d, router = MambaDims.from_config(cfg), GroupedRouter.from_config(cfg)
    blocks = []
    for layer, kind in enumerate(cfg.layers_block_type):
        p = f"model.layers.{layer}."
        norm, m = (w[p + "norm.weight"], spec.rms_eps), p + "mixer."
        if kind == MAMBA:
            blocks.append(NemotronBlock(*norm, mixer=Mamba2Mixer(layer, w, m, d, cfg.layer_norm_epsilon)))
        elif kind == ATTENTION:
            blocks.append(NemotronBlock(*norm, mixer=PlainAttention(
                layer, w, m, num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                rope=None, eps=spec.rms_eps)))
        elif kind == MOE:
            route = RouterPiece(router, w[m + "gate.weight"], w[m + "gate.e_score_correction_bias"])
            blocks.append(NemotronBlock(*norm, router=route, shared=Relu2Mlp(w, m + "shared_experts.")))
        else:
            blocks.append(NemotronBlock(*norm, mlp=Relu2Mlp(w, m)))
    embed = w["model.embed_tokens.weight"]
    return Model(spec, blocks, embed, w["model.norm.weight"], w.get("lm_head.weight", embed), spec.rms_eps,
                 expert_mlp=relu2_expert, expert_kernel=RELU2)


def param_counts(config: dict) -> ModelShape:
    """The estimate's parameter counts (engine.model.param_counts), each layer's by its kind, with transformers'
    defaults for what config.json leaves out (the layer pattern, the Mamba sizes)."""
    from engine.model.spec import hf_config
    cfg = hf_config(config)
    spec, d = read_spec(cfg), MambaDims.from_config(cfg)
    H, V, E, I, nh, nkv, hd = (cfg.hidden_size, cfg.vocab_size, spec.num_experts, spec.expert_intermediate,
                               spec.num_heads, spec.num_kv_heads, spec.head_dim)
    mamba = (H * (d.inner + d.conv_channels + d.num_heads) + d.conv_channels * d.conv_kernel      # in_proj, conv1d
             + (d.conv_channels if cfg.use_conv_bias else 0) + 3 * d.num_heads + d.inner + d.inner * H)
    dense = {MAMBA: mamba, ATTENTION: 2 * H * nh * hd + 2 * H * nkv * hd, MLP: 2 * H * cfg.intermediate_size,
             MOE: E * H + E + 2 * H * spec.shared_expert_intermediate}    # router + its bias, shared expert
    # what int8 dense weights leave exact (DENSE_INT8): each layer's norm and the final one, Mamba's small tensors
    exact = {MAMBA: mamba - H * (d.inner + d.conv_channels + d.num_heads) - d.inner * H, MOE: E * H + E}
    types = cfg.layers_block_type
    embedding = V * H
    dense_params = sum(dense[t] + H for t in types) + H + embedding + (0 if spec.tie_word_embeddings else V * H)
    expert, moe = 2 * H * I, len(spec.moe_layers)
    return ModelShape(spec.family, spec.num_layers, moe, E, spec.top_k, H, I, V, dense_params + moe * E * expert,
                      dense_params + moe * spec.top_k * expert, dense_params, embedding,
                      exact_params=sum(exact.get(t, 0) + H for t in types) + H,
                      embedding_in_file=table_in_file(spec.family, tied=spec.tie_word_embeddings),
                      has_expert_gate=False)
