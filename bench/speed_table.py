"""What speed to expect on common PCs: README's table, every speed COMPUTED, none measured.

    python -m bench.speed_table

Each cell is the download wizard's estimate (engine.plan.estimate) for that PC: the engine's default budgets (90% of
the VRAM; a RAM cache of half the RAM left after SYSTEM_RAM_GB), experts used evenly (real chats reuse experts, so
they run faster), the format the wizard would take (fp8, or mxfp4 where a model's experts ship in it) and int8 dense
weights where the wizard suggests them. Where BENCHMARKS.md's families table measured the family, the part of a
token's time that limited that run (the GPU's work, or the reads and copies) is its bytes over the PC's bandwidth
divided by the measured efficiency, in place of the estimate's own; the row names the efficiency it used.
"""
from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
SYSTEM_RAM_GB = 8            # what the OS, the desktop and the app keep
HOST_MEM_BPS = 60 * GB       # a desktop's dual-channel DDR5
PCIE_BPS = {4: 25 * GB, 5: 50 * GB}      # an x16 link, usable
GPU, IO = "gpu", "io"      # what limited a measured run: the GPU's work, or reads and copies


@dataclass(frozen=True)
class PC:
    vram_gb: int
    ram_gb: int
    pcie: int
    nvme_gbps: float
    gpu_mem_gbps: int        # the GPU's memory bandwidth

    @property
    def label(self) -> str:
        return f"{self.vram_gb} GB GPU, {self.ram_gb} GB RAM, PCIe {self.pcie}, NVMe {self.nvme_gbps:g} GB/s"


PCS = (PC(8, 16, 4, 3.5, 300), PC(8, 32, 4, 3.5, 300), PC(12, 64, 4, 7, 450), PC(16, 64, 5, 7, 600),
       PC(24, 128, 5, 12, 1000))


@dataclass(frozen=True)
class Measured:
    """A row of BENCHMARKS.md's families table (the run as that row names it): its decode speed, its efficiency (the
    bytes' time over the measured time) and what limited it."""
    run: str
    machine: str
    tok_s: float             # the low end where the row gives a range
    efficiency: float
    layers: int              # the run's layers
    limit: str               # GPU or IO

    @property
    def unexplained_s_per_layer(self) -> float:
        """The measured token's time its bytes do not explain, for each layer."""
        return (1 - self.efficiency) / (self.tok_s * self.layers)


# model_type -> its family's measured run: the one place these figures are copied from BENCHMARKS.md
MEASURED = {
    "gpt_oss": Measured("gpt-oss-120b, 12 of 36 layers, mxfp4", "H100", 105.93, 0.28, 12, GPU),
    "deepseek_v4": Measured("deepseek-v4-flash-4l, 4 of 43 layers, mxfp4", "H100", 22.43, 0.86, 4, IO),
    "qwen3_5_moe": Measured("qwen3.5-35b-a3b, all 40 layers, nvfp4", "H100", 6.44, 0.70, 40, IO),
    "qwen3_moe": Measured("qwen3-30b-a3b, fp8", "H200", 0.79, 0.89, 48, IO),     # the low ends of 0.79-0.89, 0.89-1.01
    "qwen4_exp_text": Measured("qwen3.8-flash-next-4l, 4 of 48 layers, int8, exceeds", "H200", 28.68, 0.61, 4, IO),
}


def _released(preset: str, layers: int) -> dict:
    """A preset's config with the released model's layer count and the layer schedule transformers gives it."""
    from transformers import AutoConfig

    from engine.tools.presets import PRESETS
    kw = {k: v for k, v in PRESETS[preset].items() if k not in ("layer_types", "mlp_layer_types")}
    config = AutoConfig.for_model(kw.pop("model_type"), **{**kw, "num_hidden_layers": layers}).to_dict()
    config.pop("transformers_version", None)
    return config


