"""Shared test setup: offline hub, offscreen Qt, small random-weight models built once per session."""
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

if not torch.cuda.is_available():
    # Triton reads this when a kernel is decorated: without a GPU, kernels run in its interpreter.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

FAMILIES = ("qwen3_moe", "mixtral", "olmoe", "qwen2_moe")


def pytest_report_header(config):
    """The reference's version: token-exact tests compare with the pinned transformers (pyproject.toml); another one
    can differ by design (transformers 5.17's gpt-oss experts ignore the config's clamp limit)."""
    import re
    from pathlib import Path

    import transformers
    pinned = re.search(r'"transformers==([^"]+)"', (Path(__file__).parents[1] / "pyproject.toml").read_text())
    if pinned and pinned.group(1) != transformers.__version__:
        return (f"WARNING: transformers {transformers.__version__} is installed, {pinned.group(1)} is pinned: the "
                "token-exact tests may fail for the version alone (bench/device_wheels.sh)")
    return f"transformers {transformers.__version__} (as pinned)"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_kernel_warmup(request, monkeypatch):
    """Tests load hundreds of throwaway models on a GPU: no kernel warm-up child for each, as with
    Options(kernel_warmup=False) (tests/engine/test_kernel_warmup.py runs the child)."""
    if torch.cuda.is_available() and "warmup_on" not in request.fixturenames:
        import engine.engine
        monkeypatch.setattr(engine.engine, "ensure_warm", lambda *args, **kw: None)


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """The app's data folder (database, settings, models) in a fresh temporary folder."""
    path = tmp_path / "data"
    monkeypatch.setenv("SLUICE_DATA_DIR", str(path))
    return path


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory):
    """family -> path of a small random-weight HF snapshot (bf16 weights, tokenizer, chat template)."""
    from engine.tools.demo import build_hf_model
    root = tmp_path_factory.mktemp("hf")
    cache = {}

    def get(family: str):
        if family not in cache:
            cache[family] = build_hf_model(family, root / family)
        return cache[family]
    return get


@pytest.fixture(scope="session")
def sluice_models(tmp_path_factory, hf_models):
    """(family, quant) -> path of the repacked Sluice model dir."""
    from engine.format.repack import repack
    root = tmp_path_factory.mktemp("sluice")
    cache = {}

    def get(family: str, quant: str = "bf16"):
        key = (family, quant)
        if key not in cache:
            cache[key] = repack(hf_models(family), root / f"{family}-{quant}", quant=quant)
        return cache[key]
    return get
