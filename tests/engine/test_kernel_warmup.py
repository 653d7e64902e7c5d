"""A machine's first load checks its kernels in a child process, once per machine, model and setting."""
from __future__ import annotations

import json

import pytest
import torch

import engine
from engine.options import Options
from engine.runtime import kernel_warmup
from engine.runtime.kernel_warmup import ensure_warm, marker_path


@pytest.fixture
def warmup_on(tmp_path, monkeypatch):
    """The warm-up's marker (and the child's verdicts) in a fresh data folder."""
    monkeypatch.setenv("SLUICE_DATA_DIR", str(tmp_path / "data"))
    return tmp_path


def test_the_child_runs_once_per_model_and_setting(warmup_on, sluice_models):
    path = sluice_models("olmoe")
    steps = []
    assert ensure_warm(path, torch.device("cpu"), torch.float32, None, progress=lambda *a: steps.append(a)) == "warmed"
    assert steps and set(steps) == {(0, 0, "checking the GPU kernels on this machine (once)")}   # a busy bar
    assert list(json.loads(marker_path().read_text()).values()) == ["warmed"]
    assert ensure_warm(path, torch.device("cpu"), torch.float32, None) is None               # done: no child
    assert ensure_warm(path, torch.device("cpu"), torch.float32, "int8") == "warmed"        # another setting


def test_a_failing_child_is_not_retried_and_the_load_goes_on(warmup_on, sluice_models, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{")
    outcome = ensure_warm(broken, torch.device("cpu"), torch.float32, None)
    assert outcome.startswith("failed: ") and "Traceback" not in outcome
    assert ensure_warm(broken, torch.device("cpu"), torch.float32, None) is None


def test_a_cancelled_load_stops_the_child_and_marks_nothing(warmup_on, sluice_models, monkeypatch):
    """The app cancels a load by raising from its progress callback: the child is stopped, not left running."""
    started = []

    class Recorded(kernel_warmup.subprocess.Popen):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            started.append(self)
    monkeypatch.setattr(kernel_warmup.subprocess, "Popen", Recorded)

    class Cancelled(Exception):
        pass

    def progress(*_):
        if len(progress.calls) == 1:                 # the second report: the user pressed Cancel
            raise Cancelled()
        progress.calls.append(1)
    progress.calls = []
    with pytest.raises(Cancelled):
        ensure_warm(sluice_models("olmoe"), torch.device("cpu"), torch.float32, None, progress=progress)
    assert len(started) == 1 and started[0].returncode not in (None, 0)      # stopped mid-way and reaped
    assert not marker_path().exists()                                        # the next load tries again


def test_a_child_past_its_time_is_stopped(warmup_on, sluice_models, monkeypatch):
    monkeypatch.setattr(kernel_warmup, "TIMEOUT_S", 0)
    assert ensure_warm(sluice_models("olmoe"), torch.device("cpu"), torch.float32, None) == \
        "failed: it took longer than 0 s"


def test_switched_off(warmup_on, sluice_models):
    off = Options(kernel_warmup=False)
    assert ensure_warm(sluice_models("olmoe"), torch.device("cpu"), torch.float32, None, off) is None
    assert not marker_path().exists()


def test_the_child_gets_the_parents_options_through_its_argv_with_its_own_warmup_off():
    options = Options(cpu_kernel="torch", prefetch_reads=2, ram_fill=False)
    argv = kernel_warmup.child_settings(options)
    assert argv[::2] == ["--set"] * (len(argv) // 2)
    assert Options.parse(argv[1::2]) == options.replace(kernel_warmup=False)


@pytest.mark.gpu
def test_after_the_child_the_parent_runs_no_check(warmup_on, sluice_models):
    """On a GPU the child leaves every verdict cached: the parent's load compares no kernel with its reference."""
    eng = engine.load(sluice_models("olmoe", "fp8"), device="cuda", dense_quant="int8")
    assert eng.kernel_warmup == "warmed"
    assert eng.runner.kernel_verdict is not None and eng.runner.kernel_verdict.cached
    del eng
    torch.cuda.empty_cache()
    assert engine.load(sluice_models("olmoe", "fp8"), device="cuda", dense_quant="int8").kernel_warmup is None


def test_the_key_names_what_the_verdicts_depend_on(tmp_path):
    key = kernel_warmup.warmup_key(tmp_path, torch.device("cpu"), torch.bfloat16, "int8")
    assert str(tmp_path.resolve()) in key and "bfloat16" in key and "int8" in key
    assert key != kernel_warmup.warmup_key(tmp_path, torch.device("cpu"), torch.bfloat16, None)
    assert key != kernel_warmup.warmup_key(tmp_path, torch.device("cpu"), torch.float16, "int8")
