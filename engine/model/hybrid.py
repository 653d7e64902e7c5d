"""Forward pass of the Gated-DeltaNet hybrid MoE families (qwen3_next, qwen3_5_moe).

Each layer mixes tokens either with a Gated DeltaNet (fixed-size conv + recurrent state, see
engine.model.deltanet) or with gated full attention (q projection carries a per-head output gate,
sigmoid(gate) * attention before o_proj; per-head q/k norm; rotary on the first rotary_dim dims
of a head). Every RMSNorm outside the DeltaNet's gated norm scales by (1 + w). The MoE block is
the softmax top-k router plus a sigmoid-gated shared expert (MoeDecoder's). Checkpoint quirks are
fixed at load: Qwen3-Next's head-interleaved in_proj_qkvz / in_proj_ba become Qwen3.5's
in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, so one code path runs both.
"""
from __future__ import annotations

import torch

from engine.format.layout import Layout
from engine.model import deltanet
from engine.model.decoder import MoeDecoder
from engine.model.hybrid_spec import HybridDims
from engine.model.layers import KVCache, apply_rope, attention, linear, rope_cos_sin
from engine.model.spec import ModelSpec
from engine.runtime.scheduler import ExpertScheduler


def offset_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm scaled by (1 + w), computed in float32 and cast back (as the reference rounds)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * (1.0 + weight.float())).to(x.dtype)


def split_qwen3_next_projections(weights: dict[str, torch.Tensor], dims: HybridDims) -> None:
    """Qwen3-Next's fused DeltaNet input projections -> Qwen3.5's separate ones (rows reordered, in place).

    in_proj_qkvz rows are grouped per key head: [q_i, k_i, v of its value heads, z of its value heads];
    in_proj_ba rows likewise [b of its value heads, a of its value heads]."""
    nk, dk, dv = dims.num_k_heads, dims.k_head_dim, dims.v_head_dim
    per_group = dims.num_v_heads // nk * dv
    for name in [n for n in weights if n.endswith("linear_attn.in_proj_qkvz.weight")]:
        p = name.removesuffix("in_proj_qkvz.weight")
        qkvz = weights.pop(name)
        q, k, v, z = qkvz.view(nk, -1, qkvz.shape[-1]).split([dk, dk, per_group, per_group], dim=1)
        flat = lambda t: t.reshape(-1, t.shape[-1])          # noqa: E731  [nk, rows, H] -> [nk * rows, H]
        weights[p + "in_proj_qkv.weight"] = torch.cat([flat(q), flat(k), flat(v)])
        weights[p + "in_proj_z.weight"] = flat(z)
        ba = weights.pop(p + "in_proj_ba.weight")
        b, a = ba.view(nk, -1, ba.shape[-1]).chunk(2, dim=1)
        weights[p + "in_proj_b.weight"], weights[p + "in_proj_a.weight"] = flat(b), flat(a)


