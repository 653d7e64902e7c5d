"""OpenAI- and Ollama-compatible HTTP server on the engine's public API (`sluice serve`, the app's Local server)."""
from engine.serve.queue import GenerationQueue, QueueFull
from engine.serve.server import Server, is_loopback

__all__ = ["GenerationQueue", "QueueFull", "Server", "is_loopback"]
