"""Each model family's tool-call syntax, chosen from its chat template: how a block of calls opens and
closes, how a finished block parses into (name, arguments JSON) pairs, how much of an unfinished one is
already certain (so arguments stream), and the grammar that forces a call (tool_choice required / named).

    hermes     Qwen2.5/Qwen3, Hermes:  <tool_call>{"name": "f", "arguments": {...}}</tool_call>
    qwen_xml   Qwen3-Coder:            <tool_call><function=f><parameter=k>v</parameter></function></tool_call>
    glm        GLM-4.5/4.6:            <tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>
    deepseek   DeepSeek V3 / R1 / V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f
                                       ```json {...} ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>  (V3.1: f<｜tool▁sep｜>{...})
    minimax    MiniMax-M2:             <minimax:tool_call><invoke name="f"><parameter name="k">v</parameter></invoke>
                                       </minimax:tool_call>
gpt-oss's harmony channels are a whole output format, parsed by engine/serve/harmony.py.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Callable

from engine.grammar import COMPACT

_HERMES_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\{)', re.S)


@dataclass
class ToolCall:
    name: str
    arguments: str                   # a JSON object, as text (what the OpenAI API carries)
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])


def parse_tool_call(body: str) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):        # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


@dataclass(frozen=True)
class ToolSyntax:
    name: str
    open: str
    close: str
    parse: Callable[[str], list[tuple[str, str]]]                    # a finished block's calls
    partial: Callable[[str], tuple[str, str] | None] | None = None   # an unfinished block's first call so far


def _outer_stripped(rest: str) -> str:
    """The arguments object of `{"name": …, "arguments": <rest>`: without the outer object's closing brace.
    Applied to a growing text it only grows (a prefix of what it gives for the whole text)."""
    rest = rest.rstrip()
    return (rest[:-1] if rest.endswith("}") else rest).rstrip()


def _hermes_partial(body: str):
    head = _HERMES_HEAD.match(body)
    return (json.loads(f'"{head.group(1)}"'), _outer_stripped(body[head.end():])) if head else None


def _hermes_parse(body: str) -> list[tuple[str, str]]:
    head = _HERMES_HEAD.match(body)
    if head:                                   # the arguments' own text, so that streamed deltas add up to it
        arguments = _outer_stripped(body[head.end():])
        try:
            if isinstance(json.loads(arguments), dict) and body.rstrip().endswith("}"):
                return [(json.loads(f'"{head.group(1)}"'), arguments)]
        except ValueError:
            pass
    call = parse_tool_call(body.strip())
    return [(call.name, call.arguments)] if call else []


def _value(text: str):
    """An XML-form parameter's value: JSON where it parses as a non-string (numbers, objects), else the text."""
    text = text.strip("\n")
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return text if isinstance(value, str) else value


def _pairs_call(name: str, pairs) -> tuple[str, str]:
    return name.strip(), json.dumps({k.strip(): _value(v) for k, v in pairs}, ensure_ascii=False)


def _qwen_xml_parse(body: str) -> list[tuple[str, str]]:
    return [_pairs_call(name, re.findall(r"<parameter=([^>]+)>(.*?)</parameter>", inner, re.S))
            for name, inner in re.findall(r"<function=([^>]+)>(.*?)(?:</function>|$)", body, re.S)]


def _glm_parse(body: str) -> list[tuple[str, str]]:
    name = body.split("<arg_key>", 1)[0]
    if not name.strip():
        return []
    return [_pairs_call(name, re.findall(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", body, re.S))]


def _deepseek_parse(body: str) -> list[tuple[str, str]]:
    calls = []
    for call in re.findall(r"<｜tool▁call▁begin｜>(.*?)(?:<｜tool▁call▁end｜>|$)", body, re.S):
        head, _, arguments = call.partition("<｜tool▁sep｜>")
        if head.strip() == "function":                  # V3 / R1: the name, then the arguments in a json fence
            name, _, arguments = arguments.partition("\n")
            arguments = re.sub(r"^\s*```(?:json)?|```\s*$", "", arguments.strip())
        else:
            name = head
        calls.append((name.strip(), arguments.strip()))
    return calls


def _minimax_parse(body: str) -> list[tuple[str, str]]:
    return [_pairs_call(name, re.findall(r'<parameter name="([^"]+)">(.*?)</parameter>', inner, re.S))
            for name, inner in re.findall(r'<invoke name="([^"]+)">(.*?)(?:</invoke>|$)', body, re.S)]


HERMES = ToolSyntax("hermes", "<tool_call>", "</tool_call>", _hermes_parse, _hermes_partial)
QWEN_XML = ToolSyntax("qwen_xml", "<tool_call>", "</tool_call>", _qwen_xml_parse)
GLM = ToolSyntax("glm", "<tool_call>", "</tool_call>", _glm_parse)
DEEPSEEK = ToolSyntax("deepseek", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", _deepseek_parse)
MINIMAX = ToolSyntax("minimax", "<minimax:tool_call>", "</minimax:tool_call>", _minimax_parse)
HARMONY = "harmony"


def syntax_of(chat_template: str | None):
    """The tool syntax a chat template teaches its model (HARMONY for gpt-oss), or None."""
    template = chat_template or ""
    markers = [("<|channel|>", HARMONY), ("tool▁calls▁begin", DEEPSEEK), ("<minimax:tool_call>", MINIMAX),
               ("<arg_key>", GLM), ("<function=", QWEN_XML), ("<tool_call>", HERMES)]
    return next((syntax for marker, syntax in markers if marker in template), None)


def forced_call_grammar(syntax, tools: list[dict], name: str | None) -> str | None:
    """A Lark grammar (llguidance) whose only sentences are one call of `name` (or of any tool): what
    tool_choice "required" / a named function enforce. None where the syntax has no JSON-argument form."""
    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    if syntax is HERMES:
        schema = {"x-guidance": COMPACT, "anyOf": [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                             "properties": {"name": {"const": f["name"]},
                                            "arguments": f.get("parameters") or {"type": "object"}}}
                            for f in chosen]}
        return f'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: %json {json.dumps(schema)}\n'
    if syntax is HARMONY:
        rules = [f'call{i}: "{f["name"]}" " " <|constrain|> "json" <|message|> args{i}\nargs{i}: %json '
                 f'{json.dumps({"x-guidance": COMPACT, **(f.get("parameters") or {"type": "object"})})}'
                 for i, f in enumerate(chosen)]
        alternatives = " | ".join(f"call{i}" for i in range(len(chosen)))
        return (f'start: <|channel|> "commentary to=functions." ({alternatives})\n' + "\n".join(rules) + "\n")
    return None