def models() -> list[tuple[str, str, dict]]:
    """(name, format, its config.json as released) of the main families."""
    from engine.tools.presets import FULL_MODEL, full_model_config, preset_config
    return [("Qwen3-30B-A3B", "fp8", preset_config("qwen3-30b-a3b")),
            ("gpt-oss-20b", "mxfp4", preset_config("gpt-oss-20b")),
            ("gpt-oss-120b", "mxfp4", _released("gpt-oss-120b", 36)),        # openai/gpt-oss-120b: 36 layers
            ("Qwen3.5-35B-A3B", "fp8", preset_config("qwen3.5-35b-a3b")),
            ("GLM-4.5-Air", "fp8", preset_config("glm-4.5-air")),
            ("DeepSeek-V4-Flash", "mxfp4",
             _released("deepseek-v4-flash-4l", FULL_MODEL["deepseek-v4-flash-4l"]["num_layers"])),
            ("Qwen3.8-Flash-Next", "fp8", full_model_config("qwen3.8-flash-next-4l"))]


def machine(pc: PC):
    from engine.plan.estimate import Machine
    return Machine("cuda", ram_available_bytes=int((pc.ram_gb - SYSTEM_RAM_GB) * GB), mem_bw_bps=HOST_MEM_BPS,
                   disk_read_bps=pc.nvme_gbps * GB, free_disk_bytes=10**14, vram_bytes=int(pc.vram_gb * GB),
                   pcie_bps=PCIE_BPS[pc.pcie], gpu_mem_bw_bps=pc.gpu_mem_gbps * GB)


def expected_tok_s(est, measured: Measured | None) -> float:
    """The estimate's decode speed with what its family's measured run did not spend on bytes charged where that run
    spent it. The estimate's token = reads and copies (io) + the GPU's bytes (gpu) + a modelled per-layer overhead.
    A run the GPU's work limited: its unexplained time a layer replaces that overhead (the way LAYER_OVERHEAD_S
    was measured). A run that reads and copies limited: they take 1 / efficiency times their bytes' time."""
    from engine.plan.estimate import layer_overhead_s
    if measured is None:
        return est.tok_s
    overhead = layer_overhead_s(est.shape, "cuda")
    io, gpu = 1 / est.tok_s - est.compute_s, est.compute_s - overhead
    if measured.limit == GPU:
        return 1 / (io + gpu + est.shape.num_layers * measured.unexplained_s_per_layer)
    return 1 / (io / measured.efficiency + gpu + overhead)


def cell(pc: PC, config: dict, quant: str) -> str:
    from engine.plan.estimate import estimate, model_shape
    est = estimate(config, 0, machine(pc), quant, suggest_int8_dense=True)
    est = est.int8_dense_tip or est
    if not est.is_usable:
        return "does not fit"
    tok_s = expected_tok_s(est, MEASURED.get(model_shape(config).family))
    speed = f"{tok_s:.1f}" if tok_s < 10 else f"{tok_s:.0f}"
    return f"{speed} tok/s" + (" (int8 dense)" if est.dense_quant else "")


def _efficiency_note(measured: Measured | None) -> str:
    if measured is None:
        return "none measured: the estimate alone"
    charged = (f"{measured.unexplained_s_per_layer * 1e3:.2f} ms a layer" if measured.limit == GPU
               else "reads and copies at that share of their bandwidth")
    return f"{measured.efficiency:.2f} ({measured.run}, {measured.tok_s:g} tok/s on an {measured.machine}): {charged}"


def table() -> str:
    """README's table, one row a model, one column a PC, the efficiency used and the run it comes from last."""
    from engine.plan.estimate import model_shape
    header = ["model (computed, not measured)", *(pc.label for pc in PCS), "measured efficiency used"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---|" * (len(PCS) + 1)]
    for name, quant, config in models():
        cells = [cell(pc, config, quant) for pc in PCS]
        note = _efficiency_note(MEASURED.get(model_shape(config).family))
        lines.append(f"| {name} {quant} | " + " | ".join(cells) + f" | {note} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    print(table(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
