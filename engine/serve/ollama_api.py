"""The Ollama API: /api/tags, /api/version, /api/ps, /api/show, /api/chat, /api/generate (NDJSON streams)."""
from __future__ import annotations

import json
from datetime import datetime, timezone

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from engine.serve.protocol import OllamaChatRequest, OllamaGenerateRequest, OllamaOptions, OllamaShowRequest
from engine.serve.service import Generation, RequestError, Sampling, Service, parse_body

API_VERSION = "0.9.0"        # the Ollama API generation this server follows (clients gate features on it)
DONE = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop", None: "stop"}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _line(obj) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


def _sampling(options: OllamaOptions | None, shape: str | dict | None = None) -> Sampling:
    """Ollama's options; `shape`: its `format` ("json" or a JSON Schema) as a response format."""
    o = options or OllamaOptions()
    max_tokens = o.num_predict if o.num_predict is not None and o.num_predict > 0 else None
    response_format = {"type": "json_object"} if shape == "json" else \
        {"type": "json_schema", "json_schema": {"schema": shape}} if isinstance(shape, dict) else None
    if shape not in (None, "", "json") and response_format is None:
        raise RequestError("'format' must be \"json\" or a JSON Schema object.", param="format")
    return Sampling(max_tokens=max_tokens, temperature=o.temperature, top_p=o.top_p, top_k=o.top_k,
                    seed=o.seed, stop=o.stop, response_format=response_format, format_param="format")


def _durations(gen: Generation) -> dict:
    ns = 1_000_000_000
    return {"total_duration": int((gen.queue_s + gen.ttft_s + gen.decode_s) * ns), "load_duration": 0,
            "prompt_eval_count": gen.prompt_tokens, "prompt_eval_duration": int(gen.ttft_s * ns),
            "eval_count": gen.completion_tokens, "eval_duration": int(gen.decode_s * ns)}


def _details(service: Service) -> dict:
    info = service.engine.info
    return {"parent_model": "", "format": "sluice", "family": info.get("family", ""),
            "families": [info.get("family", "")], "parameter_size": "", "quantization_level": info.get("quant", "")}


def _model_entry(service: Service) -> dict:
    info = service.engine.info
    return {"name": service.model_id, "model": service.model_id, "modified_at": _now(),
            "size": int(info.get("expert_bytes_total") or 0), "digest": "", "details": _details(service)}


def _show(service: Service) -> dict:
    """/api/show: the template, capabilities and the architecture's numbers, under Ollama's key names."""
    info = service.engine.info
    family = info.get("family", "")
    return {"modelfile": "", "parameters": "", "template": service.chat_template or "",
            "details": _details(service), "capabilities": ["completion"] + (["tools"] if service.supports_tools else []),
            "model_info": {"general.architecture": family, f"{family}.context_length": service.ctx,
                           f"{family}.block_count": info.get("num_layers"),
                           f"{family}.expert_count": info.get("num_experts"),
                           f"{family}.expert_used_count": info.get("top_k")}}


def _chat_messages(body: OllamaChatRequest) -> list[dict]:
    """The chat as the engine takes it: text only, tool calls' arguments as objects."""
    messages = []
    for i, m in enumerate(body.messages):
        if m.images:
            raise RequestError("Images are not supported; this model reads text only.", param=f"messages.{i}.images")
        message = {"role": m.role, "content": m.content}
        if m.tool_calls:
            message["tool_calls"] = [{"type": "function", "function": {
                "name": c.function.name, "arguments": _as_object(c.function.arguments)}} for c in m.tool_calls]
        messages.append(message)
    return messages


def _generate_prompt(service: Service, body: OllamaGenerateRequest) -> str | list[dict]:
    """A raw prompt as it is; otherwise a chat (the system text, then the prompt) for the chat template."""
    if body.raw or service.chat_template is None:
        return body.prompt
    return ([{"role": "system", "content": body.system}] if body.system else []) + \
        [{"role": "user", "content": body.prompt}]


