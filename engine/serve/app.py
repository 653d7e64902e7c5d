"""The ASGI app: both APIs on one service, behind a guard (body size, API key, request log).

Every refusal is a JSON error in the style of the API it was sent to: OpenAI's
`{"error": {"message", "type", "param", "code"}}` under /v1, Ollama's `{"error": "..."}` under /api.
"""
from __future__ import annotations

import hmac
import logging
import time
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException

from engine.serve import anthropic_api, ollama_api, openai_api, responses_api
from engine.serve.service import RequestError, Service, validation_error

log = logging.getLogger("sluice.serve")

MAX_BODY_BYTES = 4 * 1024 * 1024
OPEN_PATHS = {"/", "/health"}             # answered without the API key (liveness checks)


def create_app(service: Service, api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               on_request: Callable[[dict], None] | None = None):
    app = FastAPI(title="Sluice", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(openai_api.router(service))
    app.include_router(ollama_api.router(service))
    app.include_router(anthropic_api.router(service))
    app.include_router(responses_api.router(service))

    @app.api_route("/", methods=["GET", "HEAD"])          # Ollama's liveness check uses HEAD
    async def root():
        return PlainTextResponse("Sluice is running")

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": service.model_id}

    @app.get("/metrics")
    async def metrics():
        return service.telemetry()

    @app.exception_handler(RequestError)
    async def on_request_error(request: Request, exc: RequestError):
        return error_response(request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError):
        return error_response(request.url.path, validation_error(exc.errors()))

    @app.exception_handler(HTTPException)
    async def on_http(request: Request, exc: HTTPException):
        sentence = {404: f"There is no {request.url.path} here; the APIs are under /v1 (OpenAI) and /api (Ollama).",
                    405: f"{request.method} is not allowed on {request.url.path}."}.get(exc.status_code, str(exc.detail))
        return error_response(request.url.path, RequestError(sentence, status=exc.status_code))

    @app.exception_handler(Exception)
    async def on_crash(request: Request, exc: Exception):
        log.exception("request %s failed", request.url.path)
        return error_response(request.url.path, RequestError(
            f"The server failed ({type(exc).__name__}); see its log.", status=500, kind="server_error"))

    return Guard(app, api_key, max_body_bytes, on_request)


def error_response(path: str, exc: RequestError) -> JSONResponse:
    body = {"error": exc.message} if path.startswith("/api/") else \
        anthropic_api.error_object(exc) if path.startswith("/v1/messages") else openai_api.error_object(exc)
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


class Guard:
    """ASGI middleware: 413 for bodies over the limit, 401 without the API key, and one log record per request."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int, on_request: Callable[[dict], None] | None):
        self.app, self.api_key, self.max_body_bytes, self.on_request = app, api_key, max_body_bytes, on_request

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, started = scope["path"], time.perf_counter()
        record = {"method": scope["method"], "path": path, "status": 0, "client": (scope.get("client") or ("", 0))[0]}

        async def send_logged(message):
            if message["type"] == "http.response.start":
                record["status"] = message["status"]
            await send(message)
        try:
            refusal = self._refusal(scope)
            if refusal is None:
                receive, refusal = await self._buffered(scope, receive)
            if refusal is not None:
                await error_response(path, refusal)(scope, receive, send_logged)
            else:
                await self.app(scope, receive, send_logged)
        finally:
            record["duration_s"] = time.perf_counter() - started
            if self.on_request is not None:
                try:
                    self.on_request(record)
                except Exception:
                    log.exception("request log hook failed")

    def _refusal(self, scope) -> RequestError | None:
        if self.api_key and scope["path"] not in OPEN_PATHS:
            headers = dict(scope["headers"])
            given = headers.get(b"authorization", b"").decode("latin-1")
            if b"x-api-key" in headers:                   # Anthropic's clients send the key this way
                given = "Bearer " + headers[b"x-api-key"].decode("latin-1")
            expected = f"Bearer {self.api_key}"
            if not hmac.compare_digest(given.encode(), expected.encode()):
                return RequestError("The API key is missing or wrong; send the header 'Authorization: Bearer <key>' "
                                    "(or 'x-api-key: <key>').",
                                    status=401, kind="authentication_error")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return self._too_large()
        return None

    def _too_large(self) -> RequestError:
        return RequestError(f"The request body is larger than {self.max_body_bytes // (1024 * 1024)} MiB; "
                            f"send a shorter prompt.", status=413)

    async def _buffered(self, scope, receive):
        """Read the whole body first (counted, so chunked bodies are bounded too), then replay it."""
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return receive, None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return receive, None             # the client left; the app will see the disconnect
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                return receive, self._too_large()
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()
        return replay, None
