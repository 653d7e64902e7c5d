"""A remote OpenAI-compatible endpoint (vLLM, SGLang, LM Studio, another Sluice) used like a loaded engine.

`RemoteEngine` offers what the app's engine thread uses of an Engine (info, generate, cancel,
telemetry, close), so chats stream from it through the same worker and UI. Speed and time to first
token are measured here, on the client side. Endpoint failures become one sentence (SluiceError).
Qt-free.
"""
from __future__ import annotations

import json
import threading
import time
from urllib.parse import urlparse

import httpx

from engine import SluiceError
from engine import GenerationParams, TokenEvent

REMOTE_PREFIX = "remote:"
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 600.0                   # a long prefill on a busy server sends nothing for a while
FINISH = {"stop": "eos", "length": "length", "tool_calls": "eos", "content_filter": "stop"}


def normalise_url(url: str) -> str:
    """'localhost:8000' or 'http://h:8000/' or 'http://h:8000/v1' -> 'http://h:8000/v1'."""
    url = url.strip().rstrip("/")
    if not url:
        raise SluiceError("Enter the endpoint's address, like http://localhost:8000/v1.")
    if "://" not in url:
        url = "http://" + url
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise SluiceError(f"'{url}' is not an http(s) address; enter one like http://localhost:8000/v1.")
    return url if parsed.path.endswith("/v1") else url + "/v1"


def model_key(url: str, model: str) -> str:
    """The picker's data for a remote model (the app passes it where a model folder path goes)."""
    return f"{REMOTE_PREFIX}{model}@{url}"


def parse_model_key(key: str) -> tuple[str, str]:
    model, _, url = key[len(REMOTE_PREFIX):].rpartition("@")
    return url, model


def _headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _failure(url: str, exc: Exception) -> SluiceError:
    host = urlparse(url).netloc
    if isinstance(exc, httpx.ConnectError):
        return SluiceError(f"Cannot reach {host}: check the address and that the server is running.")
    if isinstance(exc, httpx.TimeoutException):
        return SluiceError(f"{host} did not answer in time; check that the server is running and not overloaded.")
    return SluiceError(f"The connection to {host} failed ({type(exc).__name__}); try again.")


def _http_error(url: str, response: httpx.Response) -> SluiceError:
    host = urlparse(url).netloc
    if response.status_code == 401 or response.status_code == 403:
        return SluiceError(f"{host} refused the API key ({response.status_code}); check the key for this endpoint.")
    if response.status_code == 404:
        return SluiceError(f"{host} has no OpenAI API at {urlparse(url).path} (404); check the address "
                           f"(it usually ends in /v1).")
    try:
        error = response.json().get("error")
        detail = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        detail = None
    detail = " ".join(str(detail or response.reason_phrase).split())
    return SluiceError(f"{host} answered {response.status_code}: {detail.rstrip('.')}.")


def list_models(url: str, api_key: str | None = None) -> list[str]:
    """The endpoint's model ids (GET /models); SluiceError with one sentence if it cannot be asked."""
    return [m["id"] for m in _models(url, api_key)]


