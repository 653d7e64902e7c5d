"""The OpenAI API: /v1/models, /v1/chat/completions, /v1/completions (streamed as server-sent events)."""
from __future__ import annotations

import json
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from engine.serve.parsing import Piece
from engine.serve.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest
from engine.serve.service import Generation, RequestError, Sampling, Service, parse_body

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop", None: "stop"}
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
MIN_LOGPROB = -9999.0


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def error_object(exc: RequestError) -> dict:
    return {"error": {"message": exc.message, "type": exc.kind, "param": exc.param, "code": None}}


def engine_messages(messages: list[ChatMessage]) -> list[dict]:
    """OpenAI messages -> what chat templates expect (text content, tool-call arguments as objects)."""
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            if any(part.type != "text" for part in content):
                raise RequestError("Only text content is supported; this model cannot take images or audio.",
                                   param=f"messages.{i}.content")
            content = "".join(part.text or "" for part in content)
        message = {"role": "system" if m.role == "developer" else m.role, "content": content or ""}
        if m.tool_calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.function.name,
                                                   "arguments": _arguments_object(c.function.arguments, i)}}
                                     for c in m.tool_calls]
        if m.tool_call_id:
            message["tool_call_id"] = m.tool_call_id
        if m.name:
            message["name"] = m.name
        out.append(message)
    return out


def _arguments_object(arguments, index: int) -> dict:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        raise RequestError("Tool-call arguments must be a JSON object.",
                           param=f"messages.{index}.tool_calls") from None
    if not isinstance(value, dict):
        raise RequestError("Tool-call arguments must be a JSON object.", param=f"messages.{index}.tool_calls")
    return value


def _sampling(body, max_tokens: int | None, logprobs: int | None = None) -> Sampling:
    if body.n not in (None, 1):
        raise RequestError("Only n=1 is supported: Sluice generates one answer per request.", param="n")
    return Sampling(max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                    seed=body.seed, stop=body.stop, response_format=body.response_format, logprobs=logprobs,
                    tool_choice=getattr(body, "tool_choice", None))


def _logprob(value: float) -> float:
    return max(value, MIN_LOGPROB)            # JSON has no -infinity (a token the grammar ruled out)


def chat_logprobs(service: Service, event) -> dict:
    """One token's entry of a chat answer's `logprobs.content`."""
    def entry(token_id: int, value: float) -> dict:
        text = service.token_text(token_id)
        return {"token": text, "logprob": _logprob(value), "bytes": list(text.encode())}
    return {**entry(event.token_id, event.logprob),
            "top_logprobs": [entry(i, v) for i, v in event.top_logprobs or []]}


