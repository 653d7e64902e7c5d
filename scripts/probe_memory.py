"""Where the process's memory besides the RAM cache comes from, phase by phase (issue #10's memory diet).

Loads a Sluice model dir with a small RAM cache and prints, after each phase, the anonymous memory
(RssAnon + RssShmem, less the RAM cache) and its largest mappings (engine.runtime.memory).
Usage: python3 scripts/probe_memory.py MODEL_DIR [device=cuda]
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROWS = []


def note(phase: str, cache_bytes: int = 0) -> None:
    from engine.runtime.memory import anonymous_by_mapping, process_memory
    rss, anon = process_memory()
    where = ", ".join(f"{name} {size / 2**20:.0f}" for name, size in anonymous_by_mapping(top=5))
    ROWS.append((phase, (anon - cache_bytes) / 2**20, rss / 2**20, where))


def _note_after(owner, name: str, label: str) -> None:
    """Wrap a loading step so the memory is noted when it returns."""
    step = getattr(owner, name)

    def noted(*args, **kwargs):
        result = step(*args, **kwargs)
        note(label)
        return result
    setattr(owner, name, noted)


def main() -> None:
    path, device = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "cuda")
    note("python")
    import torch
    note("import torch")
    if device == "cuda":
        torch.zeros(1, device="cuda")
        note("CUDA context")
        a = torch.randn(1024, 1024, device="cuda")
        (a @ a).sum().item()
        del a
        note("cuBLAS handle")
    import engine
    note("import engine")
    import transformers  # noqa: F401 - the tokenizer's import, counted on its own
    note("import transformers")
    import engine.runtime.runner as runner
    for owner, name, label in ((runner, "_load_dense", "load: dense weights"),
                               (runner.Runner, "_choose_kernel", "load: kernel self-check"),
                               (runner.Runner, "_capture_decode", "load: decode CUDA graphs"),
                               (runner, "release_free_heap", "load: free heap trimmed"),
                               (runner.Runner, "_cpu_experts", "load: CPU expert probe")):
        _note_after(owner, name, label)
    eng = engine.load(path, device=device, vram_budget="4GB", ram_cache="256MB", max_context=int(os.environ.get("PROBE_CONTEXT", "1024")))
    note("engine.load", eng.telemetry()["ram_cache"]["used_bytes"])
    from engine.params import GenerationParams
    for _ in eng.generate(list(range(1, 65)), GenerationParams(max_new_tokens=16, temperature=0.0)):
        pass
    note("64-token prompt + 16 tokens", eng.telemetry()["ram_cache"]["used_bytes"])
    for _ in eng.generate([1 + i % 300 for i in range(500)], GenerationParams(max_new_tokens=4, temperature=0.0)):
        pass
    note("500-token prompt + 4 tokens", eng.telemetry()["ram_cache"]["used_bytes"])
    from engine.runtime.memory import release_free_heap
    release_free_heap()
    note("malloc_trim after the prompts", eng.telemetry()["ram_cache"]["used_bytes"])
    regions = _private_regions()
    eng.close()
    print("| phase | anonymous besides the RAM cache, MiB | RSS, MiB | largest anonymous mappings, MiB |")
    for phase, anon, rss, where in ROWS:
        print(f"| {phase} | {anon:.0f} | {rss:.0f} | {where} |")
    print("largest private anonymous regions (size MiB: resident MiB, how many):",
          ", ".join(f"{size}: {rss} x{n}" for (size, rss), n in regions))


def _private_regions(top: int = 12) -> list:
    """The private anonymous mappings by (size, resident) MiB, most resident first: thread stacks (8 MiB),
    glibc arenas (64 MiB reserved), the CUDA driver's and torch's own maps."""
    import collections
    found, size = collections.Counter(), 0
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if not head[0].endswith(":"):
                start, end = (int(a, 16) for a in head[0].split("-"))
                private = len(head) < 6 and head[1].endswith("p")
                size = (end - start) >> 20 if private else None
            elif head[0] == "Rss:" and size is not None and int(head[1]) >= 1024:
                found[(size, int(head[1]) >> 10)] += 1
    return sorted(found.items(), key=lambda kv: -kv[0][1] * kv[1])[:top]


if __name__ == "__main__":
    main()
