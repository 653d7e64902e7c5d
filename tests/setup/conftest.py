"""Fixtures for the model-setup tests: small random-weight repos served by a local mock hub."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # tests/hubserver.py

from hubserver import HubServer  # noqa: E402
from setup_support import MIXTRAL_REPO, SUPPORTED_REPO, UNSUPPORTED_REPO, build_llama  # noqa: E402


@pytest.fixture(scope="session")
def model_folders(tmp_path_factory) -> dict[str, Path]:
    from engine.tools.demo import build_hf_model
    root = tmp_path_factory.mktemp("hub-repos")
    # 2 layers x 16 experts: a ~0.9 MB safetensors file, big enough to interrupt mid-file
    qwen = build_hf_model("qwen3_moe", root / "qwen", num_layers=2, num_experts=16)
    mixtral = build_hf_model("mixtral", root / "mixtral", num_layers=2, with_tokenizer=False)
    llama = build_llama(root / "llama")
    return {SUPPORTED_REPO: qwen, MIXTRAL_REPO: mixtral, UNSUPPORTED_REPO: llama}


@pytest.fixture
def hub(model_folders, monkeypatch):
    server = HubServer()
    server.add_repo(SUPPORTED_REPO, model_folders[SUPPORTED_REPO], downloads=1200, likes=40)
    server.add_repo(MIXTRAL_REPO, model_folders[MIXTRAL_REPO], downloads=300, likes=9)
    # the most downloaded one is unsupported: search must still list supported families first
    server.add_repo(UNSUPPORTED_REPO, model_folders[UNSUPPORTED_REPO], downloads=99000, likes=800)
    server.start()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    # tests/conftest.py makes the whole suite offline; these tests talk to the local hub only
    import huggingface_hub.constants
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    yield server
    server.stop()
