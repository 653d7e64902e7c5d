"""Next-token choice: greedy, or temperature / top-k / top-p sampling with a seeded generator.

Sampling runs where the logits are (the GPU in decode): an exponential race, argmax(p / q) with
q ~ Exp(1), draws from p exactly and costs one elementwise pass and one argmax, where copying the
logits to the host and `torch.multinomial` there took ~3.7 ms a token (OLMoE's 50k vocabulary,
profiled on the H200 box).
"""
from __future__ import annotations

import torch

from engine.params import GenerationParams


def make_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    return torch.Generator(device=device).manual_seed(seed) if seed is not None else None


def sample(logits: torch.Tensor, params: GenerationParams, generator: torch.Generator | None) -> int:
    """logits [V] float32 -> token id (one host sync)."""
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[0]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(-1) - probs > params.top_p                   # keeps at least the top token
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    race = torch.empty_like(probs).exponential_(generator=generator)
    return int(torch.argmax(probs / race))
