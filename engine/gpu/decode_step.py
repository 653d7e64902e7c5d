"""The dense parts of a one-token decode step as static-shape pieces, captured in CUDA graphs.

Per layer the piece reads the residual `x` [1, H] and the position, and writes: the residual after
attention, the MoE input h = norm(x), the routing (weights, ids) of this layer, the speculative ids
of the next MoE layer, and the shared expert's output (Qwen2). Dense-MLP layers are whole pieces.
The KV cache is the engine's KVCache allocated at full capacity up front (never regrown, so the
graphs' pointers stay valid) and zeroed (masked keys must not be NaN garbage: 0 * NaN = NaN).
`use_graphs=False` runs the very same functions eagerly: the switch to bisect a graph bug.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..layers import KVCache, apply_rope, attention, linear, rms_norm, rope_cos_sin, swiglu_mlp
from ..models.moe_decoder import MoeDecoder
from .speculation import predict_experts


class LayerOutputs:
    def __init__(self):
        self.x_attn = self.h = self.route_weights = self.route_ids = self.next_ids = self.shared = None


class DenseDecode:
    def __init__(self, model: MoeDecoder, kv: KVCache, device: torch.device, num_predicted: int,
                 use_graphs: bool = True):
        self.model, self.kv, self.spec = model, kv, model.spec
        self.device = torch.device(device)
        self.num_predicted = num_predicted
        self.use_graphs = use_graphs and self.device.type == "cuda"
        hidden = self.spec.hidden_size
        self.position = torch.zeros(1, dtype=torch.long, device=self.device)   # written before each step
        self.x = torch.zeros(1, hidden, dtype=model.dtype, device=self.device)  # residual stream, layer input
        self.out = [LayerOutputs() for _ in range(self.spec.num_layers)]
        moe = list(self.spec.moe_layers)
        self.next_moe = {layer: next((m for m in moe if m > layer), None) for layer in range(self.spec.num_layers)}
        self._graphs: list[torch.cuda.CUDAGraph] | None = None

    # ---------------------------------------------------------------- the captured piece
    def _layer(self, layer: int) -> None:
        spec, w, o = self.spec, self.model.w, self.out[layer]
        p = f"model.layers.{layer}."
        cos, sin = rope_cos_sin(self.position, self.model.inv_freq, self.model.rope_scaling, self.model.dtype)
        x = self.x
        x_attn = x + self._attention(layer, p, rms_norm(x, w[p + "input_layernorm.weight"], spec.rms_eps), cos, sin)
        h = rms_norm(x_attn, w[p + "post_attention_layernorm.weight"], spec.rms_eps)
        if not spec.is_moe_layer(layer):
            o.x_attn = x_attn + self.model._dense_mlp(p + "mlp.", h)
            return
        o.x_attn, o.h = x_attn, h
        o.route_weights, o.route_ids = self.model.route(layer, h)                         # [1, K], [1, K]
        nxt = self.next_moe[layer]
        if nxt is not None:
            o.next_ids = predict_experts(w[f"model.layers.{nxt}.mlp.gate.weight"], h, self.num_predicted)
        if spec.shared_expert_intermediate:
            sp = p + "mlp.shared_expert."
            shared = swiglu_mlp(h, w[sp + "gate_proj.weight"], w[sp + "up_proj.weight"], w[sp + "down_proj.weight"])
            o.shared = F.sigmoid(linear(h, w[p + "mlp.shared_expert_gate.weight"])) * shared

    def _attention(self, layer, p, x, cos, sin) -> torch.Tensor:
        s, w, a = self.spec, self.model.w, p + "self_attn."
        q = linear(x, w[a + "q_proj.weight"], w.get(a + "q_proj.bias"))
        k = linear(x, w[a + "k_proj.weight"], w.get(a + "k_proj.bias"))
        v = linear(x, w[a + "v_proj.weight"], w.get(a + "v_proj.bias"))
        if s.qk_norm == "full":
            q, k = rms_norm(q, w[a + "q_norm.weight"], s.rms_eps), rms_norm(k, w[a + "k_norm.weight"], s.rms_eps)
        if s.clip_qkv is not None:
            q, k, v = (t.clamp(-s.clip_qkv, s.clip_qkv) for t in (q, k, v))
        q = q.view(1, s.num_heads, s.head_dim)
        k = k.view(1, s.num_kv_heads, s.head_dim)
        v = v.view(1, s.num_kv_heads, s.head_dim)
        if s.qk_norm == "head":
            q, k = rms_norm(q, w[a + "q_norm.weight"], s.rms_eps), rms_norm(k, w[a + "k_norm.weight"], s.rms_eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        self.kv.k[layer].index_copy_(0, self.position, k)                 # write at the step's position
        self.kv.v[layer].index_copy_(0, self.position, v)
        out = attention(q, self.kv.k[layer], self.kv.v[layer], self.position, s.sliding_windows[layer])
        return linear(out, w[a + "o_proj.weight"], w.get(a + "o_proj.bias"))

    # ---------------------------------------------------------------- driving
    def capture(self) -> None:
        """Record one graph per layer (shared memory pool). Needs a filled KV slot at position 0..:
        capture writes garbage K/V at the current position, which the next real step overwrites."""
        if not self.use_graphs:
            return
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):                       # warm-up: allocator and library handles
            for layer in range(self.spec.num_layers):
                self._layer(layer)
        torch.cuda.current_stream().wait_stream(stream)
        pool = torch.cuda.graph_pool_handle()
        graphs = []
        for layer in range(self.spec.num_layers):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._layer(layer)
            graphs.append(graph)
        self._graphs = graphs

    def run_layer(self, layer: int) -> LayerOutputs:
        if self._graphs is not None:
            self._graphs[layer].replay()
        else:
            self._layer(layer)
        return self.out[layer]
