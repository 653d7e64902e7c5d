"""The speeds hybrid execution measures at load are kept per machine: a later load that finds "copying is
faster" builds no CPU share and never loads the fused kernel's numba (35-130 MiB of the process)."""
import json
import os
import subprocess
import sys

import pytest

from engine.runtime import load_speeds
from kernels import selfcheck

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SLUICE_DATA_DIR", str(tmp_path))
    return load_speeds.speeds_path()


def test_speeds_are_kept_per_key_and_a_damaged_file_is_measured_again(cache):
    assert load_speeds.recall("gpu|cpu|int8") is None
    load_speeds.remember("gpu|cpu|int8", {"cpu_expert_s": 2e-4, "copy_s": 1.3e-4, "cpu_kernel": "fused"})
    load_speeds.remember("gpu|cpu|fp8", {"cpu_expert_s": 9e-4, "copy_s": 1e-4, "cpu_kernel": "torch"})
    assert load_speeds.recall("gpu|cpu|int8") == {"cpu_expert_s": 2e-4, "copy_s": 1.3e-4, "cpu_kernel": "fused"}
    assert load_speeds.recall("gpu|cpu|fp8")["cpu_kernel"] == "torch"
    assert load_speeds.recall("other gpu|cpu|int8") is None
    assert cache.parent == selfcheck.cache_path().parent                          # beside the kernel verdicts

    cache.write_text('{"gpu|cpu|int8": {"cpu_expert_s": "fast"}, "truncated')        # a crash mid-write
    assert load_speeds.recall("gpu|cpu|int8") is None
    load_speeds.remember("gpu|cpu|int8", {"cpu_expert_s": 1e-4, "copy_s": 1e-4})
    assert json.loads(cache.read_text()) == {"gpu|cpu|int8": {"cpu_expert_s": 1e-4, "copy_s": 1e-4}}
    cache.write_text('{"gpu|cpu|int8": {"cpu_expert_s": 1e-4}}')                     # a field missing
    assert load_speeds.recall("gpu|cpu|int8") is None
    cache.write_text('["not", "a", "table"]')
    assert load_speeds.recall("gpu|cpu|int8") is None
    load_speeds.remember("gpu|cpu|int8", {"cpu_expert_s": 1e-4, "copy_s": 1e-4})
    assert load_speeds.recall("gpu|cpu|int8") == {"cpu_expert_s": 1e-4, "copy_s": 1e-4}


def test_the_engine_loads_numba_only_when_it_builds_a_cpu_share():
    code = "import sys, engine.engine, engine.tools.bench; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


LOAD = """
import json, sys, engine
from engine.options import Options
from engine.runtime import placement
placement.LIVE_FACTOR = float(sys.argv[2])          # what decoding is taken to cost the CPU, in load times
eng = engine.load(sys.argv[1], device="cuda", options=Options(kernel_warmup=False))   # (no VRAM budget: the
                                                    # CUDA context alone is more than a small one)
p = eng.telemetry()["placement"]
print(json.dumps({"measured": p.get("measured"), "active": p["active"], "numba": "numba" in sys.modules}))
eng.close()
"""


def _load(path, env, live_factor: float) -> dict:
    done = subprocess.run([sys.executable, "-c", LOAD, str(path), str(live_factor)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
def test_a_later_load_reuses_the_speeds_and_leaves_numba_out(tmp_path, sluice_models):
    path = sluice_models("olmoe", "int8")
    env = {**os.environ, "SLUICE_DATA_DIR": str(tmp_path)}
    slow_cpu = 1000.0                                   # whatever this machine measures, copying is faster
    assert _load(path, env, slow_cpu) == {"measured": "now", "active": False, "numba": True}
    assert _load(path, env, slow_cpu) == {"measured": "earlier", "active": False, "numba": False}
    # now the CPU wins: the kept speeds say so, it is built again
    assert _load(path, env, 0.0) == {"measured": "now", "active": True, "numba": True}
