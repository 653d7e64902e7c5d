"""The hub's faults: a listing that points outside the download folder, and a network that is not there."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from setup_support import SUPPORTED_REPO
from engine.errors import SluiceError

ROOT = Path(__file__).resolve().parents[2]


def test_a_listed_path_that_escapes_the_folder_downloads_nothing(hub, tmp_path):
    repo = hub.repos[SUPPORTED_REPO]
    repo.files["additional_chat_templates/../../../x.jinja"] = dict(repo.files["config.json"])
    dst = tmp_path / "a" / "b" / "snap"
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-m", "app.main", "download", SUPPORTED_REPO, "--dir", str(dst)], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "outside the download folder" in run.stderr and "Traceback" not in run.stderr
    assert not list(tmp_path.rglob("x.jinja")) and hub.weight_requests() == []


def test_search_without_a_network_fails_at_once_in_one_sentence(monkeypatch, capfd):
    from engine.hub.search import search
    with socket.socket() as sock:                      # a port where nothing listens: connection refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    import huggingface_hub.constants
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    started = time.monotonic()
    with pytest.raises(SluiceError, match="Cannot reach the model hub"):
        search("qwen")
    assert time.monotonic() - started < 1.0
    out, err = capfd.readouterr()
    assert "Retry" not in out + err and "retry" not in out + err