class HybridState:
    """Per conversation: a KV cache for the full-attention layers, conv + recurrent state for the
    DeltaNet layers (fixed size, updated in place; zeroed when a new prompt starts)."""

    def __init__(self, spec: ModelSpec, max_tokens: int, dtype: torch.dtype, device: torch.device,
                 initial_tokens: int = 256):
        dims = spec.hybrid
        self.kv = KVCache(spec.num_layers, spec.num_kv_heads, spec.head_dim, max_tokens, dtype, device, initial_tokens)
        self.k, self.v, self.max_tokens = self.kv.k, self.kv.v, max_tokens      # the decode step writes KV directly
        self.conv = {layer: torch.zeros(dims.conv_channels, dims.conv_kernel - 1, dtype=dtype, device=device)
                     for layer in range(spec.num_layers) if dims.is_linear(layer)}
        self.recurrent = {layer: torch.zeros(dims.num_v_heads, dims.k_head_dim, dims.v_head_dim, device=device)
                          for layer in self.conv}

    @staticmethod
    def bytes_needed(spec: ModelSpec, max_tokens: int, dtype_bytes: int) -> int:
        """What the budget charges: KV of the full-attention layers at max_tokens + the fixed DeltaNet states."""
        dims = spec.hybrid
        linear_layers = sum(dims.is_linear(layer) for layer in range(spec.num_layers))
        kv = 2 * (spec.num_layers - linear_layers) * max_tokens * spec.num_kv_heads * spec.head_dim * dtype_bytes
        return kv + linear_layers * dims.state_bytes_per_layer(dtype_bytes)

    def reset(self) -> None:
        self.kv.reset()
        for t in (*self.conv.values(), *self.recurrent.values()):
            t.zero_()

    def append(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        return self.kv.append(layer, start, k, v)


class HybridDecoder(MoeDecoder):
    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], layout: Layout,
                 inv_freq: torch.Tensor, rope_scaling: float, dtype: torch.dtype, cache_decoded: bool = True):
        if spec.family == "qwen3_next":
            split_qwen3_next_projections(weights, spec.hybrid)
        super().__init__(spec, weights, layout, inv_freq, rope_scaling, dtype, cache_decoded)

    def forward(self, token_ids: torch.Tensor, start: int, state: HybridState, scheduler: ExpertScheduler) -> torch.Tensor:
        """token_ids [T] at positions start..start+T-1 -> logits of the last token [V] (float32)."""
        # T = tokens, H = hidden, V = vocab
        spec, eps = self.spec, self.spec.rms_eps
        positions = torch.arange(start, start + token_ids.shape[0], device=token_ids.device)
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.rope_scaling, self.dtype)
        x = self.w["model.embed_tokens.weight"][token_ids]                              # [T, H]
        for layer in range(spec.num_layers):
            p = f"model.layers.{layer}."
            h = offset_rms_norm(x, self.w[p + "input_layernorm.weight"], eps)
            if spec.hybrid.is_linear(layer):
                x = x + self._deltanet(layer, p + "linear_attn.", h, state)
            else:
                x = x + self._gated_attention(layer, p + "self_attn.", h, positions, cos, sin, start, state)
            h = offset_rms_norm(x, self.w[p + "post_attention_layernorm.weight"], eps)
            x = x + (self._moe(layer, p, h, scheduler) if spec.is_moe_layer(layer) else self._dense_mlp(p + "mlp.", h))
        x = offset_rms_norm(x[-1:], self.w["model.norm.weight"], eps)
        return linear(x, self.lm_head)[0].float()

    def _gated_attention(self, layer, a, x, positions, cos, sin, start, state: HybridState) -> torch.Tensor:
        # Hq = query heads, Hkv = kv heads, D = head dim, R = rotary dims
        s = self.spec
        q, gate = linear(x, self.w[a + "q_proj.weight"], self.w.get(a + "q_proj.bias")) \
            .view(-1, s.num_heads, 2 * s.head_dim).chunk(2, dim=-1)                  # [T, Hq, D] each
        k = linear(x, self.w[a + "k_proj.weight"], self.w.get(a + "k_proj.bias")).view(-1, s.num_kv_heads, s.head_dim)
        v = linear(x, self.w[a + "v_proj.weight"], self.w.get(a + "v_proj.bias")).view(-1, s.num_kv_heads, s.head_dim)
        q = offset_rms_norm(q, self.w[a + "q_norm.weight"], s.rms_eps)
        k = offset_rms_norm(k, self.w[a + "k_norm.weight"], s.rms_eps)
        q, k = partial_rope(q, cos, sin), partial_rope(k, cos, sin)
        keys, values = state.append(layer, start, k, v)
        out = attention(q, keys, values, positions, None)                              # [T, Hq*D]
        out = out * torch.sigmoid(gate.reshape(out.shape))
        return linear(out, self.w[a + "o_proj.weight"], self.w.get(a + "o_proj.bias"))

    def _deltanet(self, layer: int, d: str, x: torch.Tensor, state: HybridState) -> torch.Tensor:
        # Hk/Hv = key/value heads, Dk/Dv = their dims, C = conv channels (q, k, v)
        dims, w = self.spec.hybrid, self.w
        num_tokens = x.shape[0]
        qkv = deltanet.causal_conv(linear(x, w[d + "in_proj_qkv.weight"]), state.conv[layer],
                                   w[d + "conv1d.weight"].view(dims.conv_channels, -1))      # [T, C]
        key_dim = dims.num_k_heads * dims.k_head_dim
        q, k, v = qkv.split([key_dim, key_dim, dims.num_v_heads * dims.v_head_dim], dim=-1)
        q = q.view(num_tokens, dims.num_k_heads, dims.k_head_dim)
        k = k.view(num_tokens, dims.num_k_heads, dims.k_head_dim)
        v = v.view(num_tokens, dims.num_v_heads, dims.v_head_dim)
        g, beta = deltanet.decay_and_beta(linear(x, w[d + "in_proj_a.weight"]), linear(x, w[d + "in_proj_b.weight"]),
                                          w[d + "A_log"], w[d + "dt_bias"])              # [T, Hv] each
        rule = deltanet.recurrent_delta_step if num_tokens == 1 else deltanet.chunked_delta_rule
        out = rule(q, k, v, g, beta, state.recurrent[layer])                             # [T, Hv, Dv]
        z = linear(x, w[d + "in_proj_z.weight"]).view(num_tokens, dims.num_v_heads, dims.v_head_dim)
        out = deltanet.gated_rms_norm(out, z, w[d + "norm.weight"], self.spec.rms_eps)
        return linear(out.reshape(num_tokens, -1), w[d + "out_proj.weight"])


def partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary on the first R dims of each head (cos, sin [T, 1, R]); the rest passes through."""
    rotary = cos.shape[-1]
    return torch.cat((apply_rope(x[..., :rotary], cos, sin), x[..., rotary:]), dim=-1)

