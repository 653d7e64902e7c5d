"""Structured output and logprobs through a real server (in this process) and the official `openai` client.

The model has random weights, so only the grammar can make its answers follow a schema.
"""
import json
import math

import httpx
import openai
import pytest

import engine
from engine.serve import Server

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "ok", "n"],
          "properties": {"name": {"enum": ["red", "green"]}, "ok": {"type": "boolean"},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99}}}
ASK = [{"role": "user", "content": "Give me a colour."}]


def follows_schema(answer: dict) -> bool:
    return (set(answer) == {"name", "ok", "n"} and answer["name"] in ("red", "green")
            and isinstance(answer["ok"], bool) and isinstance(answer["n"], int) and 0 <= answer["n"] <= 99)


@pytest.fixture(scope="module")
def served(serve_model):
    eng = engine.load(serve_model)
    server = Server(eng, port=0)
    server.start()
    yield server, openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    server.stop()
    eng.close()


def test_a_strict_schema_holds_100_times_at_temperature_0_8(served):
    _, client = served
    fmt = {"type": "json_schema", "json_schema": {"name": "colour", "schema": SCHEMA, "strict": True}}
    answers = [client.chat.completions.create(model="m", messages=ASK, temperature=0.8, max_tokens=40,
                                              response_format=fmt) for _ in range(100)]
    assert all(a.choices[0].finish_reason == "stop" for a in answers)
    assert all(follows_schema(json.loads(a.choices[0].message.content)) for a in answers)
    assert len({a.choices[0].message.content for a in answers}) > 1        # sampled, not one fixed answer


def test_the_schema_holds_streamed_and_without_it_the_answer_is_not_json(served):
    _, client = served
    fmt = {"type": "json_schema", "json_schema": {"name": "colour", "schema": SCHEMA}}
    chunks = client.chat.completions.create(model="m", messages=ASK, temperature=0.8, max_tokens=40,
                                            response_format=fmt, stream=True, seed=3)
    assert follows_schema(json.loads("".join(c.choices[0].delta.content or "" for c in chunks if c.choices)))
    plain = client.chat.completions.create(model="m", messages=ASK, temperature=0.8, max_tokens=40, seed=3)
    with pytest.raises(ValueError):
        json.loads(plain.choices[0].message.content)


def test_json_object_answers_are_json_objects(served):
    _, client = served
    answer = client.chat.completions.create(model="m", messages=ASK, temperature=0, max_tokens=200,
                                            response_format={"type": "json_object"}, seed=1)
    text = answer.choices[0].message.content
    assert text.startswith("{")
    if answer.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_regex_format_on_completions(served):
    _, client = served
    answer = client.completions.create(model="m", prompt="the quick", max_tokens=20, temperature=1.0,
                                       extra_body={"response_format": {"type": "regex", "regex": "[0-9]{3}-[a-z]{2}"}})
    import re
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", answer.choices[0].text)


@pytest.mark.parametrize("schema, words", [({"type": "strin"}, "strin"), ({"$ref": "#/defs/x"}, "/defs/x"),
                                           ({"type": "string", "pattern": "(?<=a)b"}, "look-around")])
def test_a_schema_that_cannot_compile_is_a_400_naming_the_part(served, schema, words):
    server, _ = served
    body = {"messages": ASK, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    response = httpx.post(server.url + "/v1/chat/completions", json=body)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "response_format" and words in error["message"]


def test_chat_logprobs_agree_with_the_chosen_tokens(served):
    _, client = served
    greedy = client.chat.completions.create(model="m", messages=ASK, temperature=0, max_tokens=12,
                                            logprobs=True, top_logprobs=3)
    content = greedy.choices[0].logprobs.content
    assert len(content) == greedy.usage.completion_tokens
    assert "".join(t.token for t in content) == greedy.choices[0].message.content
    for t in content:                            # greedy: the chosen token is the most likely one
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob) and t.logprob < 0
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
    stream = client.chat.completions.create(model="m", messages=ASK, temperature=0, max_tokens=12,
                                            logprobs=True, top_logprobs=3, stream=True)
    streamed = [t for c in stream if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [(t.token, round(t.logprob, 4)) for t in content]


def test_sampled_logprobs_are_those_of_the_drawn_token(served):
    _, client = served
    answer = client.chat.completions.create(model="m", messages=ASK, temperature=1.0, max_tokens=16, seed=5,
                                            logprobs=True, top_logprobs=20)
    content = answer.choices[0].logprobs.content
    for t in content:
        alternatives = {a.token: a.logprob for a in t.top_logprobs}
        if t.token in alternatives:
            assert t.logprob == pytest.approx(alternatives[t.token])
        else:                                    # drawn from outside the 20 most likely
            assert t.logprob <= min(alternatives.values()) + 1e-6
    assert sum(math.exp(a.logprob) for a in content[0].top_logprobs) <= 1.0 + 1e-5


def test_completion_logprobs_streamed_and_not(served):
    _, client = served
    answer = client.completions.create(model="m", prompt="the quick", max_tokens=8, temperature=0, logprobs=2)
    lp = answer.choices[0].logprobs
    assert "".join(lp.tokens) == answer.choices[0].text and len(lp.token_logprobs) == 8
    assert all(max(top.values()) == pytest.approx(chosen) for top, chosen in zip(lp.top_logprobs, lp.token_logprobs))
    stream = client.completions.create(model="m", prompt="the quick", max_tokens=8, temperature=0, logprobs=2,
                                       stream=True)
    tokens = [t for c in stream if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert tokens == lp.tokens


def test_sluice_generate_takes_a_json_schema_and_names_a_bad_one(serve_model, capsys):
    from engine.tools.cli import main                 # `sluice generate`'s own code, in this process
    assert main(["generate", str(serve_model), "--prompt", "hi", "--chat", "--temperature", "0.8",
                 "--max-new-tokens", "40", "--json", "--json-schema", json.dumps(SCHEMA)]) == 0
    assert follows_schema(json.loads(json.loads(capsys.readouterr().out)["text"]))
    bad = main(["generate", str(serve_model), "--prompt", "hi", "--response-format",
                '{"type": "json_schema", "json_schema": {"schema": {"type": "strin"}}}'])
    err = capsys.readouterr().err
    assert bad != 0 and "Invalid type: strin" in err and "Traceback" not in err


def test_ollama_format_takes_a_schema(served):
    server, _ = served
    body = {"messages": ASK, "stream": False, "format": SCHEMA, "options": {"temperature": 0.8, "num_predict": 40}}
    answer = httpx.post(server.url + "/api/chat", json=body, timeout=60).json()
    assert follows_schema(json.loads(answer["message"]["content"]))
    bad = httpx.post(server.url + "/api/generate", json={"prompt": "x", "format": "yaml"})
    assert bad.status_code == 400 and "format" in bad.json()["error"]
