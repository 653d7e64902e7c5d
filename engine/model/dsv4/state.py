"""One DeepSeek-V4 layer's per-conversation state, as the model state's buffers (engine.model.state): the
shared K = V head of every position, and for CSA / HCA layers each compressor's ring of projected rows and
its entries (one row per `rate` positions). All of fixed shape when the state is static: a decode step is
a CUDA graph."""
from __future__ import annotations

from engine.model.block import Step
from engine.model.dsv4.attention import CSA, SLIDING, LayerBuffers
from engine.model.dsv4.compressor import CompressorBuffers
from engine.model.dsv4.config import Dsv4Config
from engine.model.state import StateSpec


def _compressor_names(kind: str) -> tuple[str, ...]:
    return () if kind == SLIDING else ("compressor", "indexer") if kind == CSA else ("compressor",)


def _compressor_specs(name: str, dim: int, rate: int, overlap: bool) -> dict[str, StateSpec]:
    span, width = (2 * rate, 2 * dim) if overlap else (rate, dim)
    return {f"{name}.entries": StateSpec((dim,), tokens_per_row=rate),
            f"{name}.ring_kv": StateSpec((span, width), per_token=False),
            f"{name}.ring_gate": StateSpec((span, width), per_token=False)}


def layer_state_specs(cfg: Dsv4Config, kind: str) -> dict[str, StateSpec]:
    specs = {"kv": StateSpec((cfg.head_dim,))}
    if kind == SLIDING:
        return specs
    rate = cfg.compress_rates[kind]
    specs |= _compressor_specs("compressor", cfg.head_dim, rate, overlap=kind == CSA)
    if kind == CSA:                                     # the indexer's own keys, overlapping at its head dim
        specs |= _compressor_specs("indexer", cfg.index_head_dim, rate, overlap=True)
    return specs


def layer_buffers(step: Step, layer: int, kind: str) -> LayerBuffers:
    """Layer `layer`'s buffers in the step's state, written at the step's positions."""
    state = step.state

    def compressor(name: str) -> CompressorBuffers:
        def store(ids, first, entries):
            return state.append(layer, f"{name}.entries", ids, first, entries)
        return CompressorBuffers(state.fixed(layer, f"{name}.ring_kv"), state.fixed(layer, f"{name}.ring_gate"), store)

    buffers = {name: compressor(name) for name in _compressor_names(kind)}
    return LayerBuffers(lambda kv: state.append(layer, "kv", step.positions, step.start, kv), **buffers)
