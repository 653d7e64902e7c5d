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


def test_serve_refuses_a_model_without_tokenizer_files_at_start(cli, tiny_snapshot, tmp_path):
    snapshot = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_snapshot, snapshot)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (snapshot / name).unlink()
    assert cli("repack", snapshot, tmp_path / "model")[0] == 0
    code, err = cli("serve", tmp_path / "model", "--port", "0")
    assert code == 2 and "no tokenizer files" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("text,words", [
    ("{\"eos_token_id\": [2,", "is not valid JSON"), ("[2]", "is not a JSON object"),
    ("{\"eos_token_id\": \"</s>\"}", "eos_token_id"),
])
def test_a_broken_generation_config_is_one_sentence_at_repack_and_at_load(cli, tiny_snapshot, tiny_model, tmp_path,
                                                                         text, words):
    snapshot = tmp_path / "snap"
    shutil.copytree(tiny_snapshot, snapshot)
    (snapshot / "generation_config.json").write_text(text)
    code, err = cli("repack", snapshot, tmp_path / "out")
    assert code == 2 and words in err and "generation_config.json" in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    (model / "generation_config.json").write_text(text)
    code, err = cli("generate", model, "--prompt", "hi", "--max-new-tokens", "1")
    assert code == 2 and words in err and err.count("\n") == 1, err


@pytest.mark.parametrize("template,words", [
    ("{{ messages | no_such_filter }}", "is broken (No filter named 'no_such_filter'"),
    ("{% for m in messages %}{{ m.content }", "is broken (unexpected '}' at line 1)"),
    ("{{ raise_exception('Conversation roles must alternate user/assistant') }}",
     "refused these messages (Conversation roles must alternate user/assistant)"),
    ("{{ messages[3].content }}", "refused these messages"),
])
def test_chat_template_errors_are_one_sentence(cli, tiny_model, tmp_path, template, words):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    (model / "chat_template.jinja").write_text(template)
    code, err = cli("generate", model, "--chat", "--prompt", "hi", "--max-new-tokens", "1")
    assert code == 2 and words in err and err.count("\n") == 1, err


def test_dense_weights_cut_short_while_loaded_are_a_sentence_not_sigbus(tiny_model, tmp_path):
    from engine.errors import SluiceError
    model = shutil.copytree(tiny_model, tmp_path / "model")
    eng = engine.load(model)
    try:
        assert len(list(eng.generate([5, 6], GenerationParams(max_new_tokens=2, temperature=0)))) == 2
        dense = model / "dense.safetensors"
        dense.write_bytes(dense.read_bytes()[:64])        # cut short under the running engine
        with pytest.raises(SluiceError, match="cut short"):
            list(eng.generate([5, 300, 399], GenerationParams(max_new_tokens=2, temperature=0)))
    finally:
        eng.close()
