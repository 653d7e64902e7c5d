"""Prints README's "which model fits my PC, and how fast" table: every number COMPUTED, none measured.

    tok/s = efficiency / (expert bytes a token from disk / disk GB/s + expert bytes a token over PCIe / PCIe GB/s
                          + bytes a token the GPU reads / GPU memory GB/s)

the additive roofline of engine.plan.estimate.roofline_tok_s, with the efficiency measured against it
(BENCHMARKS.md: 0.81-1.01 in the streaming regimes; 0.85 used here). Experts are spread over the tiers by size:
VRAM left after the dense weights and 1.5 GB of context and workspace, then the RAM cache (RAM less 8 GB for the
system and the app), then the disk; a token's experts hit each tier in proportion (uniform routing: real chats
reuse experts, so measured hit rates and speeds are higher). Run: python3 docs/fit_table.py
"""
EFFICIENCY = 0.85
GB = 1e9

# (name, quant, bytes per weight, dense params, routed expert params, active expert params a token), from each
# model's config.json (layers x experts x 3 x hidden x expert width; dense = the catalog's total less experts)
FAMILIES = [
    ("Qwen3-30B-A3B", "fp8", 1.0, 1.5e9, 29.0e9, 1.81e9),
    ("gpt-oss-120b", "mxfp4", 0.53, 2.1e9, 114.7e9, 3.58e9),
    ("GLM-4.5-Air", "fp8", 1.0, 7.3e9, 99.6e9, 6.23e9),
    ("Qwen3-235B-A22B", "fp8", 1.0, 8.1e9, 227.0e9, 14.2e9),
    ("DeepSeek-V3", "fp8", 1.0, 17.4e9, 653.6e9, 20.4e9),
]
# (name, VRAM GB, RAM GB, PCIe GB/s usable, NVMe GB/s read, GPU memory GB/s)
PCS = [
    ("8 GB GPU, 16 GB RAM, PCIe 4, NVMe 3.5 GB/s", 8, 16, 25, 3.5, 300),     # README's least RAM
    ("8 GB GPU, 32 GB RAM, PCIe 4, NVMe 3.5 GB/s", 8, 32, 25, 3.5, 300),
    ("12 GB GPU, 64 GB RAM, PCIe 4, NVMe 7 GB/s", 12, 64, 25, 7.0, 450),
    ("16 GB GPU, 64 GB RAM, PCIe 5, NVMe 7 GB/s", 16, 64, 50, 7.0, 600),
    ("24 GB GPU, 128 GB RAM, PCIe 5, NVMe 12 GB/s", 24, 128, 50, 12.0, 1000),
]


def tok_s(pc, family) -> float | None:
    _, vram, ram, pcie, disk, hbm = pc
    _, _, bytes_per_weight, dense, experts, active = family
    dense_bytes, expert_bytes, active_bytes = dense * 1.0, experts * bytes_per_weight, active * bytes_per_weight
    vram_for_experts = vram * GB - dense_bytes - 1.5 * GB
    if vram_for_experts <= 0:
        return None                                     # the dense weights alone do not fit the GPU
    in_vram = min(1.0, vram_for_experts / expert_bytes)
    in_ram = min(1.0 - in_vram, max(0.0, ram - 8) * GB / expert_bytes)
    seconds = (active_bytes * (1 - in_vram - in_ram) / (disk * GB) + active_bytes * (1 - in_vram) / (pcie * GB)
               + (dense_bytes + active_bytes) / (hbm * GB))
    return EFFICIENCY / seconds


def main() -> None:
    print("| PC (computed, not measured) | " + " | ".join(f"{name} {quant}" for name, quant, *_ in FAMILIES) + " |")
    print("|---|" + "---|" * len(FAMILIES))
    for pc in PCS:
        cells = [tok_s(pc, family) for family in FAMILIES]
        print(f"| {pc[0]} | " + " | ".join("does not fit" if c is None else f"{c:.1f} tok/s" if c < 10 else
                                          f"{c:.0f} tok/s" for c in cells) + " |")


if __name__ == "__main__":
    main()
