"""The OpenAI Responses API: POST /v1/responses (text, named streaming events, function tools, structured
output through `text.format`, logprobs of the output text, and `previous_response_id` against this server's
recent responses)."""
from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from typing import Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import Field

from engine.serve.openai_api import chat_logprobs, scored
from engine.serve.protocol import _Body
from engine.serve.service import Generation, RequestError, Sampling, Service, parse_body

MAX_REMEMBERED = 64          # responses kept for previous_response_id (their whole conversation each)
LOGPROBS = "message.output_text.logprobs"


class ResponsesRequest(_Body):
    model: Optional[str] = None
    input: Union[str, list[dict]]
    instructions: Optional[str] = None
    tools: Optional[list[dict]] = None
    tool_choice: Union[str, dict, None] = None
    stream: bool = False
    max_output_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    previous_response_id: Optional[str] = None
    text: Optional[dict] = None
    store: bool = True
    include: Optional[list[str]] = None
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)

    def logprobs(self) -> int | None:
        """Sampling.logprobs: on when `include` asks for them or top_logprobs is given (None: off)."""
        if LOGPROBS in (self.include or []) or self.top_logprobs is not None:
            return self.top_logprobs or 0
        return None


def _item_text(content) -> str:
    if isinstance(content, str) or content is None:
        return content or ""
    parts = [p for p in content if isinstance(p, dict)]
    if any(p.get("type") not in ("input_text", "output_text", "text") for p in parts):
        raise RequestError("Only text input is supported; this model cannot take images or files.", param="input")
    return "".join(p.get("text", "") for p in parts)


def _append_item(messages: list[dict], item: dict) -> None:
    kind = item.get("type", "message")
    if kind == "function_call":
        call = {"id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": json.loads(item.get("arguments") or "{}")}}
        if messages and messages[-1]["role"] == "assistant" and not messages[-1]["content"]:
            messages[-1].setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": _item_text(item.get("output"))})
    elif kind == "message":
        role = {"developer": "system"}.get(item.get("role"), item.get("role"))
        if role not in ("system", "user", "assistant"):
            raise RequestError(f"Unknown input role {item.get('role')!r}.", param="input")
        messages.append({"role": role, "content": _item_text(item.get("content"))})
    elif kind != "reasoning":                           # earlier reasoning is not shown to the model again
        raise RequestError(f"Input items of type {kind!r} are not supported.", param="input")


def _tools(body: ResponsesRequest) -> list[dict] | None:
    if not body.tools or body.tool_choice == "none":
        return None
    if any(t.get("type") != "function" for t in body.tools):
        raise RequestError("Only function tools are supported.", param="tools")
    return [{"type": "function", "function": {"name": t["name"], "description": t.get("description") or "",
                                              "parameters": t.get("parameters") or {"type": "object"}}}
            for t in body.tools]


def _format(body: ResponsesRequest) -> dict | None:
    """text.format -> the chat API's response_format."""
    fmt = (body.text or {}).get("format")
    if not fmt or fmt.get("type") != "json_schema":
        return fmt
    return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema"),
                                                   "strict": fmt.get("strict")}}


def _output(pieces, logprobs: list[dict]) -> list[dict]:
    """Parser pieces -> output items: reasoning, one message (with its text's logprobs), function calls."""
    items, text = [], "".join(p.text for p in pieces if p.kind == "content")
    if text or not any(p.kind == "tool_end" for p in pieces):
        items.append(_message_item(text, logprobs=logprobs))
    items += [_call_item(p.call) for p in pieces if p.kind == "tool_end"]
    reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
    if reasoning:                                      # last, so that the streamed items keep their indices
        items.append({"type": "reasoning", "id": "rs_" + uuid.uuid4().hex, "summary": [],
                      "content": [{"type": "reasoning_text", "text": reasoning}]})
    return items


def _message_item(text: str, status: str = "completed", logprobs: list[dict] = ()) -> dict:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": list(logprobs)}] \
        if status == "completed" else []
    return {"type": "message", "id": "msg_" + uuid.uuid4().hex, "status": status, "role": "assistant",
            "content": content}


def _call_item(call, arguments: str | None = None) -> dict:
    return {"type": "function_call", "id": "fc_" + call.id.removeprefix("call_"), "call_id": call.id,
            "name": call.name, "arguments": call.arguments if arguments is None else arguments, "status": "completed"}


class _TextLogprobs:
    """The output text's logprobs: a token's go out with the next text it releases (the parser may hold text
    back a few tokens), and are dropped when it releases reasoning or a tool call instead."""

    def __init__(self, service: Service, is_on: bool):
        self.service, self.is_on, self.pending = service, is_on, []

    def take(self, event, pieces) -> list[dict]:
        """The logprobs that go with `pieces`, the parser's output for this token."""
        if self.is_on and scored(event):
            self.pending.append(chat_logprobs(self.service, event))
        if not pieces:
            return []
        taken, self.pending = (self.pending if any(p.kind == "content" for p in pieces) else []), []
        return taken


