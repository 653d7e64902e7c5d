"""A plain greedy loop over the DeepSeek-V4 pieces (all experts in memory): checks that the pieces
compose into the reference model before the streaming runtime drives them."""
from __future__ import annotations

import torch

from engine.model.block import Step
from engine.model.dsv4.config import read_dsv4_config
from engine.model.dsv4.hyper import hyper_head
from engine.model.dsv4.layer import Dsv4Layer, rope_for
from engine.model.dsv4.norms import rms_norm
from engine.model.dsv4.state import layer_state_specs
from engine.model.state import ModelState


def layer_states(cfg, kinds, static: bool, max_tokens: int = 64) -> ModelState:
    """The model state of layers of these kinds: growing (start on the host), or static at full size, as
    the CUDA graphs keep it (zeros past the position)."""
    return ModelState([layer_state_specs(cfg, kind) for kind in kinds], max_tokens, torch.float32,
                      torch.device("cpu"), static=static, initial_tokens=4)


def step_at(positions: torch.Tensor, state: ModelState, static: bool) -> Step:
    """A step at these positions; over the static state with no start on the host, as in a graph replay."""
    return Step(positions, None if static else int(positions[0]), state)


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
    def forward(self, token_ids: torch.Tensor, step: Step) -> torch.Tensor:
        """token_ids [T] at step.positions -> logits [T, vocab]."""
        x = self.embed[token_ids].unsqueeze(1).expand(-1, self.cfg.hc_mult, -1).contiguous()   # [T, n, H]
        rope = rope_for(self.cfg, step.positions, x.dtype)
        for layer, experts in zip(self.layers, self.experts):
            mixed, h = layer.mix(x, step, rope)
            weights, ids = layer.route(h, token_ids)
            x = layer.combine(mixed, h, routed_experts(layer, h, weights, ids, experts))
        x = rms_norm(hyper_head(x, *self.hc_head, self.cfg.hc_eps, self.cfg.eps), self.norm, self.cfg.eps)
        return x @ self.head.T

    def greedy(self, prompt: torch.Tensor, max_new_tokens: int, static: bool = False) -> list[int]:
        """The prompt, then one token a step (static: each step with no start on the host, as a graph replay)."""
        state = layer_states(self.cfg, self.cfg.layer_types, static, len(prompt) + max_new_tokens)
        logits = self.forward(prompt, Step(torch.arange(len(prompt)), 0, state))
        out = []
        for position in range(len(prompt), len(prompt) + max_new_tokens):
            out.append(int(logits[-1].argmax()))
            logits = self.forward(torch.tensor(out[-1:]), step_at(torch.tensor([position]), state, static))
        return out
