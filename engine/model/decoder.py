"""Forward pass of the supported decoder-only MoE families (qwen3_moe, mixtral, olmoe, qwen2_moe).

They share one skeleton: pre-norm attention (GQA, RoPE) and a pre-norm MoE block. Family quirks
were fixed at load time (ModelSpec and canonical tensor names), so `forward` reads top to bottom:
q/k norm per head (Qwen3) or over the whole projection (OLMoE), qkv biases (Qwen2), a sigmoid-gated
shared expert (Qwen2), routing renormalised or not. Routed experts come from the scheduler.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.model.layers import KVCache, apply_rope, attention, linear, rms_norm, rope_cos_sin, swiglu_mlp
from engine.format.layout import Layout
from engine.format.quant import dequantize
from engine.runtime.scheduler import ExpertScheduler
from engine.model.spec import ModelSpec


def decoded_expert_bytes(layout: Layout, dtype: torch.dtype) -> int:
    """Bytes of one expert's gate, up and down decoded to the compute dtype (0 when the block already is)."""
    if layout.fmt == "bf16" and dtype == torch.bfloat16:
        return 0
    return 3 * layout.intermediate * layout.hidden * torch.empty((), dtype=dtype).element_size()


class MoeDecoder:
    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], layout: Layout,
                 inv_freq: torch.Tensor, rope_scaling: float, dtype: torch.dtype, cache_decoded: bool = True):
        self.spec, self.w, self.layout, self.dtype = spec, weights, layout, dtype
        self.inv_freq, self.rope_scaling = inv_freq, rope_scaling
        self.lm_head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
        # Decoded weights per device slot (keyed by the slot's address): an expert that stays resident is
        # decoded once, not once per token. Counted in the VRAM budget (decoded_expert_bytes per slot).
        # The CUDA runtime turns it off: its decode reads the blocks directly (fused kernels), and a
        # prefill uses each expert once per layer, so a cache would only hold 2x the slot bytes.
        self.cache_decoded = cache_decoded
        self._decoded: dict[int, tuple[tuple[int, int], tuple[torch.Tensor, ...]]] = {}

    def _expert_weights(self, layer: int, expert: int, block: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """gate, up, down of the expert in this slot, in the compute dtype."""
        cached = self._decoded.get(block.data_ptr())
        if cached is not None and cached[0] == (layer, expert):
            return cached[1]          # a block's bytes are fixed per (layer, expert): still valid after a reload
        views = self.layout.views(block)
        weights = tuple(dequantize({k.split(".")[1]: t for k, t in views.items() if k.startswith(proj + ".")},
                                   self.layout.fmt, self.dtype) for proj in ("gate", "up", "down"))
        if self.cache_decoded:
            self._decoded[block.data_ptr()] = ((layer, expert), weights)
        return weights

    def forward(self, token_ids: torch.Tensor, start: int, kv: KVCache, scheduler: ExpertScheduler) -> torch.Tensor:
        """token_ids [T] at positions start..start+T-1 -> logits of the last token [V] (float32)."""
        # T = tokens, H = hidden, V = vocab
        positions = torch.arange(start, start + token_ids.shape[0], device=token_ids.device)
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.rope_scaling, self.dtype)
        x = self.w["model.embed_tokens.weight"][token_ids]                            # [T, H]
        for layer in range(self.spec.num_layers):
            p = f"model.layers.{layer}."
            x = x + self._attention(layer, p, rms_norm(x, self.w[p + "input_layernorm.weight"], self.spec.rms_eps),
                                    positions, cos, sin, start, kv)
            h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], self.spec.rms_eps)
            x = x + (self._moe(layer, p, h, scheduler) if self.spec.is_moe_layer(layer) else self._dense_mlp(p + "mlp.", h))
        x = rms_norm(x[-1:], self.w["model.norm.weight"], self.spec.rms_eps)
        return linear(x, self.lm_head)[0].float()

    def _attention(self, layer, p, x, positions, cos, sin, start, kv: KVCache) -> torch.Tensor:
        s, a = self.spec, p + "self_attn."
        q = linear(x, self.w[a + "q_proj.weight"], self.w.get(a + "q_proj.bias"))     # [T, Hq*D]
        k = linear(x, self.w[a + "k_proj.weight"], self.w.get(a + "k_proj.bias"))     # [T, Hkv*D]
        v = linear(x, self.w[a + "v_proj.weight"], self.w.get(a + "v_proj.bias"))
        if s.qk_norm == "full":
            q = rms_norm(q, self.w[a + "q_norm.weight"], s.rms_eps)
            k = rms_norm(k, self.w[a + "k_norm.weight"], s.rms_eps)
        if s.clip_qkv is not None:
            q, k, v = (t.clamp(-s.clip_qkv, s.clip_qkv) for t in (q, k, v))
        q = q.view(-1, s.num_heads, s.head_dim)                                          # [T, Hq, D]
        k = k.view(-1, s.num_kv_heads, s.head_dim)                                       # [T, Hkv, D]
        v = v.view(-1, s.num_kv_heads, s.head_dim)
        if s.qk_norm == "head":
            q = rms_norm(q, self.w[a + "q_norm.weight"], s.rms_eps)
            k = rms_norm(k, self.w[a + "k_norm.weight"], s.rms_eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys, values = kv.append(layer, start, k, v)
        out = attention(q, keys, values, positions, s.sliding_windows[layer])           # [T, Hq*D]
        return linear(out, self.w[a + "o_proj.weight"], self.w.get(a + "o_proj.bias"))

    def _dense_mlp(self, p: str, x: torch.Tensor) -> torch.Tensor:
        return swiglu_mlp(x, self.w[p + "gate_proj.weight"], self.w[p + "up_proj.weight"], self.w[p + "down_proj.weight"])

    def route(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> routing weights [T, K] (compute dtype) and expert ids [T, K]."""
        logits = linear(x, self.w[f"model.layers.{layer}.mlp.gate.weight"])            # [T, E]
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, expert_ids = torch.topk(probs, self.spec.top_k, dim=-1)
        if self.spec.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), expert_ids

    def _moe(self, layer: int, p: str, x: torch.Tensor, scheduler: ExpertScheduler) -> torch.Tensor:
        # T = tokens, K = experts per token
        weights, expert_ids = self.route(layer, x)                                       # [T, K], [T, K]
        out = torch.zeros_like(x)
        flat_ids = expert_ids.flatten().tolist()                                          # the one host sync
        tokens_of: dict[int, list[int]] = {}
        for position, expert in enumerate(flat_ids):
            tokens_of.setdefault(expert, []).append(position)

        def compute(expert: int, block: torch.Tensor) -> None:
            flat = torch.tensor(tokens_of[expert], device=x.device)
            token_idx, k_idx = flat // self.spec.top_k, flat % self.spec.top_k
            gate, up, down = self._expert_weights(layer, expert, block)
            y = swiglu_mlp(x[token_idx], gate, up, down) * weights[token_idx, k_idx, None]
            out.index_add_(0, token_idx, y)

        scheduler.run_layer(layer, sorted(tokens_of), compute)
        if self.spec.shared_expert_intermediate:
            shared = self._dense_mlp(p + "mlp.shared_expert.", x)
            out = out + F.sigmoid(linear(x, self.w[p + "mlp.shared_expert_gate.weight"])) * shared
        return out
