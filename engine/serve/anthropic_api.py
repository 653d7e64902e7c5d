"""The Anthropic Messages API: POST /v1/messages (streamed as Anthropic's named events) and /v1/messages/count_tokens.

System text, content blocks, `tool_use` / `tool_result` and token counts map onto the same chat template,
queue and output parser as the OpenAI routes; the key may come as `x-api-key` (the guard in app.py).
The Messages API defines no logprobs, so none are offered here.
"""
from __future__ import annotations

import json
import uuid
from typing import Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import Field

from engine.serve.protocol import _Body
from engine.serve.service import Generation, RequestError, Sampling, Service, parse_body

STOP = {"eos": "end_turn", "stop": "stop_sequence", "length": "max_tokens", "cancelled": "end_turn", None: "end_turn"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               413: "request_too_large", 503: "overloaded_error", 500: "api_error"}


class Block(_Body):
    type: str
    text: Optional[str] = None
    id: Optional[str] = None
    name: Optional[str] = None
    input: Optional[dict] = None
    tool_use_id: Optional[str] = None
    content: Union[str, list[dict], None] = None


class Message(_Body):
    role: str = Field(pattern="^(user|assistant)$")
    content: Union[str, list[Block]]


class Tool(_Body):
    name: str
    description: Optional[str] = None
    input_schema: dict = Field(default_factory=lambda: {"type": "object"})


class CountRequest(_Body):
    model: Optional[str] = None
    system: Union[str, list[Block], None] = None
    messages: list[Message] = Field(min_length=1)
    tools: Optional[list[Tool]] = None
    tool_choice: Optional[dict] = None


class MessagesRequest(CountRequest):
    max_tokens: int = Field(ge=1)
    temperature: Optional[float] = Field(None, ge=0, le=1)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    top_k: Optional[int] = Field(None, ge=0)
    stop_sequences: Optional[list[str]] = None
    stream: bool = False


def error_object(exc: RequestError) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(exc.status, "invalid_request_error"),
                                       "message": exc.message}}


def _text(content) -> str:
    if isinstance(content, str) or content is None:
        return content or ""
    return "".join(part.get("text", "") if isinstance(part, dict) else (part.text or "") for part in content)


def _tool_results(blocks: list[Block]) -> list[dict]:
    return [{"role": "tool", "tool_call_id": b.tool_use_id, "content": _text(b.content)}
            for b in blocks if b.type == "tool_result"]


def engine_messages(body: CountRequest) -> list[dict]:
    """Anthropic's system + messages -> the chat template's messages (tool results become tool messages)."""
    out = [{"role": "system", "content": _text(body.system)}] if body.system else []
    for i, m in enumerate(body.messages):
        blocks = [Block(type="text", text=m.content)] if isinstance(m.content, str) else m.content
        unknown = [b.type for b in blocks if b.type not in ("text", "tool_use", "tool_result", "thinking")]
        if unknown:
            raise RequestError(f"Content blocks of type '{unknown[0]}' are not supported; this model reads text only.",
                               param=f"messages.{i}.content")
        out += _tool_results(blocks) + _turn(m.role, blocks)
    return out


def _turn(role: str, blocks: list[Block]) -> list[dict]:
    """A message's text and tool uses as one chat message (none for a message of tool results only)."""
    text = "".join(b.text or "" for b in blocks if b.type == "text")
    calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input or {}}}
             for b in blocks if b.type == "tool_use"]
    if not (text or calls) and any(b.type == "tool_result" for b in blocks):
        return []
    return [{"role": role, "content": text, **({"tool_calls": calls} if calls else {})}]


