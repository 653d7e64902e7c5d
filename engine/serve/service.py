"""What both APIs share: prompt -> checked token budget -> a queued generation with timings.

The routes translate their request bodies into `Service.prepare(...)` and their responses from the
`Generation` it starts; all engine access goes through the public API (encode, generate via the
queue, cancel, telemetry, info) plus the tokenizer's chat template and decode for the output parser.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

from engine.errors import SluiceError
from engine.params import GenerationParams, TokenEvent
from engine.serve.harmony import HarmonyParser
from engine.serve.parsing import OutputParser, template_features
from engine.serve.tool_syntax import DEEPSEEK, HARMONY, forced_call_grammar, syntax_of
from engine.serve.queue import END, GenerationQueue, QueueFull

DISCONNECT_POLL_S = 0.2


async def parse_body(request, model):
    """The request body as `model`, whatever Content-Type the client sent (curl -d sends a form type)."""
    from pydantic import ValidationError
    body = await request.body()
    if not body.strip():
        raise RequestError("The request body is empty; send a JSON object.")
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None


def validation_error(errors: list[dict]) -> "RequestError":
    """pydantic's first complaint as one sentence naming the field."""
    first = errors[0]
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    kind = first.get("type", "")
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return RequestError(f"The request body is not valid JSON ({detail}); send a JSON object.")
    if not loc:
        return RequestError("The request body must be a JSON object.")
    if kind == "missing":
        return RequestError(f"The field '{param}' is required.", param=param)
    return RequestError(f"Invalid '{param}': {first.get('msg', 'bad value')}.", param=param)


class RequestError(Exception):
    """A request the server refuses: one sentence, the field it is about, the HTTP status."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, headers: dict | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.headers, self.kind = message, param, status, headers or {}, kind


@dataclass
class Prepared:
    prompt: object                  # what Engine.generate takes (messages, {"messages", "tools"} or text)
    prompt_ids: list[int]
    params: GenerationParams
    parser: OutputParser


@dataclass
class Sampling:
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    response_format: dict | None = None     # OpenAI's shape: {"type": "json_schema", "json_schema": {...}}, ...
    format_param: str = "response_format"   # the field named when it cannot compile
    logprobs: int | None = None             # None: off; n: the chosen token's and the n most likely
    tool_choice: str | dict | None = None   # "auto" | "none" | "required" | {"type": "function", "name": ...}


class Generation:
    """One queued request as a route sees it: events as they come, counts and timings, cancel."""

    def __init__(self, service: "Service", prepared: Prepared):
        self.service, self.prepared = service, prepared
        self.created = int(time.time())
        self.prompt_tokens = len(prepared.prompt_ids)
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self._items: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        try:
            self.job = service.queue.submit(prepared.prompt, prepared.params, origin="http",
                                            sink=lambda item: loop.call_soon_threadsafe(self._items.put_nowait, item))
        except QueueFull as exc:
            raise RequestError(f"The server is busy ({service.queue.max_waiting} requests are waiting); "
                               f"retry in {exc.retry_after_s} s.", status=503, kind="server_busy",
                               headers={"Retry-After": str(exc.retry_after_s)}) from None

    def cancel(self) -> None:
        self.job.cancel()

    async def events(self):
        """TokenEvents until the generation ends; an engine failure is raised as RequestError."""
        while True:
            item = await self._items.get()
            if item is END:
                return
            if isinstance(item, BaseException):
                sentence = str(item) if isinstance(item, SluiceError) else \
                    f"The engine failed ({type(item).__name__}: {item}); see the server log."
                raise RequestError(sentence, status=400 if isinstance(item, SluiceError) else 500,
                                   kind="server_error")
            self._count(item)
            yield item

    async def events_until_disconnect(self, request):
        """events(), cancelling the generation if the client goes away (for non-streamed answers)."""
        async def watch():
            while not await request.is_disconnected():
                await asyncio.sleep(DISCONNECT_POLL_S)
            self.cancel()
        watcher = asyncio.ensure_future(watch())
        try:
            async for event in self.events():
                yield event
        finally:
            watcher.cancel()

    def _count(self, event: TokenEvent) -> None:
        now = time.perf_counter()
        if event.token_id is not None and event.finish_reason != "eos":
            self.completion_tokens += 1
            self.last_token_s = now
            if self.first_token_s is None:
                self.first_token_s = now
        if event.finished:
            self.finish_reason = event.finish_reason

    # timings ------------------------------------------------------------------------------------------
    @property
    def queue_s(self) -> float:
        started = self.job.started_s or time.perf_counter()
        return started - self.job.submitted_s

    @property
    def ttft_s(self) -> float:
        """From the start of this generation (after any wait in the queue) to its first token."""
        if self.first_token_s is None or self.job.started_s is None:
            return 0.0
        return self.first_token_s - self.job.started_s

    @property
    def decode_s(self) -> float:
        if self.first_token_s is None or self.last_token_s is None:
            return 0.0
        return self.last_token_s - self.first_token_s

    @property
    def decode_tok_s(self) -> float:
        return (self.completion_tokens - 1) / self.decode_s if self.decode_s > 0 else 0.0

    def timings(self) -> dict:
        """llama.cpp's `timings` object (milliseconds), plus the time spent waiting in the queue."""
        prompt_ms = self.ttft_s * 1000
        return {"prompt_n": self.prompt_tokens, "prompt_ms": prompt_ms,
                "prompt_per_second": self.prompt_tokens / self.ttft_s if self.ttft_s else 0.0,
                "predicted_n": self.completion_tokens, "predicted_ms": self.decode_s * 1000,
                "predicted_per_second": self.decode_tok_s, "queue_ms": self.queue_s * 1000}

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def served_model_id(info: dict) -> str:
    """The id clients name the loaded model by: its folder's name (engine.info's path, else its name)."""
    return Path(str(info.get("path") or info.get("name") or "model")).name


