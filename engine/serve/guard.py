"""ASGI middleware in front of both APIs: who may ask (Host, Origin, API key), how (JSON bodies only, at most
`max_body_bytes`, arriving in time), and one log record per request.

A browser page must not reach a local server: a DNS-rebinding page sends a foreign `Host`, and any page can
send a cross-site "simple" POST (text/plain or a form, no CORS preflight) carrying an `Origin`. So the server
answers only the Host names it is known by and, from browsers, only the origins it was told to allow.
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import time
from typing import Callable, Iterable

from starlette.responses import JSONResponse

import engine.serve.anthropic_api as anthropic_api
import engine.serve.openai_api as openai_api
from engine.serve.service import RequestError

log = logging.getLogger("sluice.serve")

OPEN_PATHS = {"/", "/health"}             # answered without the API key (liveness checks)
BODY_IDLE_TIMEOUT_S = 30.0                # a body whose next bytes take longer is dropped (a slow-body attack)
BODY_METHODS = ("POST", "PUT", "PATCH")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def host_name(value: str) -> str:
    """'Example.com:8000' -> 'example.com'; '[::1]:80' -> '::1'."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def is_json_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class HostPolicy:
    """The Host names and browser origins a server answers.

    Always: the loopback names and the address it listens on; when it listens on every interface, any IP
    address too (a rebinding page always sends a name, never an address). `allowed_hosts` adds names
    ('*': any); `allowed_origins` lists the browser origins allowed ('*': any), none by default."""

    def __init__(self, listen_host: str, allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = ()):
        self.hosts = {host_name(h) for h in (*LOOPBACK_NAMES, listen_host, *allowed_hosts) if h}
        self.any_ip = listen_host in WILDCARD_HOSTS
        self.origins = {o.strip().rstrip("/").lower() for o in allowed_origins if o.strip()}

    def allows_host(self, value: str) -> bool:
        name = host_name(value)
        return "*" in self.hosts or name in self.hosts or (self.any_ip and _is_ip(name)) \
            or (_is_ip(name) and ipaddress.ip_address(name).is_loopback)

    def allows_origin(self, origin: str) -> bool:
        return "*" in self.origins or origin.strip().rstrip("/").lower() in self.origins


class Guard:
    """ASGI middleware: 403 for a foreign Host or browser origin, 401 without the API key, 415 for a body that
    is not JSON, 413 for one over the limit, 408 for one that stalls; one log record per request."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int, on_request: Callable[[dict], None] | None,
                 policy: HostPolicy):
        self.api_key, self.max_body_bytes, self.on_request, self.policy = api_key, max_body_bytes, on_request, policy
        self.app = app
        if policy.origins:                 # an allowed web page also needs the CORS answers
            from starlette.middleware.cors import CORSMiddleware
            self.app = CORSMiddleware(app, allow_origins=["*"] if "*" in policy.origins else sorted(policy.origins),
                                      allow_methods=["*"], allow_headers=["*"])

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
        """Why this request is refused before the app sees it (host, origin, key, body type and size), or None."""
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get("origin")
        refusal = self._origin_refusal(headers.get("host"), origin)
        if refusal is not None:
            return refusal
        if scope["method"] == "OPTIONS" and origin is not None and "access-control-request-method" in headers:
            return None                    # a CORS preflight of an allowed page: no key, no body
        if self.api_key and scope["path"] not in OPEN_PATHS and not _key_matches(headers, self.api_key):
            return RequestError("The API key is missing or wrong; send the header 'Authorization: Bearer <key>' "
                                "(or 'x-api-key: <key>').",
                                status=401, kind="authentication_error")
        return self._body_refusal(scope["method"], headers)

    def _origin_refusal(self, host: str | None, origin: str | None) -> RequestError | None:
        if host is not None and not self.policy.allows_host(host):
            return RequestError(f"This server does not answer to the host name '{host_name(host)}'; start it with "
                                f"--allowed-hosts {host_name(host)} to allow it.", status=403, kind="forbidden")
        if origin is not None and not self.policy.allows_origin(origin):
            return RequestError(f"Requests from web pages ({origin}) are refused; start the server with "
                                f"--allowed-origins {origin} to allow that page.", status=403, kind="forbidden")
        return None

    def _body_refusal(self, method: str, headers: dict[str, str]) -> RequestError | None:
        if method in BODY_METHODS and _has_body(headers) and not is_json_type(headers.get("content-type", "")):
            return RequestError("The request body must be JSON sent with the header 'Content-Type: application/json' "
                                "(curl: add -H 'Content-Type: application/json').", status=415)
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return self._too_large()
        return None

    def _too_large(self) -> RequestError:
        return RequestError(f"The request body is larger than {self.max_body_bytes // (1024 * 1024)} MiB; "
                            f"send a shorter prompt.", status=413)

    async def _buffered(self, scope, receive):
        """Read the whole body first (counted, so chunked bodies are bounded too; each piece within
        BODY_IDLE_TIMEOUT_S), then replay it."""
        if scope["method"] not in BODY_METHODS:
            return receive, None
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), BODY_IDLE_TIMEOUT_S)
            except asyncio.TimeoutError:
                return receive, RequestError(f"The request body stopped arriving for {BODY_IDLE_TIMEOUT_S:.0f} s; "
                                             "send it again.", status=408)
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


def error_response(path: str, exc: RequestError) -> JSONResponse:
    """A refusal in the style of the API it was sent to (Ollama's under /api, Anthropic's under /v1/messages,
    OpenAI's elsewhere)."""
    body = {"error": exc.message} if path.startswith("/api/") else \
        anthropic_api.error_object(exc) if path.startswith("/v1/messages") else openai_api.error_object(exc)
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


def _key_matches(headers: dict[str, str], api_key: str) -> bool:
    """Compared as UTF-8 bytes: the header arrives as bytes (decoded latin-1 above, so re-encoded as such).
    Anthropic's clients send the key as `x-api-key`."""
    given = headers.get("authorization", "").encode("latin-1")
    if "x-api-key" in headers:
        given = b"Bearer " + headers["x-api-key"].encode("latin-1")
    return hmac.compare_digest(given, f"Bearer {api_key}".encode("utf-8"))


def _has_body(headers: dict[str, str]) -> bool:
    return headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
