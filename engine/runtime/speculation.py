"""Speculative routing: guess layer L+1's experts from layer L's MoE input, score the guesses.

The guess is layer L+1's own router applied to the hidden state entering layer L's MoE block (the
residual stream changes little from one layer to the next). Pure functions of tensors and id lists,
so predictions can be replayed and scored offline.
"""
from __future__ import annotations

import torch


def predict_experts(router_weight: torch.Tensor, x: torch.Tensor, num_predicted: int) -> torch.Tensor:
    """router_weight [E, H], x [T, H] -> expert ids [T, num_predicted] ranked by router logit."""
    logits = x @ router_weight.T                                  # [T, E]
    return torch.topk(logits, min(num_predicted, router_weight.shape[0]), dim=-1).indices


def score(predicted: set[int], actual: set[int]) -> tuple[int, int]:
    """(correct, needed): how many of the experts the layer really used had been predicted.
    Recall = correct / needed."""
    return len(predicted & actual), len(actual)