class Service:
    def __init__(self, engine, queue: GenerationQueue):
        self.engine, self.queue = engine, queue
        info = engine.info
        self.model_id = served_model_id(info)
        self.ctx = info["max_context"]
        self.tokenizer = getattr(engine, "tokenizer", None)
        template = getattr(self.tokenizer, "chat_template", None)
        self.chat_template = template if isinstance(template, str) else None
        self.defaults = _generation_defaults(info.get("path"))
        self.started = time.time()

    @property
    def supports_tools(self) -> bool:
        return template_features(self.chat_template)["tools"]

    def telemetry(self) -> dict:
        """The engine's snapshot with the server's counters (the `server` keys of DESIGN.md)."""
        return {**self.engine.telemetry(), "server": self.queue.counters()}

    async def prepare(self, prompt, sampling: Sampling, tools: list | None = None,
                      max_tokens_param: str = "max_tokens") -> Prepared:
        """The request's prompt tokens, generation parameters and output parser; a RequestError (400) naming
        the part that is wrong."""
        if tools and not self.supports_tools:
            raise RequestError("This model's chat template defines no tool calls; send the request without 'tools'.",
                               param="tools")
        if tools:
            prompt = {"messages": prompt, "tools": tools}
        prompt_ids, is_chat = await self._encode(prompt)
        room = self._room(len(prompt_ids), sampling.max_tokens, max_tokens_param)
        params = self._params(sampling, room)
        return Prepared(prompt, prompt_ids, params, self._parser(prompt_ids, is_chat, tools, sampling, params))

    async def _encode(self, prompt) -> tuple[list[int], bool]:
        """(prompt token ids, whether the chat template made them) for text, messages or token ids."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int) and self.tokenizer is not None:
            bad = [i for i in prompt if not 0 <= i < len(self.tokenizer)]
            if bad:
                raise RequestError(f"Token id {bad[0]} in 'prompt' is not in this model's vocabulary (0 to "
                                   f"{len(self.tokenizer) - 1}).", param="prompt")
        try:
            prompt_ids, is_chat = await asyncio.to_thread(self.engine.encode, prompt)
        except SluiceError as exc:
            raise RequestError(str(exc), param="messages" if not isinstance(prompt, str) else "prompt") from None
        except Exception as exc:         # e.g. a chat template that raises on this message order
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RequestError(f"The model's chat template refused these messages ({detail}).",
                               param="messages") from None
        if not prompt_ids:
            raise RequestError("The prompt is empty; send some text.", param="prompt")
        return prompt_ids, is_chat

    def _room(self, prompt_tokens: int, max_tokens: int | None, max_tokens_param: str) -> int:
        """The tokens the context leaves for the answer, refusing a request that cannot fit."""
        room = self.ctx - prompt_tokens
        if room < 1:
            raise RequestError(f"The prompt is {prompt_tokens} tokens but this model's context is {self.ctx} "
                               f"tokens; shorten the prompt.", param="messages", kind="context_length_exceeded")
        if max_tokens is not None and max_tokens > room:
            raise RequestError(f"The prompt ({prompt_tokens} tokens) plus {max_tokens_param} "
                               f"({max_tokens}) exceeds this model's {self.ctx}-token context; "
                               f"lower {max_tokens_param} to at most {room}.", param=max_tokens_param,
                               kind="context_length_exceeded")
        return room

    def _params(self, sampling: Sampling, room: int) -> GenerationParams:
        """The request's sampling over the server's defaults, checked."""
        stop = [sampling.stop] if isinstance(sampling.stop, str) else list(sampling.stop or [])
        d = self.defaults

        def chosen(name: str):
            value = getattr(sampling, name)
            return d[name] if value is None else value
        params = GenerationParams(
            max_new_tokens=sampling.max_tokens or room, temperature=chosen("temperature"), top_p=chosen("top_p"),
            top_k=chosen("top_k"),
            seed=None if sampling.seed is None or sampling.seed < 0 else sampling.seed % 2**63,   # -1: random
            stop=[s for s in stop if s], logprobs=sampling.logprobs, grammar=self._grammar(sampling))
        try:
            params.validate()
        except SluiceError as exc:
            raise RequestError(str(exc)) from None
        return params

    def _parser(self, prompt_ids: list[int], is_chat: bool, tools, sampling: Sampling, params: GenerationParams):
        """The output parser for this template and request; sets what it needs in params (special tokens in
        the text, the grammar of a forced tool call)."""
        tail = self.tokenizer.decode(prompt_ids[-4:]) if is_chat and self.tokenizer is not None else ""
        features = template_features(self.chat_template if is_chat else None, tail)
        syntax = syntax_of(self.chat_template) if is_chat else None
        uses_tools = bool(tools) and features["tools"]
        params.keep_special_tokens = syntax in (HARMONY, DEEPSEEK)    # their markers are special tokens
        if uses_tools and sampling.tool_choice not in (None, "auto", "none"):
            params.grammar = self._forced_call(syntax, tools, sampling.tool_choice)
        if syntax is HARMONY:
            return HarmonyParser(think=True, tools=uses_tools)
        return OutputParser(think=features["think"], starts_in_think=features["starts_in_think"],
                            tools=uses_tools, syntax=syntax)

    def _forced_call(self, syntax, tools: list[dict], choice) -> str:
        """tool_choice "required" or a named function, as a grammar that admits only such a call."""
        name = choice.get("name") or (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
        if choice != "required" and name is None:
            raise RequestError(f"Unknown tool_choice {choice!r}: use auto, none, required or a function's name.",
                               param="tool_choice")
        if name is not None and name not in [t["function"]["name"] for t in tools]:
            raise RequestError(f"tool_choice names '{name}', which is not among the tools.", param="tool_choice")
        grammar = forced_call_grammar(syntax, tools, name)
        if grammar is None:
            raise RequestError(f"This model's tool-call syntax ({getattr(syntax, 'name', syntax)}) cannot be forced "
                               f"yet; use tool_choice auto.", param="tool_choice")
        return self._grammar(Sampling(response_format={"type": "grammar", "grammar": grammar},
                                      format_param="tool_choice"))

    def _grammar(self, sampling: Sampling) -> str | None:
        """The response format as a grammar the engine enforces; a 400 naming the part that cannot compile."""
        from engine import grammar
        try:
            compiled = grammar.grammar_for(sampling.response_format)
            if compiled is not None:
                if self.tokenizer is None:
                    raise SluiceError("Structured output needs the model's tokenizer files; this model has none.")
                grammar.check(compiled, self.tokenizer, self.engine.info.get("vocab_size") or len(self.tokenizer),
                              getattr(self.engine, "eos_token_ids", ()))
        except SluiceError as exc:
            raise RequestError(str(exc), param=sampling.format_param) from None
        return compiled

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id]) if self.tokenizer is not None else ""

    def start(self, prepared: Prepared) -> Generation:
        """Queue the generation (RequestError 503 with Retry-After when the queue is full). Call in the loop."""
        return Generation(self, prepared)


def _generation_defaults(model_path) -> dict:
    """Sampling defaults: the model's generation_config.json where it has them, else the OpenAI API's."""
    defaults = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
    path = Path(model_path) / "generation_config.json" if model_path else None
    if path is not None and path.is_file():
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError):
            return defaults
        for key in defaults:
            if isinstance(config.get(key), (int, float)) and not isinstance(config.get(key), bool):
                defaults[key] = config[key]
        if config.get("do_sample") is False:
            defaults["temperature"] = 0.0
    return defaults
