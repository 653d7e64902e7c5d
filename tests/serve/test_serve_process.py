"""A real `sluice serve` process on 127.0.0.1, driven by the official `openai` client and by httpx."""
import json
import time

import httpx
import openai
import pytest
from serve_helpers import start_server

KEY = "sk-sluice-test"
HI = [{"role": "user", "content": "hello world"}]


@pytest.fixture(scope="module")
def server(serve_model):
    proc = start_server(serve_model, "--max-queue", "1", "--ctx", "384", api_key=KEY)
    yield proc
    stderr = proc.stop()
    assert proc.process.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as c:
        yield c
    wait_idle(server)


def wait_idle(server, timeout_s=20.0) -> dict:
    """The server's counters once nothing waits or runs (a test must not leak a generation into the next)."""
    deadline = time.monotonic() + timeout_s
    while True:
        counters = httpx.get(server.url + "/metrics", headers=server.headers).json()["server"]
        if (counters["queued"], counters["active"]) == (0, 0) or time.monotonic() > deadline:
            return counters
        time.sleep(0.05)


def test_models_are_listed(client):
    assert [m.id for m in client.models.list()] == ["demo"]


def test_chat_non_stream_and_stream_with_usage_agree(client):
    answer = client.chat.completions.create(model="demo", messages=HI, max_tokens=10, temperature=0)
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == 10 and answer.usage.prompt_tokens > 0
    assert answer.choices[0].message.content

    chunks = list(client.chat.completions.create(model="demo", messages=HI, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == answer.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 10
    assert last.usage.prompt_tokens == answer.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_stop_strings_end_the_answer_before_them(client):
    full = client.chat.completions.create(model="demo", messages=HI, max_tokens=24, temperature=0)
    text = full.choices[0].message.content
    stop = text[8:11]
    assert len(stop) == 3, text
    cut = client.chat.completions.create(model="demo", messages=HI, max_tokens=24, temperature=0, stop=[stop, "\x00"])
    assert cut.choices[0].message.content == text[:text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model="demo", messages=HI, max_tokens=24, temperature=0, stop=stop,
                                              stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text[:text.find(stop)]


def test_requests_without_the_key_get_401(server):
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    response = httpx.post(server.url + "/api/chat", json={"messages": HI})
    assert response.status_code == 401 and "Authorization: Bearer" in response.json()["error"]
    assert httpx.get(server.url + "/").status_code == 200          # liveness needs no key
    assert httpx.head(server.url + "/").status_code == 200


def test_tokens_served_equal_sluice_generate(serve_model, server, client, http, capsys):
    from engine.tools.cli import main                 # `sluice generate`'s own code, in this process
    prompt, seed = "the quick brown fox", 7
    assert main(["generate", str(serve_model), "--chat", "--prompt", prompt, "--max-new-tokens", "16",
                 "--temperature", "0.9", "--seed", str(seed), "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)

    ollama = http.post("/api/generate", json={"model": "demo", "prompt": prompt, "stream": False, "options": {
        "num_predict": 16, "temperature": 0.9, "seed": seed, "top_p": 1, "top_k": 0}}).json()
    generated = ollama["context"][ollama["prompt_eval_count"]:]
    assert generated == expected["token_ids"]
    assert ollama["response"] == expected["text"]

    answer = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": prompt}],
                                            max_tokens=16, temperature=0.9, seed=seed, top_p=1,
                                            extra_body={"top_k": 0})
    assert answer.choices[0].message.content == expected["text"]
    assert answer.usage.completion_tokens == len(expected["token_ids"])


def test_completions_endpoint(client):
    done = client.completions.create(model="demo", prompt="hello world", max_tokens=6, temperature=0)
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 6
    streamed = client.completions.create(model="demo", prompt="hello world", max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == done.choices[0].text


def test_raw_sse_stream_ends_with_done(http):
    with http.stream("POST", "/v1/chat/completions", json={"messages": HI, "max_tokens": 3, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    final = json.loads(events[-2][6:])
    assert final["choices"][0]["finish_reason"] == "length" and final["timings"]["predicted_n"] == 3


def test_ollama_chat_streams_ndjson_with_durations(http):
    body = {"model": "demo", "messages": HI, "options": {"num_predict": 8, "temperature": 0}}
    with http.stream("POST", "/api/chat", json=body) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    last = lines[-1]
    assert last["done_reason"] == "length" and last["eval_count"] == 8
    for key in ("total_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(last[key], int) and last[key] > 0
    assert last["total_duration"] >= last["eval_duration"]
    streamed = "".join(line["message"]["content"] for line in lines)
    whole = http.post("/api/chat", json={**body, "stream": False}).json()
    assert whole["message"] == {"role": "assistant", "content": streamed} and whole["done"] is True


def test_ollama_model_endpoints(http):
    assert [m["name"] for m in http.get("/api/tags").json()["models"]] == ["demo"]
    assert http.get("/api/version").json()["version"]
    assert http.get("/api/ps").json()["models"][0]["context_length"] == 384        # --ctx
    show = http.post("/api/show", json={"model": "demo"}).json()
    assert show["details"]["family"] == "qwen3_moe" and "<|im_start|>" in show["template"]


def test_client_disconnect_cancels_and_the_next_request_starts_at_once(server, http):
    with http.stream("POST", "/v1/chat/completions",
                     json={"messages": HI, "max_tokens": 360, "temperature": 0, "stream": True}) as r:
        for i, _line in enumerate(r.iter_lines()):
            if i >= 6:                           # a few tokens in: the generation is running
                break
    started = time.monotonic()
    answer = http.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2}).json()
    assert answer["usage"]["completion_tokens"] == 2
    assert answer["timings"]["queue_ms"] < 1500, answer["timings"]       # 360 tokens would take ~10 s or more
    assert time.monotonic() - started < 10


def test_a_non_streamed_request_is_cancelled_when_its_client_leaves(server, http):
    # 360 tokens (the context holds 384) take ~1 s on a quiet 2-core machine: the client gives up well before
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", headers=server.headers, timeout=0.25,
                   json={"messages": HI, "max_tokens": 360, "temperature": 0})
    answer = http.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2}).json()
    assert answer["timings"]["queue_ms"] < 1500, answer["timings"]


def test_a_full_queue_answers_503_with_retry_after(server):
    body = {"messages": HI, "max_tokens": 360, "temperature": 0, "stream": True}
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as a, \
            httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as b:
        with a.stream("POST", "/v1/chat/completions", json=body) as running:
            lines = running.iter_lines()          # kept: a dropped iterator closes the connection
            next(lines)
            while httpx.get(server.url + "/metrics", headers=server.headers).json()["server"]["active"] != 1:
                time.sleep(0.01)                  # the first chunk can come before the queue hands it the engine
            with b.stream("POST", "/v1/chat/completions", json=body) as waiting:
                assert waiting.status_code == 200
                refused = httpx.post(server.url + "/v1/chat/completions", headers=server.headers, json=body)
                assert refused.status_code == 503
                assert int(refused.headers["Retry-After"]) >= 1
                assert "busy" in refused.json()["error"]["message"]
                counters = httpx.get(server.url + "/metrics", headers=server.headers).json()["server"]
                assert counters["queued"] == 1 and counters["active"] == 1
            deadline = time.monotonic() + 5          # the waiting client left: it leaves the queue
            while httpx.get(server.url + "/metrics", headers=server.headers).json()["server"]["queued"]:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    assert wait_idle(server)["active"] == 0


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ("/v1/chat/completions", {"messages": HI, "temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"messages": HI, "n": 2}, "n"),
    ("/v1/chat/completions", {"messages": HI, "stop": 5}, "stop"),
    ("/v1/completions", {"prompt": {"text": "hi"}}, "prompt"),
    ("/v1/completions", {"prompt": [1, 99999]}, "prompt"),
])
def test_malformed_fields_get_400_naming_the_field(http, path, body, param):
    response = http.post(path, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param or error["param"].startswith(param + "."), error
    assert error["type"] == "invalid_request_error" and param.split(".")[0] in error["message"]


def test_malformed_json_and_ollama_errors_get_400(http):
    for content in (b"{\"messages\": [", b"[1, 2]", b""):
        response = http.post("/v1/chat/completions", content=content, headers={"Content-Type": "application/json"})
        assert response.status_code == 400 and response.json()["error"]["message"].endswith(".")
    response = http.post("/api/chat", json={"messages": HI, "options": {"temperature": -1}})
    assert response.status_code == 400 and "options.temperature" in response.json()["error"]


def test_oversized_body_gets_413(http):
    response = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * (5 << 20)}]})
    assert response.status_code == 413 and "MiB" in response.json()["error"]["message"]


def test_prompt_over_the_context_gets_400_with_the_numbers(http):
    long = [{"role": "user", "content": "the quick brown fox " * 300}]
    error = http.post("/v1/chat/completions", json={"messages": long}).json()["error"]
    assert "384" in error["message"] and "tokens" in error["message"] and error["param"] == "messages"
    error = http.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 500}).json()["error"]
    assert error["param"] == "max_tokens" and "500" in error["message"] and "384" in error["message"]


def test_metrics_carry_the_server_counters(server, http):
    http.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 1})
    snapshot = http.get("/metrics").json()
    assert snapshot["server"]["served"] >= 1 and snapshot["server"]["active"] == 0
    assert snapshot["tokens"]["generated"] == 1 and "ram_cache" in snapshot
