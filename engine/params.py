"""Plain data passed across the engine's public API, and the one place its ranges are checked."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.errors import SluiceError

MAX_SEED = 2**64 - 1
MAX_LOGPROBS = 20                 # the OpenAI API's limit for top_logprobs


@dataclass
class GenerationParams:
    max_new_tokens: int = 256
    temperature: float = 0.7      # 0 -> greedy
    top_p: float = 1.0
    top_k: int = 0                # 0 -> off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)   # stop strings (not included in the output)
    ignore_eos: bool = False      # benchmarks: keep going past end-of-sequence tokens
    grammar: str | None = None    # structured output: an llguidance grammar (engine.grammar.grammar_for builds it)
    logprobs: int | None = None   # None: off; n: each event carries its token's log-probability and the n most likely
    keep_special_tokens: bool = False   # the text shows special tokens (the server's harmony / DeepSeek parsers read them)

    def validate(self, vocab_size: int | None = None, prompt=None) -> None:
        """Raise SluiceError (one sentence) for a value outside its range. The engine calls this first
        thing in generate(); the CLI, the app and the server call it to refuse early. With `vocab_size`,
        a prompt given as token ids must hold ids in [0, vocab_size)."""
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise SluiceError(f"max new tokens must be a whole number of at least 1 (got {self.max_new_tokens!r}).")
        if not _is_number(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise SluiceError(f"The temperature must be a finite number of 0 or more (0 = greedy); got {self.temperature!r}.")
        if not _is_number(self.top_p) or not (0 < self.top_p <= 1):
            raise SluiceError(f"top-p must be above 0 and at most 1 (1 = off); got {self.top_p!r}.")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise SluiceError(f"top-k must be a whole number of 0 or more (0 = off); got {self.top_k!r}.")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= MAX_SEED):
            raise SluiceError(f"The seed must be a whole number from 0 to 2^64-1; got {self.seed!r}.")
        if not isinstance(self.stop, (list, tuple)) or not all(isinstance(s, str) and s for s in self.stop):
            raise SluiceError("Stop strings must be a list of non-empty texts.")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise SluiceError(f"top logprobs must be a whole number from 0 to {MAX_LOGPROBS}; got {self.logprobs!r}.")
        if vocab_size is not None and isinstance(prompt, (list, tuple)) and prompt and all(_is_int(i) for i in prompt):
            bad = next((i for i in prompt if not 0 <= i < vocab_size), None)
            if bad is not None:
                raise SluiceError(f"Prompt token id {bad} is outside this model's vocabulary (ids 0 to {vocab_size - 1}).")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class TokenEvent:
    """One step of `Engine.generate`. `text` is the new, valid-UTF-8 text since the last event."""
    token_id: int | None
    text: str
    finished: bool = False
    finish_reason: str | None = None   # "eos" | "length" | "stop" | "cancelled" when finished
    logprob: float | None = None       # with params.logprobs: log p(token_id) under the logits it was drawn from
    top_logprobs: list[tuple[int, float]] | None = None    # (id, log p) of the most likely, most likely first
