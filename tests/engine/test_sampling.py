"""Sampling draws from the softmax of the (temperature-scaled, top-k / top-p cut) logits, reproducibly."""
import torch

from engine.params import GenerationParams
from engine.runtime.sampling import make_generator, sample

LOGITS = torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0])


def draws(params: GenerationParams, n: int = 4000, seed: int = 0) -> torch.Tensor:
    gen = make_generator(seed, torch.device("cpu"))
    return torch.bincount(torch.tensor([sample(LOGITS, params, gen) for _ in range(n)]), minlength=5).float() / n


def test_frequencies_follow_the_softmax():
    freq = draws(GenerationParams(temperature=1.0))
    assert (freq - LOGITS.softmax(-1)).abs().max() < 0.03          # 4000 draws: ~0.008 standard error


def test_temperature_zero_and_top_k_one_are_greedy():
    assert sample(LOGITS, GenerationParams(temperature=0), None) == 0
    assert draws(GenerationParams(temperature=1.0, top_k=1), n=50)[0] == 1.0


def test_top_k_and_top_p_cut_the_tail():
    assert draws(GenerationParams(temperature=1.0, top_k=2))[2:].sum() == 0
    probs = LOGITS.softmax(-1)                                      # 0.55, 0.20, 0.12, 0.03, 0.07
    freq = draws(GenerationParams(temperature=1.0, top_p=0.7))      # keeps the two most likely
    assert freq[2:].sum() == 0 and abs(freq[0] - probs[0] / probs[:2].sum()) < 0.03


def test_the_same_seed_gives_the_same_tokens():
    params = GenerationParams(temperature=0.9)
    assert torch.equal(draws(params, n=200, seed=5), draws(params, n=200, seed=5))
    assert not torch.equal(draws(params, n=200, seed=5), draws(params, n=200, seed=6))
