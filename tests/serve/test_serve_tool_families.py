"""Each family's tool-call syntax parsed at every split point, gpt-oss (harmony) through the official client,
and tool_choice required / named enforced by the grammar on the random-weight model."""
import json

import openai
import pytest

import engine
from engine.serve import Server
from engine.serve.harmony import HarmonyParser
from engine.serve.parsing import OutputParser
from engine.serve.tool_syntax import DEEPSEEK, GLM, HARMONY, HERMES, MINIMAX, QWEN_XML, syntax_of
from tests.serve.test_serve_tools import TOOLS_TEMPLATE, WEATHER, ScriptedEngine

WANT = [("get_weather", {"city": "Paris", "days": 2})]
ANSWERS = {
    HERMES: 'Look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>',
    QWEN_XML: "Look.<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
              "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
    GLM: "Look.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
         "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
    DEEPSEEK: "Look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
              '{"city": "Paris", "days": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    MINIMAX: 'Look.<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
             '<parameter name="days">2</parameter>\n</invoke>\n</minimax:tool_call>',
}
HARMONY_ANSWER = ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
                  'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "days": 2}')
HARMONY_TEMPLATE = (
    "{%- for m in messages %}<|start|>{{ m.role }}"
    "{%- if m.role == 'assistant' and m.tool_calls %} to=functions.{{ m.tool_calls[0].function.name }}"
    "<|channel|>commentary json<|message|>{{ m.tool_calls[0].function.arguments | tojson }}<|call|>"
    "{%- elif m.role == 'tool' %}<|message|>{{ m.content }}<|end|>"
    "{%- else %}<|message|>{{ m.content }}<|end|>{%- endif %}{%- endfor %}"
    "{%- if tools %}<|start|>developer<|message|>{{ tools | tojson }}<|end|>{%- endif %}"
    "{%- if add_generation_prompt %}<|start|>assistant{%- endif %}")


def run(parser, text: str, cut: int):
    pieces = parser.push(text[:cut]) + parser.push(text[cut:]) + parser.flush()
    streamed = {}
    for p in pieces:
        if p.call is not None:
            streamed[p.call.id] = streamed.get(p.call.id, "") + p.text
    calls = [(c.name, json.loads(c.arguments)) for c in parser.calls]
    assert all(streamed[c.id] == c.arguments for c in parser.calls)    # the deltas add up to the arguments
    return "".join(p.text for p in pieces if p.kind == "content"), calls


@pytest.mark.parametrize("syntax", list(ANSWERS), ids=lambda s: s.name)
def test_each_family_syntax_parses_split_anywhere(syntax):
    text = ANSWERS[syntax]
    for cut in range(len(text) + 1):
        assert run(OutputParser(tools=True, syntax=syntax), text, cut) == ("Look.", WANT)


def test_harmony_parses_split_anywhere():
    for cut in range(len(HARMONY_ANSWER) + 1):
        parser = HarmonyParser(tools=True)
        pieces = parser.push(HARMONY_ANSWER[:cut]) + parser.push(HARMONY_ANSWER[cut:]) + parser.flush()
        assert "".join(p.text for p in pieces if p.kind == "reasoning") == "Need weather."
        assert [(c.name, json.loads(c.arguments)) for c in parser.calls] == WANT


def test_the_syntax_is_chosen_from_the_template():
    assert syntax_of(TOOLS_TEMPLATE) is HERMES and syntax_of(HARMONY_TEMPLATE) is HARMONY
    assert syntax_of("{{ '<｜tool▁calls▁begin｜>' }}") is DEEPSEEK and syntax_of("plain") is None


def test_a_gpt_oss_tool_call_round_trips(serve_model):
    eng = ScriptedEngine(serve_model, HARMONY_TEMPLATE)
    server = Server(eng, port=0)
    server.start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=30)
        ask = [{"role": "user", "content": "Weather in Paris?"}]
        eng.script = HARMONY_ANSWER
        answer = client.chat.completions.create(model="m", messages=ask, tools=[WEATHER])
        call = answer.choices[0].message.tool_calls[0]
        assert answer.choices[0].finish_reason == "tool_calls"
        assert (call.function.name, json.loads(call.function.arguments)) == WANT[0]
        assert answer.choices[0].message.model_extra["reasoning_content"] == "Need weather."
        chunks = list(client.chat.completions.create(model="m", messages=ask, tools=[WEATHER], stream=True))
        deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
        assert len(deltas) > 2 and json.loads("".join(d.function.arguments or "" for d in deltas)) == WANT[0][1]
        eng.script = "<|channel|>final<|message|>It is 18 degrees."
        follow = ask + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                        {"role": "tool", "tool_call_id": call.id, "content": "18 C"}]
        final = client.chat.completions.create(model="m", messages=follow, tools=[WEATHER])
        assert final.choices[0].message.content == "It is 18 degrees."
        assert 'to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris", "days": 2}' \
            in eng.prompts[-1] and "<|start|>tool<|message|>18 C" in eng.prompts[-1]
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tool_server(serve_model):
    eng = engine.load(serve_model)
    eng.tokenizer.chat_template = TOOLS_TEMPLATE          # the real model, taught the Hermes tool syntax
    server = Server(eng, port=0)
    server.start()
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    server.stop()
    eng.close()


TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"enum": ["CET", "UTC"]}}, "required": ["tz"], "additionalProperties": False}}}
BOUNDED_WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["days"],
    "additionalProperties": False}}}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_tool_choice_required_and_named_are_enforced(tool_server, choice):
    for seed in range(5):
        answer = tool_server.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], tools=[BOUNDED_WEATHER, TIME],
            tool_choice=choice, temperature=0.9, seed=seed, max_tokens=60)
        calls = answer.choices[0].message.tool_calls
        assert answer.choices[0].finish_reason == "tool_calls" and len(calls) == 1
        arguments = json.loads(calls[0].function.arguments)
        if choice != "required":
            assert calls[0].function.name == "get_time"
        assert arguments in ({"tz": "CET"}, {"tz": "UTC"}) or 1 <= arguments.get("days", 0) <= 9
