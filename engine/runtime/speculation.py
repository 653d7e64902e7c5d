"""Speculative routing, scored: the guess for layer L+1's experts is layer L+1's own router (its
`Block.route`, biases and groups included) applied to the hidden state entering layer L's MoE block
(the residual stream changes little from one layer to the next); engine.runtime.decode_step makes
it inside the decode graphs. A pure function of id sets, so predictions can be replayed offline.
"""
from __future__ import annotations


def score(predicted: set[int], actual: set[int]) -> tuple[int, int]:
    """(correct, needed): how many of the experts the layer really used had been predicted.
    Recall = correct / needed."""
    return len(predicted & actual), len(actual)
