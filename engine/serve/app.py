"""The ASGI app: both APIs on one service, behind a guard (engine.serve.guard: Host, Origin, API key, JSON bodies
of bounded size, request log).

Every refusal is a JSON error in the style of the API it was sent to: OpenAI's
`{"error": {"message", "type", "param", "code"}}` under /v1, Ollama's `{"error": "..."}` under /api.
"""
from __future__ import annotations

import logging
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from starlette.exceptions import HTTPException

import engine.serve.anthropic_api as anthropic_api
import engine.serve.ollama_api as ollama_api
import engine.serve.openai_api as openai_api
import engine.serve.responses_api as responses_api
from engine.serve.guard import Guard, HostPolicy, error_response
from engine.serve.service import RequestError, Service, validation_error

log = logging.getLogger("sluice.serve")

MAX_BODY_BYTES = 4 * 1024 * 1024


def create_app(service: Service, api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               on_request: Callable[[dict], None] | None = None, policy: HostPolicy | None = None):
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

    return Guard(app, api_key, max_body_bytes, on_request, policy or HostPolicy("127.0.0.1"))