def _tools(body: CountRequest) -> list[dict] | None:
    if not body.tools or (body.tool_choice or {}).get("type") == "none":
        return None
    return [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": t.input_schema}} for t in body.tools]


def router(service: Service) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        body = await parse_body(request, CountRequest)
        prepared = await service.prepare(engine_messages(body), Sampling(max_tokens=1), _tools(body))
        return {"input_tokens": len(prepared.prompt_ids)}

    @api.post("/v1/messages")
    async def messages(request: Request):
        body = await parse_body(request, MessagesRequest)
        choice = body.tool_choice or {}
        forced = "required" if choice.get("type") == "any" else choice if choice.get("type") == "tool" else None
        sampling = Sampling(max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p,
                            top_k=body.top_k, stop=body.stop_sequences, tool_choice=forced)
        prepared = await service.prepare(engine_messages(body), sampling, _tools(body))
        gen = service.start(prepared)
        if body.stream:
            return StreamingResponse(_stream(service, gen), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await _complete(service, gen, request)

    return api


def _block(piece) -> dict:
    if piece.kind == "reasoning":
        return {"type": "thinking", "thinking": piece.text, "signature": ""}
    if piece.kind == "content":
        return {"type": "text", "text": piece.text}
    return {"type": "tool_use", "id": _tool_use_id(piece.call), "name": piece.call.name,
            "input": json.loads(piece.call.arguments)}


def _tool_use_id(call) -> str:
    return "toolu_" + call.id.removeprefix("call_")


def _message(service: Service, gen: Generation, content: list[dict]) -> dict:
    uses_tool = any(b["type"] == "tool_use" for b in content)
    return {"id": "msg_" + uuid.uuid4().hex, "type": "message", "role": "assistant", "model": service.model_id,
            "content": content, "stop_reason": "tool_use" if uses_tool else STOP[gen.finish_reason],
            "stop_sequence": None, "usage": {"input_tokens": gen.prompt_tokens, "output_tokens": gen.completion_tokens}}


async def _complete(service: Service, gen: Generation, request: Request) -> dict:
    parser, content = gen.prepared.parser, []
    try:
        pieces = []
        async for event in gen.events_until_disconnect(request):
            pieces += parser.push(event.text)
        pieces += parser.flush()
    finally:
        gen.cancel()
    for piece in (p for p in pieces if p.kind not in ("tool_call", "tool_args")):   # a call once complete
        block = _block(piece)
        if content and block["type"] in ("text", "thinking") and content[-1]["type"] == block["type"]:
            key = block["type"] if block["type"] == "thinking" else "text"
            content[-1][key] += block[key]
        else:
            content.append(block)
    return _message(service, gen, content)


def _event(kind: str, **data) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


class _Blocks:
    """The open content block of a stream: a piece of another kind closes it and opens the next."""

    def __init__(self):
        self.index, self.kind = -1, None

    def events(self, piece) -> list[str]:
        if piece.kind == "tool_end":
            return self.close()
        kind = {"reasoning": "thinking", "content": "text"}.get(piece.kind, "tool_use")
        out = []
        if piece.kind == "tool_call" or kind != self.kind:
            out += self.close()
            self.index, self.kind = self.index + 1, kind
            start = {"thinking": {"type": "thinking", "thinking": "", "signature": ""},
                     "text": {"type": "text", "text": ""}}.get(kind) or \
                {"type": "tool_use", "id": _tool_use_id(piece.call), "name": piece.call.name, "input": {}}
            out.append(_event("content_block_start", index=self.index, content_block=start))
        if piece.text:
            delta = {"tool_use": {"type": "input_json_delta", "partial_json": piece.text},
                     "thinking": {"type": "thinking_delta", "thinking": piece.text},
                     "text": {"type": "text_delta", "text": piece.text}}[kind]
            out.append(_event("content_block_delta", index=self.index, delta=delta))
        return out

    def close(self) -> list[str]:
        if self.kind is None:
            return []
        self.kind = None
        return [_event("content_block_stop", index=self.index)]


async def _stream(service: Service, gen: Generation):
    parser, blocks = gen.prepared.parser, _Blocks()
    head = {**_message(service, gen, []), "stop_reason": None}
    head["usage"]["output_tokens"] = 0
    yield _event("message_start", message=head)
    try:
        async for event in gen.events():
            for piece in parser.push(event.text) + (parser.flush() if event.finished else []):
                for line in blocks.events(piece):
                    yield line
        for line in blocks.close():
            yield line
        stop = "tool_use" if parser.calls else STOP[gen.finish_reason]
        yield _event("message_delta", delta={"stop_reason": stop, "stop_sequence": None},
                     usage={"input_tokens": gen.prompt_tokens, "output_tokens": gen.completion_tokens})
        yield _event("message_stop")
    except RequestError as exc:
        yield f"event: error\ndata: {json.dumps(error_object(exc))}\n\n"
    finally:
        gen.cancel()