class Responses:
    """The routes' state: recent conversations by response id (for previous_response_id)."""

    def __init__(self, service: Service):
        self.service = service
        self.remembered: OrderedDict[str, list[dict]] = OrderedDict()

    def messages(self, body: ResponsesRequest) -> list[dict]:
        messages = []
        if body.previous_response_id:
            if body.previous_response_id not in self.remembered:
                raise RequestError(f"Previous response with id '{body.previous_response_id}' not found.",
                                   param="previous_response_id", status=404)
            messages = [m for m in self.remembered[body.previous_response_id] if m["role"] != "system"]
        if body.instructions:
            messages.insert(0, {"role": "system", "content": body.instructions})
        for item in [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input:
            _append_item(messages, item)
        return messages

    def remember(self, response_id: str, messages: list[dict], output: list[dict]) -> None:
        conversation = list(messages)
        for item in output:
            _append_item(conversation, item)
        self.remembered[response_id] = conversation
        while len(self.remembered) > MAX_REMEMBERED:
            self.remembered.popitem(last=False)

    def response(self, body: ResponsesRequest, gen: Generation, response_id: str, output: list[dict],
                 status: str) -> dict:
        incomplete = gen.finish_reason == "length" and status == "completed"
        return {"id": response_id, "object": "response", "created_at": gen.created, "model": self.service.model_id,
                "status": "incomplete" if incomplete else status, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "instructions": body.instructions, "output": output, "parallel_tool_calls": False,
                "previous_response_id": body.previous_response_id, "tools": body.tools or [],
                "tool_choice": body.tool_choice or "auto", "temperature": body.temperature, "top_p": body.top_p,
                "max_output_tokens": body.max_output_tokens, "top_logprobs": body.top_logprobs, "text": body.text or {"format": {"type": "text"}},
                "metadata": {}, "store": body.store, "usage": {
                    "input_tokens": gen.prompt_tokens, "output_tokens": gen.completion_tokens,
                    "total_tokens": gen.prompt_tokens + gen.completion_tokens,
                    "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}


def router(service: Service) -> APIRouter:
    api, state = APIRouter(), Responses(service)

    @api.post("/v1/responses")
    async def responses(request: Request):
        body = await parse_body(request, ResponsesRequest)
        messages = state.messages(body)
        sampling = Sampling(max_tokens=body.max_output_tokens, temperature=body.temperature, top_p=body.top_p,
                            response_format=_format(body), format_param="text.format", tool_choice=body.tool_choice,
                            logprobs=body.logprobs())
        prepared = await service.prepare(messages, sampling, _tools(body), "max_output_tokens")
        gen = service.start(prepared)
        if body.stream:
            return StreamingResponse(_stream(state, body, gen, messages), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        pieces, logprobs, text_logprobs = [], [], _TextLogprobs(service, sampling.logprobs is not None)
        try:
            async for event in gen.events_until_disconnect(request):
                released = prepared.parser.push(event.text) + (prepared.parser.flush() if event.finished else [])
                pieces += released
                logprobs += text_logprobs.take(event, released)
        finally:
            gen.cancel()
        response_id, output = "resp_" + uuid.uuid4().hex, _output(pieces, logprobs)
        if body.store:
            state.remember(response_id, messages, output)
        return state.response(body, gen, response_id, output, "completed")

    return api


class _Events:
    """Numbered server-sent events of one streamed response."""

    def __init__(self):
        self.number = 0

    def __call__(self, kind: str, **data) -> str:
        self.number += 1
        payload = {"type": kind, "sequence_number": self.number, **data}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _stream(state: Responses, body: ResponsesRequest, gen: Generation, messages: list[dict]):
    event, parser, response_id = _Events(), gen.prepared.parser, "resp_" + uuid.uuid4().hex
    started = state.response(body, gen, response_id, [], "in_progress")
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    pieces, text_item, index = [], None, 0
    logprobs, text_logprobs = [], _TextLogprobs(state.service, gen.prepared.params.logprobs is not None)
    try:
        async for token in gen.events():
            released = parser.push(token.text) + (parser.flush() if token.finished else [])
            scores = text_logprobs.take(token, released)
            logprobs += scores
            for piece in released:
                pieces.append(piece)
                if piece.kind == "content":
                    if text_item is None:
                        text_item = _message_item("", "in_progress")
                        yield event("response.output_item.added", output_index=index, item=text_item)
                        yield event("response.content_part.added", item_id=text_item["id"], output_index=index,
                                    content_index=0, part={"type": "output_text", "text": "", "annotations": []})
                    yield event("response.output_text.delta", item_id=text_item["id"], output_index=index,
                                content_index=0, delta=piece.text, logprobs=scores)
                    scores = []
                elif piece.kind in ("tool_call", "tool_args", "tool_end"):
                    index += piece.kind == "tool_call"
                    for line in _call_events(event, piece, index - (text_item is None)):
                        yield line
        output = _output(pieces, logprobs)
        for line in _text_done(event, text_item, output, 0):
            yield line
        if body.store:
            state.remember(response_id, messages, output)
        yield event("response.completed", response={**state.response(body, gen, response_id, output, "completed"),
                                                    "created_at": started["created_at"]})
    except RequestError as exc:
        yield event("error", code=exc.kind, message=exc.message, param=exc.param)
    finally:
        gen.cancel()


def _call_events(event: _Events, piece, index: int) -> list[str]:
    """A call's piece as events: added (its head), argument deltas, done (the whole call)."""
    item, out = _call_item(piece.call), []
    if piece.kind == "tool_call":
        out.append(event("response.output_item.added", output_index=index,
                         item={**item, "arguments": "", "status": "in_progress"}))
    if piece.text:
        out.append(event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                         delta=piece.text))
    if piece.kind == "tool_end":
        out += [event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                      arguments=piece.call.arguments, name=piece.call.name),
                event("response.output_item.done", output_index=index, item=item)]
    return out


def _text_done(event: _Events, text_item: dict | None, output: list[dict], index: int) -> list[str]:
    if text_item is None:
        return []
    final = next(item for item in output if item["type"] == "message")
    done = {**final, "id": text_item["id"]}
    final["id"] = text_item["id"]
    part = done["content"][0]
    return [event("response.output_text.done", item_id=done["id"], output_index=index, content_index=0,
                  text=part["text"], logprobs=part["logprobs"]),
            event("response.content_part.done", item_id=done["id"], output_index=index, content_index=0, part=part),
            event("response.output_item.done", output_index=index, item=done)]
