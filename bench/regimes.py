"""The bench's three memory regimes (DESIGN.md, "Benchmark protocol"): where the model fits in
RAM, where it fits only in VRAM + RAM, and where it exceeds both. Each sets the memory cap of the
process and its page cache (cgroup v2 `memory.max`) and the VRAM budget, the same for every engine.
The sizes are OLMoE-1B-7B's (6.46 GB of fp8 experts, 6.85 GiB as a llama.cpp Q8_0 GGUF).
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.errors import SluiceError
from engine.sizes import format_size, parse_size


@dataclass(frozen=True)
class Regime:
    name: str
    memory_cap_bytes: int | None     # cgroup v2 memory.max for the process + its page cache; None: RAM free
    vram_budget: str                 # what the driver may show for the process
    ncmoe: tuple[int, ...]           # llama.cpp `-ncmoe` values to try (OLMoE's 16 layers)
    summary: str


REGIMES = {r.name: r for r in (
    Regime("fits-ram", None, "4GB", (8, 9, 10, 12, 16), "RAM unconstrained, ~4 GB of VRAM"),
    Regime("fits-vram-ram", 4 << 30, "4GB", (8, 9, 10, 12, 16), "4 GiB process cap, ~4 GB of VRAM"),
    # llama.cpp decodes at < 0.3 tok/s here whatever -ncmoe (each run then takes its whole timeout): the
    # value that fits ~2 GB (3 of 16 layers' experts on the GPU) and all experts on the CPU
    Regime("exceeds", 5 << 29, "2GB", (13, 16), "2.5 GiB process cap, ~2 GB of VRAM"),
)}


def regime(name: str) -> Regime:
    if name not in REGIMES:
        raise SluiceError(f"Unknown regime '{name}': choose one of {', '.join(REGIMES)}.")
    return REGIMES[name]


def regime_budgets(r: Regime, vram_budget: str | None, ram_cache: str | None, capped: bool) -> tuple[str, str | None]:
    """(VRAM budget, RAM cache) for a run in regime `r`; the user's own flags win. Under a real cap the RAM
    cache is left to the engine (what the cgroup allows); with budgets only (no cgroup) it is half the
    cap, about what the process leaves a cache inside it."""
    vram = vram_budget or r.vram_budget
    if ram_cache is not None or capped or r.memory_cap_bytes is None:
        return vram, ram_cache
    return vram, str(r.memory_cap_bytes // 2)


def describe(r: Regime, capped: bool) -> str:
    if r.memory_cap_bytes is None:
        return f"regime {r.name}: {r.summary}"
    how = "cgroup v2 memory.max (process + page cache)" if capped else \
        "budgets only (no cgroup v2 cap could be set here, so the page cache is not capped)"
    return f"regime {r.name}: {r.summary}; cap {format_size(r.memory_cap_bytes)} by {how}"


def vram_budget_bytes(r: Regime, vram_budget: str | None) -> int:
    return parse_size(vram_budget or r.vram_budget)
