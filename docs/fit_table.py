"""Prints README's "which model fits my PC, and how fast" table: every number COMPUTED, none measured.

Each cell is the estimate the app's download wizard shows for that machine (engine.plan.estimate.estimate): the
engine's default budgets (90% of the VRAM; a RAM cache of half the RAM left after 8 GB for the system and the
app), the experts spread over VRAM, RAM and disk by those budgets and read under uniform routing (real chats
reuse experts, so measured hit rates and speeds are higher), and a token's time = its disk bytes / disk speed +
its PCIe bytes / PCIe speed + the bytes the GPU reads / GPU memory speed + a measured overhead per layer
(launches, the host's work). Where int8 dense weights run a model faster or at all, the cell uses them, as the
wizard suggests. Run from the repository root: .venv/bin/python docs/fit_table.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.plan.estimate import Machine, estimate  # noqa: E402
from engine.tools.presets import preset_config  # noqa: E402

GB = 1e9
SYSTEM_RAM_GB = 8            # what the OS, the desktop and the app keep


def _full(preset: str, **changes) -> dict:
    """A preset's config with the released model's layer count (the presets cut some)."""
    config = {**preset_config(preset), **changes}
    config.pop("layer_types", None)             # recomputed by transformers for the full layer count
    return config


# (name, quant, its config.json as released)
FAMILIES = [
    ("Qwen3-30B-A3B", "fp8", _full("qwen3-30b-a3b")),
    ("gpt-oss-120b", "mxfp4", _full("gpt-oss-120b", num_hidden_layers=36)),
    ("GLM-4.5-Air", "fp8", _full("glm-4.5-air")),
    # Qwen/Qwen3-235B-A22B config.json
    ("Qwen3-235B-A22B", "fp8", _full("qwen3-30b-a3b", hidden_size=4096, num_hidden_layers=94, num_attention_heads=64,
                                     num_key_value_heads=4, num_experts=128, moe_intermediate_size=1536,
                                     intermediate_size=12288)),
    ("DeepSeek-V3", "fp8", _full("deepseek-v3-4-layers", num_hidden_layers=61, first_k_dense_replace=3)),
]
# (name, VRAM GB, RAM GB, PCIe GB/s usable, NVMe GB/s read, GPU memory GB/s)
PCS = [
    ("8 GB GPU, 16 GB RAM, PCIe 4, NVMe 3.5 GB/s", 8, 16, 25, 3.5, 300),
    ("8 GB GPU, 32 GB RAM, PCIe 4, NVMe 3.5 GB/s", 8, 32, 25, 3.5, 300),
    ("12 GB GPU, 64 GB RAM, PCIe 4, NVMe 7 GB/s", 12, 64, 25, 7.0, 450),
    ("16 GB GPU, 64 GB RAM, PCIe 5, NVMe 7 GB/s", 16, 64, 50, 7.0, 600),
    ("24 GB GPU, 128 GB RAM, PCIe 5, NVMe 12 GB/s", 24, 128, 50, 12.0, 1000),
]


def cell(pc, family) -> str:
    _, vram, ram, pcie, disk, gpu_memory = pc
    _, quant, config = family
    machine = Machine("cuda", ram_available_bytes=int((ram - SYSTEM_RAM_GB) * GB), mem_bw_bps=60 * GB,
                      disk_read_bps=disk * GB, free_disk_bytes=10**14, vram_bytes=int(vram * GB),
                      pcie_bps=pcie * GB, gpu_mem_bw_bps=gpu_memory * GB)
    est = estimate(config, 0, machine, quant, suggest_int8_dense=True)
    est = est.int8_dense_tip or est
    if not est.is_usable:
        return "does not fit"
    speed = f"{est.tok_s:.1f}" if est.tok_s < 10 else f"{est.tok_s:.0f}"
    return f"{speed} tok/s" + (" (int8 dense)" if est.dense_quant else "")


def main() -> None:
    print("| PC (computed, not measured) | " + " | ".join(f"{name} {quant}" for name, quant, _ in FAMILIES) + " |")
    print("|---|" + "---|" * len(FAMILIES))
    for pc in PCS:
        print(f"| {pc[0]} | " + " | ".join(cell(pc, family) for family in FAMILIES) + " |")


if __name__ == "__main__":
    main()
