"""Server tests: real `sluice serve` processes, the official `openai` client and httpx, on 127.0.0.1."""
import pytest


@pytest.fixture(scope="session")
def serve_model(tmp_path_factory):
    """The demo model (tiny random qwen3_moe with a tokenizer and a ChatML template), built once."""
    from engine.tools.demo import build_demo_model
    return build_demo_model(tmp_path_factory.mktemp("serve") / "demo")
