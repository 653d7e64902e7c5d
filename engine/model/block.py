"""One decoder layer as the runtime drives it, and the standard pieces families assemble it from.

The runtime runs every family the same way, for a prompt (T tokens) and for a one-token CUDA-graph
decode step alike:

    x, h = block.mix(x, step)             # token mixer (attention, ...) with its residual; h = MoE/MLP input
    weights, ids = block.route(h)         # MoE layers: [T, K] routing weights and expert ids
    rows, weights, ids = block.expert_rows(h, weights, ids)   # the experts' input: h itself, or Llama 4's rows
    moe_out = <routed experts on rows>    # the runtime: wherever the experts live
    x = block.combine(x, h, moe_out)      # residual add (+ shared expert); dense layers: moe_out=None

`x` is opaque to the runtime (a family may carry several residual streams). Weights are plain
tensors fixed at load time; a piece never branches on checkpoint format.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.model.layers import RmsNorm, attention, linear, rope_cos_sin, rope_pair, swiglu_mlp
from kernels.softmax_topk import router_ref
from engine.model.state import ModelState, StateSpec


class Step:
    """The tokens a forward pass runs on: positions [T] (device), `start` (the first position, known
    on the host; None inside a CUDA graph, where state is static) and the conversation's state. `decode`:
    a decode step's, whose host inputs (qwen4_exp's n-gram rows) the model's decode hooks put in static buffers."""

    def __init__(self, positions: torch.Tensor, start: int | None, state: ModelState, decode: bool = False):
        self.positions, self.start, self.state, self.decode = positions, start, state, decode
        self._memo: dict = {}

    def memo(self, key, make):
        """A value computed once per step (e.g. rope cos/sin shared by every layer)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]


class Rope:
    def __init__(self, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype):
        self.inv_freq, self.scaling, self.dtype = inv_freq, scaling, dtype

    def cos_sin(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        return step.memo(("rope", id(self)), lambda: rope_cos_sin(step.positions, self.inv_freq, self.scaling, self.dtype))


class Attention:
    """Grouped-query attention with RoPE; optional q/k norm (per head or over the projection),
    qkv clipping, biases, a sliding window and sinks (gpt-oss: `sinks` [Hq] in the checkpoint).
    KV goes to the step's state as "k" and "v". `rope_kernel` / `attention_kernel`: GPU kernels of rope_pair's /
    attention's signature, attached at load (engine/runtime/attach.py)."""

    def __init__(self, layer: int, w: dict[str, torch.Tensor], prefix: str, *, num_heads: int, num_kv_heads: int,
                 head_dim: int, rope: Rope, eps: float, qk_norm: str = "none", clip_qkv: float | None = None,
                 window: int | None = None):
        self.layer, self.rope = layer, rope
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.qk_norm, self.clip_qkv, self.window = qk_norm, clip_qkv, window
        self.q, self.k, self.v, self.o = ((w[f"{prefix}{n}_proj.weight"], w.get(f"{prefix}{n}_proj.bias")) for n in "qkvo")
        self.q_norm, self.k_norm = (RmsNorm(w[prefix + n], eps) if prefix + n in w else None
                                    for n in ("q_norm.weight", "k_norm.weight"))
        self.sinks = w.get(prefix + "sinks")
        self.rope_kernel = self.attention_kernel = None

    @staticmethod
    def specs(num_kv_heads: int, head_dim: int) -> dict[str, StateSpec]:
        """What one layer keeps per token: its keys and values."""
        return {"k": StateSpec((num_kv_heads, head_dim)), "v": StateSpec((num_kv_heads, head_dim))}

    def state_specs(self) -> dict[str, StateSpec]:
        return self.specs(self.num_kv_heads, self.head_dim)

    def __call__(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        # T = tokens, Hq / Hkv = query / kv heads, D = head dim, S = positions held
        q, k, v = linear(x, *self.q), linear(x, *self.k), linear(x, *self.v)       # [T, Hq*D], [T, Hkv*D] x2
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        if self.clip_qkv is not None:
            q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) for t in (q, k, v))
        q = q.view(-1, self.num_heads, self.head_dim)                                 # [T, Hq, D]
        k = k.view(-1, self.num_kv_heads, self.head_dim)                              # [T, Hkv, D]
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = self.rope.cos_sin(step)
        q, k = (self.rope_kernel or rope_pair)(q, k, cos, sin)
        keys = step.state.append(self.layer, "k", step.positions, step.start, k)     # [S, Hkv, D]
        values = step.state.append(self.layer, "v", step.positions, step.start, v)
        attend = self.attention_kernel or attention
        return linear(attend(q, keys, values, step.positions, self.window, sinks=self.sinks), *self.o)   # [T, H]


class Router:
    """Softmax over the experts, top-k, optionally renormalised (the four original families)."""

    best_first = True               # its ids come best first (torch.topk sorted; the kernel the same)

    def __init__(self, weight: torch.Tensor, top_k: int, renormalize: bool):
        self.weight, self.top_k, self.renormalize = weight, top_k, renormalize
        self.kernel = None          # kernels.router, attached at load

    def __call__(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # h [T, H] -> weights [T, K] (compute dtype), expert ids [T, K]
        weights, ids = (self.kernel or router_ref)(h, self.weight, self.top_k, self.renormalize)
        return weights.to(h.dtype), ids


class Mlp:
    """SwiGLU MLP: a dense layer's MLP, or a shared expert (optionally behind a sigmoid gate [1, H])."""

    def __init__(self, w: dict[str, torch.Tensor], prefix: str, gate: torch.Tensor | None = None):
        self.gate_proj, self.up_proj = w[prefix + "gate_proj.weight"], w[prefix + "up_proj.weight"]
        self.down_proj, self.gate = w[prefix + "down_proj.weight"], gate

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        out = swiglu_mlp(h, self.gate_proj, self.up_proj, self.down_proj)
        return out if self.gate is None else F.sigmoid(linear(h, self.gate)) * out


class Block:
    """Pre-norm decoder layer: x + mixer(norm(x)), then x + MoE(h) (+ shared experts) or x + MLP(h)."""

    norm_type = RmsNorm         # what the norm weights become (a family's own: (1 + w) norms)
    expert_rows_per_token = 1   # rows of the experts' input a token gives (expert_rows)

    def __init__(self, mixer, input_norm: torch.Tensor, post_norm: torch.Tensor, eps: float, *,
                 router=None, shared=None, mlp=None):
        self.mixer = mixer
        self.input_norm, self.post_norm = self.norm_type(input_norm, eps), self.norm_type(post_norm, eps)
        self.router, self.shared, self.mlp = router, shared, mlp
        self.is_moe = router is not None

    def state_specs(self) -> dict[str, StateSpec]:
        return self.mixer.state_specs()

    def mix(self, x: torch.Tensor, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.mixer(self.input_norm(x), step)
        return x, self.post_norm(x)

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.router(h)

    def expert_rows(self, h: torch.Tensor, weights: torch.Tensor,
                    ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What the routed experts run on: h [T, H] with its weights [T, K] and ids [T, K], as routed (a family
        whose experts take inputs scaled by their scores gives rows of its own: Llama 4)."""
        return h, weights, ids

    def combine(self, x: torch.Tensor, h: torch.Tensor, moe_out: torch.Tensor | None) -> torch.Tensor:
        """The residual after this layer, in x's dtype (moe_out may be float32: the sum is taken in it)."""
        if moe_out is None:
            return x + self.mlp(h)
        out = moe_out if self.shared is None else moe_out + self.shared(h)
        return (x + out).to(x.dtype)
