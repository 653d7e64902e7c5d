"""A generic model's decode step as CUDA graph segments split at its routed experts.

transformers' one-token forward is captured once (at load, on a static cache whose length tensor grows in
place): each experts adapter reached during the capture closes the running segment, its inputs (x, routing
weights, routed ids with the next MoE layer's guesses) and a static output buffer kept, and opens the next;
the last segment ends with the logits. A step replays segment L, runs layer L's experts outside any graph
into that buffer (what the eager adapter does), then replays segment L + 1: per MoE layer one replay, as the
native decode (engine.runtime.decode_step). All segments share one memory pool and replay in capture order.

A family is captured only where its one-token forward has no host control flow that depends on the step:
every cache layer a full-attention KV layer (no recurrent state, no sliding window's wrap-around), routed
experts called with (x, ids, weights) without identity experts, and a rope that does not rescale with the
position. Any other family decodes eagerly.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model.graph_capture import CAPTURE_MODE

_POSITION_ROPES = ("dynamic", "longrope")      # their tables change with the step's position (a host check)


def graph_blocker(interface, text_config) -> str | None:
    """Why a generic family's decode can't be captured as graph segments, or None where it can."""
    from transformers.cache_utils import get_layer_types_and_kwargs
    if interface.scaled_inputs:
        return "its experts take inputs scaled by their scores (a data-dependent gather)"
    if interface.num_zero_experts:
        return "its identity experts pick the routed tokens on the host"
    layer_types, _ = get_layer_types_and_kwargs(text_config)
    odd = sorted(set(layer_types) - {"full_attention", "dummy"})     # dummy: a layer without attention
    if odd:
        return f"its cache has {', '.join(odd)} layers"
    rope = (getattr(text_config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope in _POSITION_ROPES:
        return f"its {rope} rope depends on the position"
    return None


@dataclass
class Segment:
    """A captured piece of the forward and the experts layer that follows it (None after the last)."""
    graph: torch.cuda.CUDAGraph | None
    layer: int | None = None
    x: torch.Tensor | None = None             # [T, H] the experts' input
    weights: torch.Tensor | None = None       # [T, K]
    ids: torch.Tensor | None = None           # [T*K (+ P)] routed ids, then the next MoE layer's guesses
    out: torch.Tensor | None = None           # [T, H] float32, written by the experts
    next_layer: int | None = None


class SegmentCapture:
    """Open while the forward is captured (pool given) or warmed up (no pool: nothing recorded): each
    experts call cuts a segment and gets its static output buffer back."""

    def __init__(self, pool=None):
        self.pool, self.segments, self._graph = pool, [], None

    def begin(self) -> None:
        if self.pool is not None:
            self._graph = torch.cuda.CUDAGraph()
            self._graph.capture_begin(pool=self.pool, capture_error_mode=CAPTURE_MODE)

    def cut(self, layer: int, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
            next_layer: int | None) -> torch.Tensor:
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)     # the experts write all of it
        self.segments.append(Segment(self._end(), layer, x, weights, ids, out, next_layer))
        self.begin()
        return out

    def finish(self) -> list[Segment]:
        self.segments.append(Segment(self._end()))
        return self.segments

    def abandon(self) -> None:
        """A failed capture: the open graph, if any, ended (its error is the one already raised)."""
        try:
            self._end()
        except RuntimeError:
            pass

    def _end(self) -> torch.cuda.CUDAGraph | None:
        graph, self._graph = self._graph, None
        if graph is not None:
            graph.capture_end()
        return graph


def cache_bytes(static) -> int:
    """What a static cache's allocated keys and values hold."""
    return sum(t.nbytes for layer in static.layers if getattr(layer, "is_initialized", False)
               for t in (layer.keys, layer.values))


def into_static(cache, static):
    """A prompt's cache (transformers' DynamicCache) copied into the static cache -> the static cache, its length the
    prompt's (keys past it, a previous conversation's, stay masked until this one's decode overwrites them)."""
    for prompt, layer in zip(cache.layers, static.layers):
        if getattr(prompt, "keys", None) is None:       # a layer without attention
            continue
        if not layer.is_initialized:
            layer.lazy_initialization(prompt.keys, prompt.values)
        length = prompt.keys.shape[-2]
        layer.keys[:, :, :length].copy_(prompt.keys)
        layer.values[:, :, :length].copy_(prompt.values)
        layer.cumulative_length.fill_(length)
    return static


def replay(segments: list[Segment], experts, defer: bool) -> None:
    """One decode step: each segment, then its layer's experts on the segment's static tensors."""
    for s in segments[:-1]:
        s.graph.replay()
        experts.run_deferred()           # the previous MoE layer's prefetch, behind this segment's mixer
        experts.run(s.layer, s.x, s.weights, s.ids, s.out, s.next_layer, static_inputs=True, defer=defer)
    segments[-1].graph.replay()
