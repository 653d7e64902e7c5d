"""The app's Local server: `sluice serve` on the engine the app has loaded, sharing it with the app's chats.

The server and the app's engine thread submit to one GenerationQueue, so in-app chats and HTTP
requests take turns on the one engine. Qt-free: the panel (views/server_panel.py) drives it.
"""
from __future__ import annotations

import secrets
from typing import Callable

from engine import SluiceError
from engine.setup import GenerationQueue, Server, is_loopback


def new_api_key() -> str:
    return "sk-sluice-" + secrets.token_urlsafe(18)


def curl_example(url: str, model: str, api_key: str | None) -> str:
    auth = f" \\\n  -H 'Authorization: Bearer {api_key}'" if api_key else ""
    return (f"curl {url}/v1/chat/completions{auth} \\\n  -H 'Content-Type: application/json' \\\n"
            f"  -d '{{\"model\": \"{model}\", \"stream\": true, "
            f"\"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}]}}'")


class LocalServer:
    def __init__(self, worker, on_request: Callable[[dict], None] | None = None):
        self.worker = worker                 # the app's EngineWorker (its engine, and the queue hook)
        self.on_request = on_request         # called on the server's thread, once per request
        self.server: Server | None = None

    @property
    def running(self) -> bool:
        return self.server is not None

    def start(self, host: str, port: int, api_key: str | None) -> str:
        """Serve the loaded engine; returns the address. SluiceError with one sentence if it cannot."""
        self.stop()
        engine = self.worker.engine
        if engine is None:
            raise SluiceError("Load a model first; the server serves the model the app has loaded.")
        if engine.info.get("device") == "remote":
            raise SluiceError("The loaded model runs on a remote endpoint; load a local model to serve it.")
        queue = GenerationQueue(engine)
        try:
            server = Server(engine, host=host, port=port, api_key=api_key or None, queue=queue,
                            on_request=self.on_request)
        except Exception:
            queue.close()
            raise
        server.start()
        self.server = server
        self.worker.queue = queue
        return server.url

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is None:
            return
        self.worker.queue = None             # the app's next chat runs on the engine directly again
        server.stop()
        server.queue.close()

    def counters(self) -> dict | None:
        return self.server.queue.counters() if self.server else None

    @staticmethod
    def exposed_without_key(host: str, api_key: str | None) -> bool:
        return not is_loopback(host) and not api_key
