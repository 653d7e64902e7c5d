"""engine.load takes the one Options object: an explicit argument wins over it, and the runtime reads no
environment variable of its own."""
import re
from pathlib import Path

import engine
from engine.options import Options

ROOT = Path(__file__).resolve().parents[2]


def test_an_explicit_cpu_experts_wins_over_the_options(sluice_models):
    path = sluice_models("olmoe", "int8")          # int8 on the CPU device: experts computed in place
    eng = engine.load(path, options=Options(cpu_experts="all"), cpu_experts="off")
    try:
        assert eng.options.cpu_experts == "off" and eng.runner.experts.cpu is None
    finally:
        eng.close()
    eng = engine.load(path, options=Options(cpu_experts="all", ram_fill=False))
    try:
        assert eng.runner.experts.cpu is not None and not eng.runner.fills and eng._filler is None
    finally:
        eng.close()


def test_the_environment_no_longer_switches_the_runtime(sluice_models, monkeypatch):
    monkeypatch.setenv("SLUICE_CPU_EXPERTS", "all")      # once overrode the explicit argument
    monkeypatch.setenv("SLUICE_RAM_FILL", "0")
    eng = engine.load(sluice_models("olmoe", "bf16"), options=Options(prefetch_reads=1))
    try:
        assert eng.runner.experts.cpu is None and eng.runner.fills
        assert eng.runner.experts.prefetch_reads == 1
    finally:
        eng.close()


def test_no_environment_reads_in_the_runtime():
    """Besides the model pieces' kernel switches the model code still reads (switches.py)."""
    files = [*sorted((ROOT / "engine" / "runtime").glob("*.py")), ROOT / "engine" / "engine.py"]
    readers = [f.name for f in files if f.name != "switches.py" and re.search(r"os\.environ|getenv", f.read_text())]
    assert readers == []
