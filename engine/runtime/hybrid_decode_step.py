"""The one-token decode pieces of the Gated-DeltaNet hybrids, captured in CUDA graphs like the others.

A DeltaNet layer's step reads and updates its conv and recurrent state in place (fixed buffers of
HybridState: the graphs' pointers stay valid); a full-attention layer writes K/V at the step's
position. Norms are the (1 + w) kind. Everything else (routing, shared expert, head) is DenseDecode's.
"""
from __future__ import annotations

import torch

from engine.model.hybrid import offset_rms_norm, partial_rope
from engine.model.layers import attention, linear
from engine.runtime.decode_step import DenseDecode


class HybridDenseDecode(DenseDecode):
    def _mix(self, layer, p, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        w, eps, model = self.model.w, self.spec.rms_eps, self.model
        h = offset_rms_norm(x, w[p + "input_layernorm.weight"], eps)
        if self.spec.hybrid.is_linear(layer):
            x_attn = x + model._deltanet(layer, p + "linear_attn.", h, self.kv)
        else:
            x_attn = x + self._gated_attention(layer, p + "self_attn.", h, cos, sin)
        return x_attn, offset_rms_norm(x_attn, w[p + "post_attention_layernorm.weight"], eps)

    def _gated_attention(self, layer, a, x, cos, sin) -> torch.Tensor:
        s, w = self.spec, self.model.w
        q, gate = linear(x, w[a + "q_proj.weight"], w.get(a + "q_proj.bias")).view(1, s.num_heads, 2 * s.head_dim) \
            .chunk(2, dim=-1)                                                          # [1, Hq, D] each
        k = linear(x, w[a + "k_proj.weight"], w.get(a + "k_proj.bias")).view(1, s.num_kv_heads, s.head_dim)
        v = linear(x, w[a + "v_proj.weight"], w.get(a + "v_proj.bias")).view(1, s.num_kv_heads, s.head_dim)
        q = offset_rms_norm(q, w[a + "q_norm.weight"], s.rms_eps)
        k = offset_rms_norm(k, w[a + "k_norm.weight"], s.rms_eps)
        q, k = partial_rope(q, cos, sin), partial_rope(k, cos, sin)
        self.kv.k[layer].index_copy_(0, self.position, k)                 # write at the step's position
        self.kv.v[layer].index_copy_(0, self.position, v)
        out = attention(q, self.kv.k[layer], self.kv.v[layer], self.position, None)
        out = out * torch.sigmoid(gate.reshape(out.shape))
        return linear(out, w[a + "o_proj.weight"], w.get(a + "o_proj.bias"))

    def _final_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return offset_rms_norm(x, weight, self.spec.rms_eps)