def _models(url: str, api_key: str | None) -> list[dict]:
    url = normalise_url(url)
    try:
        response = httpx.get(url + "/models", headers=_headers(api_key), timeout=CONNECT_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise _failure(url, exc) from None
    if response.status_code != 200:
        raise _http_error(url, response)
    try:
        models = [m for m in response.json()["data"] if isinstance(m["id"], str)]
    except (ValueError, KeyError, TypeError):
        raise SluiceError(f"{urlparse(url).netloc} did not answer like an OpenAI API; check the address.") from None
    if not models:
        raise SluiceError(f"{urlparse(url).netloc} serves no models.")
    return models


def _choices(chunk: dict):
    """(text, finish_reason) of each choice in a streamed chunk."""
    for choice in chunk.get("choices") or []:
        yield (choice.get("delta") or {}).get("content") or "", choice.get("finish_reason")


class _StreamClock:
    """Time to the first chunk and the decode rate after it, written into the engine's stats as chunks arrive."""

    def __init__(self, stats: dict):
        self.stats, self.started, self.first, self.count = stats, time.perf_counter(), None, 0

    def tick(self) -> None:
        now = time.perf_counter()
        self.count += 1
        if self.first is None:
            self.first = now
            self.stats["ttft_s"] = now - self.started
        elif now > self.first:
            self.stats["decode_tok_s"] = (self.count - 1) / (now - self.first)
        self.stats["generated"] = self.count


class RemoteEngine:
    def __init__(self, url: str, model: str, api_key: str | None = None, max_context: int | None = None):
        self.url, self.model, self.api_key = normalise_url(url), model, api_key
        self._cancel = threading.Event()
        self._response: httpx.Response | None = None
        self._client = httpx.Client(headers=_headers(api_key),
                                    timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S))
        self._stats = {"prompt": 0, "generated": 0, "decode_tok_s": 0.0, "ttft_s": 0.0}
        self.info = {"name": model, "path": model_key(self.url, model), "family": "remote", "quant": urlparse(self.url).netloc,
                     "device": "remote", "remote_url": self.url}
        if max_context:
            self.info["max_context"] = max_context

    @classmethod
    def connect(cls, key: str, api_key: str | None = None, progress=None) -> "RemoteEngine":
        url, model = parse_model_key(key)
        if progress:
            progress(0, 1, f"Connecting to {urlparse(url).netloc}")
        models = {m["id"]: m for m in _models(url, api_key)}
        if model not in models:
            raise SluiceError(f"{urlparse(url).netloc} no longer serves '{model}'; it serves {', '.join(models)}.")
        max_context = models[model].get("max_model_len")       # vLLM, SGLang and Sluice say it
        return cls(url, model, api_key, max_context if isinstance(max_context, int) else None)

    def generate(self, prompt, params: GenerationParams | None = None, response_format: dict | None = None):
        """TokenEvents of the endpoint's streamed answer; `response_format` (OpenAI's) is sent for the endpoint
        to constrain the answer with."""
        params = params or GenerationParams()
        self._cancel.clear()
        self._stats.update(generated=0, decode_tok_s=0.0, ttft_s=0.0)
        finish = None
        try:
            with self._client.stream("POST", self.url + "/chat/completions", json=self._body(prompt, params, response_format)) as response:
                if response.status_code != 200:
                    response.read()
                    raise _http_error(self.url, response)
                self._response = response
                clock = _StreamClock(self._stats)
                for chunk in self._chunks(response):
                    for text, finish_reason in _choices(chunk):
                        finish = finish_reason or finish
                        if text:
                            clock.tick()
                            yield TokenEvent(0, text)    # one streamed chunk counts as one token
        except httpx.HTTPError as exc:
            if not self._cancel.is_set():
                raise _failure(self.url, exc) from None
        finally:
            self._response = None
        yield TokenEvent(None, "", True, "cancelled" if self._cancel.is_set() else FINISH.get(finish, "eos"))

    def _body(self, prompt, params: GenerationParams, response_format: dict | None = None) -> dict:
        body = {"model": self.model, "messages": list(prompt), "stream": True, "max_tokens": params.max_new_tokens,
                "temperature": params.temperature, "top_p": params.top_p,
                "stream_options": {"include_usage": True}}
        optional = {"seed": params.seed, "stop": params.stop or None, "top_k": params.top_k or None,
                    "response_format": response_format}
        return {**body, **{key: value for key, value in optional.items() if value is not None}}

    def _chunks(self, response: httpx.Response):
        """The server-sent events' JSON chunks until [DONE] or a cancel; an error event is one sentence."""
        for line in response.iter_lines():
            if self._cancel.is_set():
                return
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[5:])
            if "error" in chunk:
                message = chunk["error"].get("message") if isinstance(chunk["error"], dict) else chunk["error"]
                raise SluiceError(f"{urlparse(self.url).netloc} stopped: {str(message).rstrip('.')}.")
            if chunk.get("usage"):
                self._stats["prompt"] = chunk["usage"].get("prompt_tokens", 0)
            yield chunk

    def cancel(self) -> None:
        """Stop within one chunk; closing the connection tells the server to stop generating too."""
        self._cancel.set()
        response = self._response
        if response is not None:
            try:
                response.close()
            except Exception:       # closing from another thread may race the reader: it stops either way
                pass

    def telemetry(self) -> dict:
        s = self._stats
        return {"remote": {"url": self.url, "model": self.model}, "device": "remote",
                "tokens": {"prompt": s["prompt"], "generated": s["generated"]},
                "speed": {"decode_tok_s": s["decode_tok_s"], "prefill_tok_s": 0.0, "ttft_s": s["ttft_s"]}}

    def close(self) -> None:
        self.cancel()
        self._client.close()
