"""Tool calls and reasoning through a real server and the `openai` client.

A random model never writes a tool call, so the engine here is scripted: its `generate` yields a given
text in small pieces, while `encode` is the real Engine.encode on a real tokenizer with a Qwen-style
chat template that defines tools (so the tool definitions really go through the template).
"""
import json
import threading

import httpx
import openai
import pytest

from engine.engine import Engine
from engine.params import TokenEvent
from engine.serve import Server

TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>\n{%- for tool in tools %}\n{{ tool | tojson }}\n"
    "{%- endfor %}\n</tools>\nFor each function call, return <tool_call>\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{%- for tc in m.tool_calls %}"
    "<tool_call>\n{\"name\": \"{{ tc.function.name }}\", \"arguments\": {{ tc.function.arguments | tojson }}}\n"
    "</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}{%- endif %}")
CALLS = ('I will look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
         '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>')
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


class ScriptedEngine:
    """The engine's public API with a scripted answer; encode is the real one."""
    encode = Engine.encode

    def __init__(self, model_dir, chat_template: str):
        from transformers import AutoTokenizer
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.tokenizer.chat_template = chat_template
        self.info = {"name": "scripted", "path": str(model_dir), "family": "qwen3_moe", "max_context": 512}
        self.script = ""
        self.prompts: list[str] = []
        self.cancelled = threading.Event()

    def generate(self, prompt, params):
        ids, _ = self.encode(prompt)
        self.prompts.append(self.tokenizer.decode(ids))
        self.cancelled.clear()
        pieces = [self.script[i:i + 3] for i in range(0, len(self.script), 3)]
        for n, piece in enumerate(pieces):
            if self.cancelled.is_set():
                yield TokenEvent(None, "", True, "cancelled")
                return
            yield TokenEvent(100 + n, piece)
        yield TokenEvent(2, "", True, "eos")

    def cancel(self):
        self.cancelled.set()

    def telemetry(self):
        return {"tokens": {"prompt": 0, "generated": 0}}


@pytest.fixture(scope="module")
def scripted(serve_model):
    engine = ScriptedEngine(serve_model, TOOLS_TEMPLATE)
    server = Server(engine, port=0)
    server.start()
    yield engine, openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=30), server
    server.stop()


def test_tool_calls_stream_as_the_spec_says(scripted):
    engine, client, _ = scripted
    engine.script = CALLS
    chunks = list(client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], stream=True))
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if tc.index not in calls:           # the first delta of a call: id, type and name, no arguments yet
                assert tc.id and tc.type == "function" and tc.function.name and not tc.function.arguments
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
            else:
                assert tc.function.name is None
                calls[tc.index]["arguments"] += tc.function.arguments or ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == \
           [("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {"tz": "CET"})]
    assert calls[0]["id"] != calls[1]["id"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip() == "I will look."
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert '"name": "get_weather"' in engine.prompts[-1] and "<tools>" in engine.prompts[-1]


def test_tool_calls_non_stream_and_the_result_goes_back_through_the_template(scripted):
    engine, client, _ = scripted
    engine.script = CALLS
    answer = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER])
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content.strip() == "I will look."
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Paris"

    engine.script = "It is 18 degrees."
    follow_up = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                       {"role": "tool", "tool_call_id": call.id, "content": "18 C"}]
    answer = client.chat.completions.create(model="m", messages=follow_up, tools=[WEATHER])
    assert answer.choices[0].message.content == "It is 18 degrees." and answer.choices[0].finish_reason == "stop"
    assert "<tool_response>\n18 C\n</tool_response>" in engine.prompts[-1]
    assert '"arguments": {"city": "Paris", "unit": "celsius"}' in engine.prompts[-1]


def test_tool_call_text_without_tools_in_the_request_stays_content(scripted):
    engine, client, _ = scripted
    engine.script = CALLS
    answer = client.chat.completions.create(model="m", messages=ASK)
    assert answer.choices[0].message.content == CALLS and answer.choices[0].message.tool_calls is None


def test_thinking_comes_back_as_reasoning_content(scripted):
    engine, client, _ = scripted
    engine.script = "<think>\nThe user wants weather.\n</think>\n\nSunny."
    answer = client.chat.completions.create(model="m", messages=ASK)
    message = answer.choices[0].message
    assert message.content == "Sunny." and message.model_extra["reasoning_content"] == "\nThe user wants weather.\n"
    chunks = list(client.chat.completions.create(model="m", messages=ASK, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == "\nThe user wants weather.\n"
    assert "".join(d.content or "" for d in deltas) == "Sunny."


def test_ollama_chat_returns_tool_calls_with_object_arguments(scripted):
    engine, _, server = scripted
    engine.script = CALLS
    lines = httpx.post(server.url + "/api/chat", json={"messages": ASK, "tools": [WEATHER]}).text.splitlines()
    calls = [c for line in lines for c in json.loads(line)["message"].get("tool_calls", [])]
    assert calls[0] == {"function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
    assert json.loads(lines[-1])["done"] is True


def test_tools_for_a_template_without_them_get_400(serve_model):
    from engine.tools.demo import CHAT_TEMPLATE
    server = Server(ScriptedEngine(serve_model, CHAT_TEMPLATE), port=0)
    server.start()
    try:
        response = httpx.post(server.url + "/v1/chat/completions", json={"messages": ASK, "tools": [WEATHER]})
        assert response.status_code == 400 and response.json()["error"]["param"] == "tools"
    finally:
        server.stop()
