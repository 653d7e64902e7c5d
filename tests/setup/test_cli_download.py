"""`sluice download REPO --dir D` headless, in a real subprocess: progress bar, kill -9 and resume, refusals."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from setup_support import SUPPORTED_REPO, UNSUPPORTED_REPO, same_files
from engine.hub.download import STATE_DIR

ROOT = Path(__file__).resolve().parents[2]
WEIGHTS = "model.safetensors"


def _cli(*args) -> list[str]:
    return [sys.executable, "-m", "app.main", "download", *args]      # the `sluice` console entry


def _env(hub) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_TELEMETRY="1", PYTHONPATH=str(ROOT))
    return env


def test_download_headless_with_progress_bar(hub, model_folders, tmp_path):
    dst = tmp_path / "snap"
    run = subprocess.run(_cli(SUPPORTED_REPO, "--dir", str(dst)), env=_env(hub), cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(dst)
    assert "qwen3_moe" in run.stderr and "100%" in run.stderr and "download" in run.stderr
    assert "fp8: " in run.stderr and "tok/s: fits fast" in run.stderr           # the estimate, before the bytes
    names = [p.name for p in model_folders[SUPPORTED_REPO].iterdir()]
    assert same_files(model_folders[SUPPORTED_REPO], dst, names)


def test_killed_mid_file_then_rerun_fetches_only_the_missing_bytes(hub, model_folders, tmp_path):
    dst = tmp_path / "snap"
    part = dst / STATE_DIR / (WEIGHTS + ".part")
    size = (model_folders[SUPPORTED_REPO] / WEIGHTS).stat().st_size
    hub.throttle_bps = 400_000
    proc = subprocess.Popen(_cli(SUPPORTED_REPO, "--dir", str(dst)), env=_env(hub), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (part.exists() and part.stat().st_size > size // 4) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)                     # the app is closed the hard way, mid-file
    proc.wait()
    kept = part.stat().st_size
    assert size // 4 < kept < size

    hub.throttle_bps = None
    hub.reset_counters()
    run = subprocess.run(_cli(SUPPORTED_REPO, "--dir", str(dst)), env=_env(hub), cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    total = sum(p.stat().st_size for p in model_folders[SUPPORTED_REPO].iterdir())
    assert hub.bytes_sent_by_path[WEIGHTS] == size - kept
    assert ("GET", f"/{SUPPORTED_REPO}/resolve/{hub.repos[SUPPORTED_REPO].sha}/{WEIGHTS}", f"bytes={kept}-") in hub.requests
    assert hub.body_bytes_sent < total
    assert same_files(model_folders[SUPPORTED_REPO], dst, [p.name for p in model_folders[SUPPORTED_REPO].iterdir()])


def test_unsupported_repo_fails_with_one_sentence_and_downloads_no_weights(hub, tmp_path):
    run = subprocess.run(_cli(UNSUPPORTED_REPO, "--dir", str(tmp_path / "snap")), env=_env(hub), cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2                                   # the CLI's code for a user-fixable error
    assert run.stderr.startswith("sluice: tiny-dense/Llama-tiny is a 'llama' model, which Sluice cannot run")
    assert "Traceback" not in run.stderr and hub.weight_requests() == []
