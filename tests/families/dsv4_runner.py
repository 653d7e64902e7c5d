"""A plain greedy loop over the DeepSeek-V4 pieces (all experts in memory): checks that the pieces
compose into the reference model before the streaming runtime drives them."""
from __future__ import annotations

import torch

from engine.model.dsv4.attention import LayerCache
from engine.model.dsv4.config import read_dsv4_config
from engine.model.dsv4.hyper import hyper_head
from engine.model.dsv4.layer import Dsv4Layer, rope_for
from engine.model.dsv4.norms import rms_norm


class KeyList:
    """Shared keys of one layer, grown by concatenation: store_keys for the pieces."""

    def __init__(self):
        self.keys = None

    def __call__(self, kv: torch.Tensor) -> torch.Tensor:
        self.keys = kv if self.keys is None else torch.cat([self.keys, kv])
        return self.keys


def layer_weights(model, index: int):
    """Name getter below `model.layers.{index}.` and the experts as (gate, up, down) per expert."""
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    prefix = f"model.layers.{index}."
    mlp = model.model.layers[index].mlp.experts
    experts = [(*mlp.gate_up_proj[e].detach().chunk(2, dim=0), mlp.down_proj[e].detach())
               for e in range(mlp.gate_up_proj.shape[0])]
    return (lambda name: tensors[prefix + name].detach()), experts


def routed_experts(layer: Dsv4Layer, h, weights, ids, experts):
    """Sum over each token's experts, expert by expert in id order (as the reference accumulates)."""
    out = torch.zeros_like(h)
    for e in ids.unique().tolist():
        tokens, slot = torch.where(ids == e)
        out.index_add_(0, tokens, layer.expert(h[tokens], *experts[e]) * weights[tokens, slot, None])
    return out


class PieceModel:
    def __init__(self, model):
        self.cfg = read_dsv4_config(model.config)
        self.layers, self.experts = [], []
        for i in range(model.config.num_hidden_layers):
            get, experts = layer_weights(model, i)
            self.layers.append(Dsv4Layer(self.cfg, i, get))
            self.experts.append(experts)
        m = model.model
        self.embed, self.norm, self.head = m.embed_tokens.weight.detach(), m.norm.weight.detach(), model.lm_head.weight.detach()
        self.hc_head = (m.hc_head.hc_fn.detach(), m.hc_head.hc_base.detach(), m.hc_head.hc_scale.detach())

    @torch.no_grad()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, caches: list[LayerCache],
                keys: list[KeyList]) -> torch.Tensor:
        """token_ids, positions [T] -> logits [T, vocab]."""
        x = self.embed[token_ids].unsqueeze(1).expand(-1, self.cfg.hc_mult, -1).contiguous()   # [T, n, H]
        rope = rope_for(self.cfg, positions, x.dtype)
        for layer, experts, cache, store in zip(self.layers, self.experts, caches, keys):
            mixed, h = layer.mix(x, int(positions[0]), cache, rope, store)
            weights, ids = layer.route(h, token_ids)
            x = layer.combine(mixed, h, routed_experts(layer, h, weights, ids, experts))
        x = rms_norm(hyper_head(x, *self.hc_head, self.cfg.hc_eps, self.cfg.eps), self.norm, self.cfg.eps)
        return x @ self.head.T

    def greedy(self, prompt: torch.Tensor, max_new_tokens: int) -> list[int]:
        caches, keys = [LayerCache() for _ in self.layers], [KeyList() for _ in self.layers]
        logits = self.forward(prompt, torch.arange(len(prompt)), caches, keys)
        out = []
        for step in range(max_new_tokens):
            token = int(logits[-1].argmax())
            out.append(token)
            logits = self.forward(torch.tensor([token]), torch.tensor([len(prompt) + step]), caches, keys)
        return out
