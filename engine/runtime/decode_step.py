"""The dense parts of a one-token decode step as static-shape pieces, captured in CUDA graphs.

Piece L starts from the previous layer's results (layer 0: the embedding row of the step's token),
so the residual add after a MoE block happens inside the next graph: per MoE layer the host does one
graph replay, one read of the expert ids, and the MoE launch(es). Piece L writes: the residual after
attention, the MoE input h = norm(x), the routing (weights, ids) of this layer with the speculative
ids of the next MoE layer appended, and the shared expert's output (Qwen2). Dense-MLP layers are
whole pieces. A last piece (the head) gives logits and the greedy token. The MoE output of layer L is
written by the streaming MoE into the static `moe_out[L]`.
The KV cache is the engine's KVCache allocated at full capacity up front (never regrown, so the
graphs' pointers stay valid) and zeroed (masked keys must not be NaN garbage: 0 * NaN = NaN).
`use_graphs=False` runs the very same functions eagerly: the switch to bisect a graph bug.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.model.layers import KVCache, apply_rope, attention, linear, rms_norm, rope_cos_sin, swiglu_mlp
from engine.model.decoder import MoeDecoder
from engine.runtime.speculation import predict_experts


class LayerOutputs:
    def __init__(self):
        self.x_attn = self.h = self.route_weights = self.ids = self.shared = None


class DenseDecode:
    def __init__(self, model: MoeDecoder, kv: KVCache, device: torch.device, num_predicted: int,
                 use_graphs: bool = True):
        self.model, self.kv, self.spec = model, kv, model.spec
        self.device = torch.device(device)
        self.num_predicted = num_predicted
        self.use_graphs = use_graphs and self.device.type == "cuda"
        hidden = self.spec.hidden_size
        # [token, position] of the step, written before each step (through a pinned row on CUDA)
        self.step_in = torch.zeros(2, dtype=torch.long, device=self.device)
        self.token_in, self.position = self.step_in[0:1], self.step_in[1:2]
        self._step_stage = torch.zeros(2, dtype=torch.long).pin_memory() if self.device.type == "cuda" else None
        self.out = [LayerOutputs() for _ in range(self.spec.num_layers)]
        self.moe_out = {layer: torch.zeros(1, hidden, dtype=torch.float32, device=self.device)
                        for layer in self.spec.moe_layers}
        self.logits = self.token_out = None
        moe = list(self.spec.moe_layers)
        self.next_moe = {layer: next((m for m in moe if m > layer), None) for layer in range(self.spec.num_layers)}
        self._graphs: list[torch.cuda.CUDAGraph] | None = None

    def set_step(self, token: int, position: int) -> None:
        """The next step's input token and position. The pinned row is reused only after the caller
        has read the previous step's result (a host sync), so its copy has long finished."""
        if self._step_stage is None:
            self.step_in.copy_(torch.tensor([token, position]))
            return
        self._step_stage.numpy()[:] = (token, position)
        self.step_in.copy_(self._step_stage, non_blocking=True)

    def _residual(self, layer: int) -> torch.Tensor:
        """The residual stream after `layer`: attention output + MoE output (+ shared expert), in the
        compute dtype (the sum is taken in float32 when the MoE output is)."""
        o = self.out[layer]
        if not self.spec.is_moe_layer(layer):
            return o.x_attn
        x = o.x_attn + self.moe_out[layer]
        if o.shared is not None:
            x = x + o.shared
        return x.to(self.model.dtype)

    # ---------------------------------------------------------------- the captured piece
    def _layer(self, layer: int) -> None:
        spec, w, o = self.spec, self.model.w, self.out[layer]
        p = f"model.layers.{layer}."
        cos, sin = rope_cos_sin(self.position, self.model.inv_freq, self.model.rope_scaling, self.model.dtype)
        x = F.embedding(self.token_in, w["model.embed_tokens.weight"]) if layer == 0 else self._residual(layer - 1)
        x_attn, h = self._mix(layer, p, x, cos, sin)
        if not spec.is_moe_layer(layer):
            o.x_attn = x_attn + self.model._dense_mlp(p + "mlp.", h)
            return
        o.x_attn, o.h = x_attn, h
        o.route_weights, route_ids = self.model.route(layer, h)                           # [1, K], [1, K]
        nxt = self.next_moe[layer]
        o.ids = route_ids.flatten()                      # routed ids, then the speculated ids of layer nxt
        if nxt is not None:
            guess = predict_experts(w[f"model.layers.{nxt}.mlp.gate.weight"], h, self.num_predicted)
            o.ids = torch.cat([o.ids, guess.flatten()])
        if spec.shared_expert_intermediate:
            sp = p + "mlp.shared_expert."
            shared = swiglu_mlp(h, w[sp + "gate_proj.weight"], w[sp + "up_proj.weight"], w[sp + "down_proj.weight"])
            o.shared = F.sigmoid(linear(h, w[p + "mlp.shared_expert_gate.weight"])) * shared

    def _mix(self, layer, p, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """The token mixer with its residual, and the MoE/MLP input h = post-norm of that."""
        w, eps = self.model.w, self.spec.rms_eps
        x_attn = x + self._attention(layer, p, rms_norm(x, w[p + "input_layernorm.weight"], eps), cos, sin)
        return x_attn, rms_norm(x_attn, w[p + "post_attention_layernorm.weight"], eps)

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

    def _head(self) -> None:
        w = self.model.w
        x = self._final_norm(self._residual(self.spec.num_layers - 1), w["model.norm.weight"])
        self.logits = linear(x, self.model.lm_head)[0].float()
        self.token_out = torch.argmax(self.logits)

    def _final_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.spec.rms_eps)

    # ---------------------------------------------------------------- driving
    def _pieces(self) -> list:
        return [lambda layer=layer: self._layer(layer) for layer in range(self.spec.num_layers)] + [self._head]

    def capture(self) -> None:
        """Record one graph per layer and one for the head (shared memory pool). Capture writes
        garbage K/V at the current position, which the next real step overwrites."""
        if not self.use_graphs:
            return
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):                       # warm-up: allocator and library handles
            for piece in self._pieces():
                piece()
        torch.cuda.current_stream().wait_stream(stream)
        pool = torch.cuda.graph_pool_handle()
        graphs = []
        for piece in self._pieces():
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                piece()
            graphs.append(graph)
        self._graphs = graphs

    def run_layer(self, layer: int) -> LayerOutputs:
        if self._graphs is not None:
            self._graphs[layer].replay()
        else:
            self._layer(layer)
        return self.out[layer]

    def run_head(self) -> None:
        """logits [V] float32 and token_out (the greedy token, on the device) of the step."""
        if self._graphs is not None:
            self._graphs[-1].replay()
        else:
            self._head()
