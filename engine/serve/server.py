"""uvicorn serving the app: in the foreground (`sluice serve`) or on a thread (the desktop app's Local server).

    server = Server(engine, host="127.0.0.1", port=8000, api_key=None, allowed_hosts=(), allowed_origins=())
    server.start()          # a thread; returns once the socket is bound (SluiceError if it cannot be)
    server.url              # http://127.0.0.1:8000
    server.stop()
"""
from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from typing import Callable, Iterable

from engine.errors import SluiceError
from engine.serve.app import MAX_BODY_BYTES, create_app
from engine.serve.connections import GuardedH11Protocol, quiet_connection_noise
from engine.serve.guard import HostPolicy
from engine.serve.queue import GenerationQueue
from engine.serve.service import Service

log = logging.getLogger("sluice.serve")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Server:
    def __init__(self, engine, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
                 queue: GenerationQueue | None = None, max_waiting: int = 8,
                 max_body_bytes: int = MAX_BODY_BYTES, on_request: Callable[[dict], None] | None = None,
                 allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = ()):
        import uvicorn
        check_settings(port, api_key, max_waiting)
        if getattr(engine, "tokenizer", None) is None:
            raise SluiceError(f"The model in '{engine.info.get('path')}' has no tokenizer files, so the server could "
                              "not read any message; repack it from a snapshot that has tokenizer.json.")
        self.api_key = api_key or None
        self.socket = _bind(host, port)
        self.owns_queue = queue is None
        self.queue = queue or GenerationQueue(engine, max_waiting=max_waiting)
        self.service = Service(engine, self.queue)
        self.host, self.port = host, self.socket.getsockname()[1]
        policy = HostPolicy(host, allowed_hosts, allowed_origins)
        app = create_app(self.service, self.api_key, max_body_bytes, on_request, policy)
        quiet_connection_noise()
        config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2,
                                lifespan="off", http=GuardedH11Protocol, timeout_keep_alive=5)
        self._uvicorn = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def telemetry(self) -> dict:
        return self.service.telemetry()

    def run(self) -> None:
        """Serve in this thread until interrupted (Ctrl+C)."""
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self._close()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._uvicorn.run, kwargs={"sockets": [self.socket]},
                                        name="sluice-serve", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._uvicorn.should_exit = True
        if self.owns_queue:
            self.queue.close()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._close()

    def _close(self) -> None:
        try:
            self.socket.close()
        except OSError:
            pass


def check_settings(port: int, api_key: str | None, max_waiting: int) -> None:
    """The settings a server cannot work with, refused before anything is loaded or bound."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise SluiceError(f"The port (--port) must be a whole number from 0 to 65535 (0 picks a free one); "
                          f"got {port!r}.")
    if api_key and not (api_key.isascii() and api_key.isprintable() and " " not in api_key):
        raise SluiceError("The API key (--api-key) may hold only ASCII letters, digits and punctuation (no spaces): "
                          "HTTP clients cannot send other characters in a header.")
    if isinstance(max_waiting, bool) or not isinstance(max_waiting, int) or max_waiting < 1:
        raise SluiceError(f"The queue (--max-queue) must let at least 1 request wait, not {max_waiting!r}: "
                          "with 0 every request would be refused as busy.")


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == 98:
            raise SluiceError(f"Port {port} on {host} is already in use; choose another one with --port.") from None
        raise SluiceError(f"Cannot listen on {host}:{port} ({exc.strerror}); check the address.") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock
