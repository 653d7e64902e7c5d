"""Kernel tests run natively on a CUDA GPU, else on the CPU through Triton's interpreter.
TRITON_INTERPRET must be set before the first `import triton` (it is read when kernels are decorated)."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def _private_kernel_cache(tmp_path, monkeypatch):
    """Self-check verdicts go to a per-test file, never to the user's cache."""
    monkeypatch.setenv("SLUICE_DATA_DIR", str(tmp_path))
