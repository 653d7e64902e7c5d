"""The fault probe's findings, each ending in one sentence or in the right answer: tiny temperatures, server
settings that cannot work, models without a tokenizer or with a broken template or generation config."""
import json
import shutil

import pytest

import engine
from engine.params import GenerationParams


@pytest.mark.parametrize("temperature", [1e-39, 1e-45, 5e-324])
@pytest.mark.parametrize("top_k", [0, 5])
def test_a_tiny_temperature_samples_the_greedy_tokens(tiny_model, temperature, top_k):
    eng = engine.load(tiny_model)
    try:
        greedy = [e.token_id for e in eng.generate([5, 6, 7], GenerationParams(max_new_tokens=8, temperature=0))]
        tiny = [e.token_id for e in eng.generate([5, 6, 7], GenerationParams(
            max_new_tokens=8, temperature=temperature, top_k=top_k, seed=1))]
    finally:
        eng.close()
    assert tiny == greedy and len(set(greedy)) > 1


@pytest.mark.parametrize("option,value,words", [
    ("--port", "99999", "--port"), ("--port", "-1", "--port"), ("--max-queue", "0", "--max-queue"),
    ("--api-key", "clé", "--api-key"),
])
def test_serve_settings_that_cannot_work_are_refused_before_loading(cli, tmp_path, option, value, words):
    code, err = cli("serve", tmp_path / "not-even-a-model", option, value)
    assert code == 2 and words in err and "Traceback" not in err and err.count("\n") == 1, err