def completion_logprobs(service: Service, events: list, offset: int = 0) -> dict:
    """The legacy completions `logprobs` object for these tokens; text offsets count from `offset`."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for event in events:
        text = service.token_text(event.token_id)
        out["tokens"].append(text)
        out["token_logprobs"].append(_logprob(event.logprob))
        out["top_logprobs"].append({service.token_text(i): _logprob(v) for i, v in event.top_logprobs or []})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def scored(event) -> bool:
    """A token of the answer that carries log-probabilities (the end-of-sequence token is not part of it)."""
    return event.logprob is not None and event.token_id is not None and event.finish_reason != "eos"


def _tool_call_json(call) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def router(service: Service) -> APIRouter:
    api = APIRouter()

    @api.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": service.model_id, "object": "model",
                                            "created": int(service.started), "owned_by": "sluice",
                                            "max_model_len": service.ctx}]}

    @api.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await parse_body(request, ChatCompletionRequest)
        max_param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        sampling = _sampling(body, body.max_completion_tokens or body.max_tokens,
                             (body.top_logprobs or 0) if body.logprobs else None)
        tools = None
        if body.tools and body.tool_choice != "none":
            tools = [t.model_dump(exclude_none=True) for t in body.tools]
        prepared = await service.prepare(engine_messages(body.messages), sampling, tools, max_param)
        return await _respond(service, prepared, body, request, _stream_chat, _complete_chat)

    @api.post("/v1/completions")
    async def completions(request: Request):
        body = await parse_body(request, CompletionRequest)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise RequestError("Only one prompt per request is supported.", param="prompt")
            prompt = prompt[0]
        prepared = await service.prepare(prompt, _sampling(body, body.max_tokens, body.logprobs))
        prepared.parser.think = False            # plain completion: the text is returned as it is
        return await _respond(service, prepared, body, request, _stream_completion, _complete_text)

    return api


async def _respond(service: Service, prepared, body, request: Request, stream, complete):
    """Starts the generation; answers with `stream` (server-sent events) or, once it is done, `complete`."""
    gen = service.start(prepared)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(stream(service, gen, include_usage),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    return await complete(service, gen, request)


def _usage_chunk(cid: str, kind: str, gen: Generation, model: str) -> str:
    """The last event when the client asked for usage: no choices, the token counts and timings."""
    return sse({"id": cid, "object": kind, "created": gen.created, "model": model,
                "choices": [], "usage": gen.usage(), "timings": gen.timings()})


# chat ------------------------------------------------------------------------------------------------
def _delta(piece: Piece, call_index: int) -> list[dict]:
    """A piece as chat deltas; `call_index`: the index of the call a tool piece belongs to."""
    if piece.kind == "reasoning":
        return [{"reasoning_content": piece.text}]
    if piece.kind == "content":
        return [{"content": piece.text}]
    arguments = [{"tool_calls": [{"index": call_index, "function": {"arguments": piece.text}}]}] if piece.text else []
    if piece.kind == "tool_call":    # the spec's order: index, id and name first, then the arguments
        call = piece.call
        return [{"tool_calls": [{"index": call_index, "id": call.id, "type": "function",
                                 "function": {"name": call.name, "arguments": ""}}]}] + arguments
    return arguments                 # tool_args; nothing for tool_end


async def _stream_chat(service: Service, gen: Generation, include_usage: bool):
    cid, model = "chatcmpl-" + uuid.uuid4().hex, service.model_id
    parser = gen.prepared.parser
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict, finish: str | None = None, logprobs=None, **more) -> str:
        return sse({"id": cid, "object": "chat.completion.chunk", "created": gen.created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
                    **more, **extra})
    try:
        yield chunk({"role": "assistant", "content": ""})
        calls = 0
        async for event in gen.events():
            logprobs = {"content": [chat_logprobs(service, event)]} if scored(event) else None
            deltas = []
            for piece in parser.push(event.text) + (parser.flush() if event.finished else []):
                calls += piece.kind == "tool_call"
                deltas += _delta(piece, calls - 1)
            if logprobs and not deltas:
                deltas = [{"content": ""}]           # the token's scores travel even when its text is held back
            for delta in deltas:
                yield chunk(delta, logprobs=logprobs)
                logprobs = None
        finish = "tool_calls" if parser.calls else FINISH[gen.finish_reason]
        yield chunk({}, finish, timings=gen.timings())
        if include_usage:
            yield _usage_chunk(cid, "chat.completion.chunk", gen, model)
    except RequestError as exc:
        yield sse(error_object(exc))
    finally:
        gen.cancel()                 # nothing if it ended; stops the engine if the client went away
    yield "data: [DONE]\n\n"


async def _complete_chat(service: Service, gen: Generation, request: Request) -> dict:
    parser, model = gen.prepared.parser, service.model_id
    pieces, scores = [], []
    try:
        async for event in gen.events_until_disconnect(request):
            pieces += parser.push(event.text)
            if scored(event):
                scores.append(chat_logprobs(service, event))
        pieces += parser.flush()
    finally:
        gen.cancel()
    content = "".join(p.text for p in pieces if p.kind == "content")
    reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
    message = {"role": "assistant", "content": content if content or not parser.calls else None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if parser.calls:
        message["tool_calls"] = [_tool_call_json(c) for c in parser.calls]
    return {"id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion", "created": gen.created,
            "model": model, "choices": [{"index": 0, "message": message,
                                         "logprobs": {"content": scores} if gen.prepared.params.logprobs is not None else None,
                                         "finish_reason": "tool_calls" if parser.calls else FINISH[gen.finish_reason]}],
            "usage": gen.usage(), "timings": gen.timings()}


# completions ----------------------------------------------------------------------------------------
async def _stream_completion(service: Service, gen: Generation, include_usage: bool):
    cid, model, offset = "cmpl-" + uuid.uuid4().hex, service.model_id, 0
    extra = {"usage": None} if include_usage else {}

    def chunk(text: str, finish: str | None = None, logprobs=None, **more) -> str:
        return sse({"id": cid, "object": "text_completion", "created": gen.created, "model": model,
                    "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
                    **extra, **more})
    try:
        async for event in gen.events():
            if scored(event):
                logprobs = completion_logprobs(service, [event], offset)
                offset += len(logprobs["tokens"][0])
                yield chunk(event.text, logprobs=logprobs)
            elif event.text:
                yield chunk(event.text)
        yield chunk("", FINISH[gen.finish_reason], timings=gen.timings())
        if include_usage:
            yield _usage_chunk(cid, "text_completion", gen, model)
    except RequestError as exc:
        yield sse(error_object(exc))
    finally:
        gen.cancel()
    yield "data: [DONE]\n\n"


async def _complete_text(service: Service, gen: Generation, request: Request) -> dict:
    text, events = [], []
    try:
        async for event in gen.events_until_disconnect(request):
            text.append(event.text)
            events += [event] if scored(event) else []
    finally:
        gen.cancel()
    logprobs = completion_logprobs(service, events) if gen.prepared.params.logprobs is not None else None
    return {"id": "cmpl-" + uuid.uuid4().hex, "object": "text_completion", "created": gen.created,
            "model": service.model_id, "choices": [{"index": 0, "text": "".join(text), "logprobs": logprobs,
                         "finish_reason": FINISH[gen.finish_reason]}],
            "usage": gen.usage(), "timings": gen.timings()}
