"""Plain data passed across the engine's public API."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationParams:
    max_new_tokens: int = 256
    temperature: float = 0.7      # 0 -> greedy
    top_p: float = 1.0
    top_k: int = 0                # 0 -> off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)   # stop strings (not included in the output)
    ignore_eos: bool = False      # benchmarks: keep going past end-of-sequence tokens


@dataclass
class TokenEvent:
    """One step of `Engine.generate`. `text` is the new, valid-UTF-8 text since the last event."""
    token_id: int | None
    text: str
    finished: bool = False
    finish_reason: str | None = None   # "eos" | "length" | "stop" | "cancelled" when finished
