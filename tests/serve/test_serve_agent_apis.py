"""The Responses and Anthropic Messages APIs through a real server and the official `openai` / `anthropic` clients.

Text answers come from the real engine (random weights); tool calls come from the scripted engine of
test_serve_tools (a Qwen-style template: a random model never writes a call), with the real template.
"""
import json

import anthropic
import httpx
import openai
import pytest

import engine
from engine.serve import Server
from tests.serve.test_serve_tools import CALLS, TOOLS_TEMPLATE, ScriptedEngine

KEY = "sk-test-key"
ONE_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER_OPENAI = {"type": "function", "name": "get_weather", "description": "Weather in a city",
                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
WEATHER_ANTHROPIC = {"name": "get_weather", "description": "Weather in a city",
                     "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.fixture(scope="module")
def served(serve_model):
    eng = engine.load(serve_model)
    server = Server(eng, port=0, api_key=KEY)
    server.start()
    yield server
    server.stop()
    eng.close()


@pytest.fixture(scope="module")
def scripted(serve_model):
    eng = ScriptedEngine(serve_model, TOOLS_TEMPLATE)
    server = Server(eng, port=0)
    server.start()
    yield eng, server
    server.stop()


def clients(server, key=KEY):
    return (openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60),
            anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=60))


def test_responses_text_streamed_and_not(served):
    client, _ = clients(served)
    response = client.responses.create(model="m", input="Hello", max_output_tokens=8, temperature=0)
    assert response.status == "incomplete" and response.usage.output_tokens == 8 and response.output_text
    events = list(client.responses.create(model="m", input="Hello", max_output_tokens=8, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == response.output_text
    assert events[-1].response.output_text == response.output_text
    assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))


def test_responses_previous_response_id_continues_the_conversation(served):
    client, _ = clients(served)
    first = client.responses.create(model="m", input="Hello", max_output_tokens=4, temperature=0)
    second = client.responses.create(model="m", input="And then?", previous_response_id=first.id,
                                     max_output_tokens=4, temperature=0)
    alone = client.responses.create(model="m", input="And then?", max_output_tokens=4, temperature=0)
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="m", input="x", previous_response_id="resp_unknown", max_output_tokens=2)


def test_responses_structured_output(served):
    client, _ = clients(served)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    response = client.responses.create(model="m", input="Is it?", temperature=0.8, max_output_tokens=20, text={
        "format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}})
    assert isinstance(json.loads(response.output_text)["ok"], bool)


def test_messages_text_streamed_and_not(served):
    _, client = clients(served)
    message = client.messages.create(model="m", max_tokens=8, extra_body={"temperature": 0}, system="Be brief.",
                                     messages=[{"role": "user", "content": [{"type": "text", "text": "Hello"}]}])
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 8
    assert message.content[0].type == "text" and message.content[0].text
    with client.messages.stream(model="m", max_tokens=8, extra_body={"temperature": 0}, system="Be brief.",
                                messages=[{"role": "user", "content": "Hello"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == message.content[0].text and final.stop_reason == "max_tokens"
    assert final.usage.input_tokens == message.usage.input_tokens
    count = client.messages.count_tokens(model="m", system="Be brief.", messages=[{"role": "user", "content": "Hello"}])
    assert count.input_tokens == message.usage.input_tokens


def test_every_new_route_needs_the_key(served):
    for path in ("/v1/responses", "/v1/messages", "/v1/messages/count_tokens"):
        assert httpx.post(served.url + path, json={}).status_code == 401
        assert httpx.post(served.url + path, json={}, headers={"x-api-key": "wrong"}).status_code == 401
    _, client = clients(served, key="wrong")
    with pytest.raises(anthropic.AuthenticationError):
        client.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "x"}])
    body = httpx.post(served.url + "/v1/messages", json={"messages": []}, headers={"x-api-key": KEY}).json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"


def test_messages_tool_use_round_trip(scripted):
    eng, server = scripted
    _, client = clients(server, key="none")
    eng.script = CALLS
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    message = client.messages.create(model="m", max_tokens=100, tools=[WEATHER_ANTHROPIC], messages=ask)
    uses = [b for b in message.content if b.type == "tool_use"]
    assert message.stop_reason == "tool_use" and message.content[0].text.strip() == "I will look."
    assert [(u.name, u.input) for u in uses] == [("get_weather", {"city": "Paris", "unit": "celsius"}),
                                                 ("get_time", {"tz": "CET"})]
    with client.messages.stream(model="m", max_tokens=100, tools=[WEATHER_ANTHROPIC], messages=ask) as stream:
        final = stream.get_final_message()
    assert [b.input for b in final.content if b.type == "tool_use"] == [u.input for u in uses]
    eng.script = "It is 18 degrees."
    follow = ask + [{"role": "assistant", "content": [uses[0]]},            # one call: the context is 512 tokens
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "18 C"}]}]
    answer = client.messages.create(model="m", max_tokens=40, tools=[WEATHER_ANTHROPIC], messages=follow)
    assert answer.content[0].text == "It is 18 degrees." and answer.stop_reason == "end_turn"
    assert "<tool_response>\n18 C\n</tool_response>" in eng.prompts[-1]


def test_responses_function_call_round_trip(scripted):
    eng, server = scripted
    client, _ = clients(server, key="none")
    eng.script = ONE_CALL                                  # one call: the follow-up fits the 512-token context
    response = client.responses.create(model="m", input="Weather in Paris?", tools=[WEATHER_OPENAI])
    calls = [o for o in response.output if o.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    events = list(client.responses.create(model="m", input="Weather in Paris?", tools=[WEATHER_OPENAI], stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(deltas) == {"city": "Paris"}
    assert [e.item.type for e in events if e.type == "response.output_item.done"] == ["function_call"]
    eng.script = "It is 18 degrees."
    follow = client.responses.create(model="m", previous_response_id=response.id, tools=[WEATHER_OPENAI],
                                     input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                             "output": "18 C"}])
    assert follow.output_text == "It is 18 degrees."
    assert "<tool_response>\n18 C\n</tool_response>" in eng.prompts[-1] and "Weather in Paris?" in eng.prompts[-1]


def test_responses_logprobs_streamed_and_not_agree_with_the_chat_api(served):
    client, _ = clients(served)
    ask = dict(model="m", input="Give me a colour.", max_output_tokens=10, temperature=0)
    response = client.responses.create(**ask, include=["message.output_text.logprobs"], top_logprobs=3)
    logprobs = response.output[0].content[0].logprobs
    assert len(logprobs) == response.usage.output_tokens
    assert "".join(t.token for t in logprobs) == response.output_text
    for t in logprobs:                            # greedy: the chosen token is the most likely one
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob) and t.logprob < 0
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Give me a colour."}],
                                          max_tokens=10, temperature=0, logprobs=True, top_logprobs=3)
    scores = [(t.token, round(t.logprob, 4)) for t in logprobs]
    assert scores == [(t.token, round(t.logprob, 4)) for t in chat.choices[0].logprobs.content]

    events = list(client.responses.create(**ask, include=["message.output_text.logprobs"], top_logprobs=3,
                                          stream=True))
    streamed = [t for e in events if e.type == "response.output_text.delta" for t in e.logprobs]
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == scores
    done = next(e for e in events if e.type == "response.output_text.done")
    assert [(t.token, round(t.logprob, 4)) for t in done.logprobs] == scores
    assert events[-1].response.output[0].content[0].logprobs[0].token == logprobs[0].token
    assert client.responses.create(**ask).output[0].content[0].logprobs == []      # only when asked
