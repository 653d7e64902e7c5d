"""Next-token choice: greedy, or temperature / top-k / top-p sampling with a seeded generator.

Without top-k, sampling runs where the logits are (the GPU in decode): an exponential race,
argmax(p / q) with q ~ Exp(1), draws from p exactly; taken as argmax(logits - log q) it needs no softmax
(on a GPU one block for the whole row: ~60 us at a 250k vocabulary) and costs a few elementwise passes and one argmax,
where copying the logits to the host and `torch.multinomial` there took ~3.7 ms a token (OLMoE's 50k
vocabulary, profiled on the H200 box).

With top-k (the app's default, 40) only the tokens whose logit is at least the k-th largest can be
drawn (ties with the k-th kept, as transformers' top-k keeps them). The device gives the k largest of
each chunk of the vocabulary (kernels/top_candidates.py, on a GPU where its self-check passed), and the
host finds the survivors among those few and finishes the draw on them in numpy: temperature, top-p,
the softmax and the same race, with the generation's host generator. No torch sampling operator runs on
the GPU, so none of their CUDA modules loads (they would hold 174 MiB of host memory). Where the
chunks cannot tell the survivors (one chunk holding all k of them: it may hold more ties), and on the
CPU device, the host takes the whole row of logits.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from engine.params import GenerationParams
from kernels.vocab_chunks import MAX_K, survivors_among, survivors_in_row

FLOAT32_TINY = float(np.finfo(np.float32).tiny)
Candidates = Callable[[torch.Tensor, int], torch.Tensor]      # kernels.top_candidates.top_candidates


class Randomness:
    """One generation's random draws: on the logits' device (the race over the whole vocabulary) and on
    the host (the top-k survivors' race), both from the seed when there is one."""

    def __init__(self, seed: int | None, device: torch.device):
        self.device = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
        self.host = np.random.default_rng(seed)


def make_generator(seed: int | None, device: torch.device) -> Randomness:
    return Randomness(seed, device)


def sample(logits: torch.Tensor, params: GenerationParams, generator: Randomness | None,
           candidates: Candidates | None = None) -> int:
    """logits [V] float32 -> token id (one host sync). `candidates`: the checked top-candidates kernel for
    the logits' device, or None (the host takes the whole row when it needs it)."""
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    generator = generator or Randomness(None, logits.device)
    vocab = logits.shape[-1]
    if params.top_k and params.top_k < vocab:
        values, ids = top_k_survivors(logits, params.top_k, candidates)
        return finish_draw(values, ids, params, generator.host)
    # the top at 0 and the divisor a float32 that is not 0: a tiny temperature draws the top token, not NaN
    logits = (logits.float() - logits.max()) / max(params.temperature, FLOAT32_TINY)
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(-1) - probs > params.top_p                   # keeps at least the top token
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    race = torch.empty_like(logits).exponential_(generator=generator.device)
    return int(torch.argmax(logits - torch.log(race)))             # argmax(p / q), p's softmax left out


def top_k_survivors(logits: torch.Tensor, k: int, candidates: Candidates | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The logits at least the k-th largest (ties included) and their ids, on the host (float32, int64)."""
    if candidates is not None and k <= MAX_K:
        found = survivors_among(candidates(logits, k).cpu().numpy(), k, logits.shape[-1])
        if found is not None:
            return found
    return survivors_in_row(logits, k)


def finish_draw(values: np.ndarray, ids: np.ndarray, params: GenerationParams, rng: np.random.Generator) -> int:
    """Temperature, top-p, softmax and the exponential race over the top-k survivors (host, float64)."""
    with np.errstate(over="ignore"):              # a tiny temperature: the others go to -inf, the top stays 0
        scaled = (values.astype(np.float64) - values.max()) / params.temperature
    order = np.lexsort((ids, -scaled))                  # most likely first; a tie: the lower id first
    scaled, ids = scaled[order], ids[order]
    probs = np.exp(scaled - scaled[0])
    probs /= probs.sum()
    if params.top_p < 1.0:
        keep = np.cumsum(probs) - probs <= params.top_p                  # keeps at least the top token
        ids, probs = ids[keep], probs[keep] / probs[keep].sum()
    race = rng.exponential(size=probs.size)
    return int(ids[np.argmax(probs / race)])


class TokenMask:
    """A grammar's allowed tokens applied to the logits where they are: the host fills a (pinned) bitmask,
    one non-blocking copy takes it to the device and the device masks the logits, so the only host sync per
    token stays the sampler's own."""

    def __init__(self, constraint, vocab_size: int, device: torch.device):
        self.constraint = constraint
        words = constraint.num_words
        self.host = torch.empty(words, dtype=torch.int32, pin_memory=device.type == "cuda")
        self.device = torch.empty(words, dtype=torch.int32, device=device) if device.type == "cuda" else self.host
        ids = torch.arange(vocab_size, device=device)
        self.word, self.bit = ids // 32, (ids % 32).to(torch.int32)        # [V]: where token t's bit lives

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        self.constraint.fill(self.host)
        if self.device is not self.host:
            self.device.copy_(self.host, non_blocking=True)    # the host buffer is reused only after the draw synced
        allowed = (self.device[self.word] >> self.bit) & 1
        return logits.masked_fill(allowed == 0, float("-inf"))


class TokenSampler:
    """One generation's next-token choice: the grammar's mask (if any), then `sample`, then the chosen
    token's log-probability and the `num_logprobs` most likely alternatives (from the same masked logits,
    before temperature), which cost one more small copy only when asked for."""

    def __init__(self, params: GenerationParams, device: torch.device, candidates: Candidates | None = None,
                 constraint=None, vocab_size: int | None = None):
        self.params, self.candidates, self.constraint = params, candidates, constraint
        self.generator = make_generator(params.seed, device)
        self.mask = TokenMask(constraint, vocab_size, device) if constraint is not None else None
        self.logprobs: tuple[float, list[tuple[int, float]]] | None = None

    def __call__(self, logits: torch.Tensor) -> int:
        if self.mask is not None:
            logits = self.mask.apply(logits)
        token = sample(logits, self.params, self.generator, self.candidates)
        if self.params.logprobs is not None:
            self.logprobs = token_logprobs(logits, token, self.params.logprobs)
        if self.constraint is not None and not self.constraint.is_done:
            self.constraint.accept(token)
        return token


def token_logprobs(logits: torch.Tensor, token: int, num_top: int) -> tuple[float, list[tuple[int, float]]]:
    """(log p(token), [(id, log p)] of the num_top most likely, most likely first), p = softmax(logits)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    top = torch.topk(logp, num_top) if num_top else None
    chosen = float(logp[token])
    if top is None:
        return chosen, []
    return chosen, list(zip(top.indices.tolist(), top.values.tolist()))
