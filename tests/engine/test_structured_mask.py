"""The grammar's token mask applied where the logits are (CPU here; the CUDA case runs on a GPU box), and
structured output through Engine.generate with top-k on (the path the app's chats take)."""
import json

import numpy as np
import pytest
import torch

import engine
from engine.grammar import Constraint, grammar_for, response_format_for_setting
from engine.params import GenerationParams
from engine.runtime.sampling import TokenMask, TokenSampler

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from engine.tools.demo import train_tiny_tokenizer
    return train_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.mark.parametrize("device", DEVICES)
def test_the_device_mask_allows_exactly_the_grammar_tokens(tokenizer, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA")
    vocab = len(tokenizer) + 37                      # the model's vocabulary may be larger than the tokenizer's
    constraint = Constraint(grammar_for({"type": "json_object"}), tokenizer, vocab, {2})
    words = torch.zeros(constraint.num_words, dtype=torch.int32)
    constraint.fill(words)
    expected = np.unpackbits(words.numpy().view(np.uint8), bitorder="little")[:vocab].astype(bool)
    mask = TokenMask(constraint, vocab, torch.device(device))
    logits = torch.randn(vocab, device=device)
    masked = mask.apply(logits).cpu()
    assert (torch.isfinite(masked).numpy() == expected).all() and 0 < expected.sum() < len(tokenizer)
    assert not expected[len(tokenizer):].any()       # ids past the tokenizer are never allowed


@pytest.mark.parametrize("device", DEVICES)
def test_the_sampler_draws_only_allowed_tokens_and_scores_them(tokenizer, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA")
    vocab = len(tokenizer)
    params = GenerationParams(temperature=1.0, top_k=5, seed=1, logprobs=2)
    constraint = Constraint(grammar_for({"type": "json_object"}), tokenizer, vocab, {2})
    sampler = TokenSampler(params, torch.device(device), None, constraint, vocab)
    token = sampler(torch.randn(vocab, device=device))
    assert tokenizer.decode([token]).startswith("{")
    logprob, top = sampler.logprobs
    assert logprob <= 0 and len(top) == 2 and top[0][1] >= top[1][1]


def test_engine_generate_follows_a_schema_with_top_k(tmp_path_factory):
    from engine.tools.demo import build_demo_model
    eng = engine.load(build_demo_model(tmp_path_factory.mktemp("demo") / "demo"))
    try:
        grammar = grammar_for({"type": "json_schema", "json_schema": {"schema": SCHEMA}})
        for seed in range(5):
            events = list(eng.generate([{"role": "user", "content": "hi"}],
                                       GenerationParams(max_new_tokens=20, temperature=0.9, top_k=40, seed=seed,
                                                        grammar=grammar)))
            assert isinstance(json.loads("".join(e.text for e in events))["ok"], bool)
            assert events[-1].finish_reason == "eos"
    finally:
        eng.close()


def test_special_tokens_stay_in_the_text_when_a_tool_parser_needs_them(tokenizer):
    from engine.detokenize import IncrementalDetokenizer
    ids = tokenizer("hello")["input_ids"] + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    kept, skipped = IncrementalDetokenizer(tokenizer, keep_special=True), IncrementalDetokenizer(tokenizer)
    assert "".join(kept.push(i) for i in ids) == "hello<|im_end|>"
    assert "".join(skipped.push(i) for i in ids) == "hello"


@pytest.mark.parametrize("setting, expected", [
    ("", None),
    (" JSON ", {"type": "json_object"}),
    (json.dumps(SCHEMA), {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}),
])
def test_the_structured_output_setting_is_a_response_format(setting, expected):
    assert response_format_for_setting(setting) == expected     # a remote endpoint is sent this as it is


@pytest.mark.parametrize("setting", ["{not json", "[1, 2]"])
def test_a_structured_output_setting_that_is_neither_json_nor_a_schema_is_one_sentence(setting):
    with pytest.raises(engine.SluiceError, match="structured output setting"):
        response_format_for_setting(setting)
