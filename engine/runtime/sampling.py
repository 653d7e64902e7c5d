"""Next-token choice: greedy, or temperature / top-k / top-p sampling with a seeded generator."""
from __future__ import annotations

import torch

from engine.params import GenerationParams


def sample(logits: torch.Tensor, params: GenerationParams, generator: torch.Generator | None) -> int:
    """logits [V] float32 -> token id."""
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    logits = logits.float().cpu() / params.temperature
    if params.top_k and params.top_k < logits.shape[0]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) > params.top_p   # keeps at least the top token
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
