"""Per-layer embedding (PLE): a token's n-gram rows injected into every residual stream of a DeltaNet layer.

  e      = the token's rows, concatenated                         [T, E]
  key    = norm_key(key_proj(e)) per stream, value = value_proj(e)  [T, n, H], [T, H]
  gate_k = signed sqrt(<key_k, norm_query(x)_k> / sqrt(H))            [T, n, 1]
  g      = sigmoid(gate) * value                                      [T, n, H]
  out    = g + silu(dilated causal depthwise conv(norm_conv(g)))      [T, n * H]
The conv's dilation is the n-gram size; its state is the last (K-1) * dilation inputs of a conversation.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.model.layers import linear
from engine.model.qwen4.hyper import GroupedNorm
from engine.model.state import StateSpec


class Ple:
    def __init__(self, w: dict, prefix: str, count: int, hidden: int, dilation: int, eps: float):
        self.count, self.hidden, self.dilation = count, hidden, dilation
        self.key, self.value = w[prefix + "key_proj.weight"], w[prefix + "value_proj.weight"]
        self.norm_key, self.norm_query, self.norm_conv = (GroupedNorm(w[prefix + f"norm_{name}.weight"], hidden, eps)
                                                          for name in ("key", "query", "conv"))
        self.conv = w[prefix + "conv1d.weight"].view(count * hidden, -1)           # [C, K]

    def state_spec(self) -> StateSpec:
        """The conv's window: the last (K - 1) * dilation inputs, per channel."""
        return StateSpec((self.conv.shape[0], (self.conv.shape[1] - 1) * self.dilation), per_token=False)

    def __call__(self, x: torch.Tensor, rows: torch.Tensor, conv_state: torch.Tensor) -> torch.Tensor:
        # T = tokens, n = streams, H = hidden, E = concatenated rows; x [T, n * H], rows [T, E]
        streams = (self.count, self.hidden)
        key = self.norm_key(linear(rows, self.key)).unflatten(-1, streams)
        query = self.norm_query(x).unflatten(-1, streams)
        gate = (key * query).sum(dim=-1, keepdim=True) / math.sqrt(self.hidden)       # [T, n, 1]
        gate = gate.abs().clamp_min(1e-6).sqrt() * gate.sign()
        gated = (torch.sigmoid(gate) * linear(rows, self.value).unsqueeze(-2)).flatten(-2)   # [T, n * H]
        normed = self.norm_conv(gated)
        return gated + self._conv(normed, conv_state)

    def _conv(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Dilated causal depthwise conv + SiLU over x [T, C], continuing from state [C, S] (updated in place)."""
        window = torch.cat((state, x.transpose(0, 1).to(state.dtype)), dim=1)                 # [C, S + T]
        state.copy_(window[:, window.shape[1] - state.shape[1]:])
        out = F.conv1d(window[None].to(self.conv.dtype), self.conv[:, None, :], groups=self.conv.shape[0],
                       dilation=self.dilation)                                                   # [1, C, T]
        return F.silu(out[0]).transpose(0, 1).to(x.dtype)
