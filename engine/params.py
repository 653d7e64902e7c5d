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
        checks = (
            (_whole(self.max_new_tokens, 1), f"max new tokens must be a whole number of at least 1 "
                                             f"(got {self.max_new_tokens!r})."),
            (_real(self.temperature, 0), f"The temperature must be a finite number of 0 or more (0 = greedy); "
                                         f"got {self.temperature!r}."),
            (_real(self.top_p, 0, 1, above_low=True), f"top-p must be above 0 and at most 1 (1 = off); "
                                                      f"got {self.top_p!r}."),
            (_whole(self.top_k, 0), f"top-k must be a whole number of 0 or more (0 = off); got {self.top_k!r}."),
            (self.seed is None or _whole(self.seed, 0, MAX_SEED),
             f"The seed must be a whole number from 0 to 2^64-1; got {self.seed!r}."),
            (_texts(self.stop), "Stop strings must be a list of non-empty texts."),
            (self.logprobs is None or _whole(self.logprobs, 0, MAX_LOGPROBS),
             f"top logprobs must be a whole number from 0 to {MAX_LOGPROBS}; got {self.logprobs!r}."),
        )
        for ok, sentence in checks:
            if not ok:
                raise SluiceError(sentence)
        bad = _token_outside(prompt, vocab_size)
        if bad is not None:
            raise SluiceError(f"Prompt token id {bad} is outside this model's vocabulary (ids 0 to {vocab_size - 1}).")


def _whole(value, low: int, high: float = math.inf) -> bool:
    return _is_int(value) and low <= value <= high


def _real(value, low: float, high: float = math.inf, above_low: bool = False) -> bool:
    """A finite number in [low, high], or (low, high] with `above_low`."""
    if not _is_number(value) or not math.isfinite(value):
        return False
    return (value > low if above_low else value >= low) and value <= high


def _texts(stop) -> bool:
    return isinstance(stop, (list, tuple)) and all(isinstance(s, str) and s for s in stop)


def _token_outside(prompt, vocab_size: int | None) -> int | None:
    """The first id of a token-id prompt outside [0, vocab_size), if any."""
    if vocab_size is None or not isinstance(prompt, (list, tuple)) or not all(_is_int(i) for i in prompt):
        return None
    return next((i for i in prompt if not 0 <= i < vocab_size), None)


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