def router(service: Service) -> APIRouter:
    api = APIRouter()
    _add_model_routes(api, service)

    @api.post("/api/chat")
    async def chat(request: Request):
        body = await parse_body(request, OllamaChatRequest)
        messages = _chat_messages(body)
        if not messages:                     # Ollama loads the model on an empty chat
            return {"model": service.model_id, "created_at": _now(), "message": {"role": "assistant", "content": ""},
                    "done": True, "done_reason": "load"}
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
        prepared = await service.prepare(messages, _sampling(body.options, body.format), tools, "options.num_predict")
        gen = service.start(prepared)
        if body.stream:
            return StreamingResponse(_stream(gen, service.model_id, chat=True), media_type="application/x-ndjson")
        return await _complete(gen, service.model_id, request, chat=True)

    @api.post("/api/generate")
    async def generate(request: Request):
        body = await parse_body(request, OllamaGenerateRequest)
        if body.images:
            raise RequestError("Images are not supported; this model reads text only.", param="images")
        if not body.prompt:                  # Ollama loads the model on an empty prompt
            return {"model": service.model_id, "created_at": _now(), "response": "", "done": True,
                    "done_reason": "load"}
        prepared = await service.prepare(_generate_prompt(service, body), _sampling(body.options, body.format), None,
                                         "options.num_predict")
        prepared.parser.tools = False
        gen = service.start(prepared)
        if body.stream:
            return StreamingResponse(_stream(gen, service.model_id, chat=False), media_type="application/x-ndjson")
        return await _complete(gen, service.model_id, request, chat=False)

    return api


def _add_model_routes(api: APIRouter, service: Service) -> None:
    """What Ollama clients ask about the model: version, tags, ps, show."""
    @api.get("/api/version")
    async def version():
        return {"version": API_VERSION}

    @api.get("/api/tags")
    async def tags():
        return {"models": [_model_entry(service)]}

    @api.get("/api/ps")
    async def ps():
        return {"models": [{**_model_entry(service), "expires_at": "2999-01-01T00:00:00Z",
                            "size_vram": int(service.engine.info.get("vram_budget_bytes") or 0),
                            "context_length": service.ctx}]}

    @api.post("/api/show")
    async def show(request: Request):
        await parse_body(request, OllamaShowRequest)
        return _show(service)


def _as_object(arguments) -> dict:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments)
    except ValueError:
        raise RequestError("Tool-call arguments must be a JSON object.", param="messages.tool_calls") from None
    return value if isinstance(value, dict) else {}


def _message(pieces) -> dict:
    message = {"role": "assistant", "content": "".join(p.text for p in pieces if p.kind == "content")}
    thinking = "".join(p.text for p in pieces if p.kind == "reasoning")
    if thinking:
        message["thinking"] = thinking
    calls = [p.call for p in pieces if p.kind == "tool_end"]
    if calls:
        message["tool_calls"] = [{"function": {"name": c.name, "arguments": json.loads(c.arguments)}} for c in calls]
    return message


def _final(gen: Generation, model: str, chat: bool, message: dict | None, text: str, token_ids: list[int]) -> dict:
    out = {"model": model, "created_at": _now()}
    if chat:
        out["message"] = message
    else:
        out["response"] = text
    out.update(done=True, done_reason=DONE[gen.finish_reason], **_durations(gen))
    if not chat:
        out["context"] = gen.prepared.prompt_ids + token_ids
    return out


async def _stream(gen: Generation, model: str, chat: bool):
    parser = gen.prepared.parser
    token_ids: list[int] = []
    try:
        async for event in gen.events():
            if event.token_id is not None and event.finish_reason != "eos":
                token_ids.append(event.token_id)
            if not chat:
                if event.text:
                    yield _line({"model": model, "created_at": _now(), "response": event.text, "done": False})
                continue
            pieces = parser.push(event.text) + (parser.flush() if event.finished else [])
            for piece in (p for p in pieces if p.kind not in ("tool_call", "tool_args")):   # whole calls only
                yield _line({"model": model, "created_at": _now(), "message": _message([piece]), "done": False})
        empty = {"role": "assistant", "content": ""}
        yield _line(_final(gen, model, chat, empty, "", token_ids))
    except RequestError as exc:
        yield _line({"error": exc.message})
    finally:
        gen.cancel()


async def _complete(gen: Generation, model: str, request: Request, chat: bool) -> dict:
    parser = gen.prepared.parser
    pieces, text, token_ids = [], [], []
    try:
        async for event in gen.events_until_disconnect(request):
            if event.token_id is not None and event.finish_reason != "eos":
                token_ids.append(event.token_id)
            text.append(event.text)
            if chat:
                pieces += parser.push(event.text)
        pieces += parser.flush() if chat else []
    finally:
        gen.cancel()
    return _final(gen, model, chat, _message(pieces) if chat else None, "".join(text), token_ids)
