"""Will this model run here, and how fast? Computed from config.json and the file list alone.

Decode speed is the roofline (docs/ARCHITECTURE.md), the same bound `sluice bench` and the telemetry use:

    tok/s = 1 / (disk_bytes / disk_bw + h2d_bytes / pcie_bw + compute_s)

per token, with N = moe_layers * top_k expert blocks needed and B = one block's bytes at the quant:
    h2d_bytes  = N * B * (1 - slot_hit)               blocks not already in a device slot
    disk_bytes = N * B * (1 - slot_hit) * (1 - ram_hit) of those, blocks not in the RAM cache
    compute_s  = gpu_read_s + layer_overhead_s
    gpu_read_s = (active dense params * compute dtype bytes + expert bytes read) / device_mem_bw
                 expert bytes read: on CUDA N * B (the kernels read the blocks as stored); on the CPU
                 N * expert params * 4 (each expert decoded to float32)
                 (int8 dense weights: one byte for each dense parameter they quantise)
    layer_overhead_s = layers * LAYER_OVERHEAD_S (+ GENERIC_EXTRA_S on a GPU for a family on the generic path)
The budgets are split exactly as the engine splits them (engine.runtime.budget.plan_budgets, with the
engine's defaults). Hit rates default to the cached fraction of all expert blocks: what an LRU
cache gets when routing is uniform (slots first, then the RAM cache holding a superset). Real
routing is skewed, so this errs on the slow side. On the CPU device the slots are RAM buffers and
"PCIe" is a host memcpy.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.errors import SluiceError
from engine.model.families import FAMILIES, family_module
from engine.model.param_counts import ModelShape, moe_shape
from engine.model.spec import read_spec
from engine.runtime.budget import MAX_CONTEXT_TOKENS
from kernels.quant_formats import FORMATS as QUANTS, QUANT_FORMATS
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
COMPUTE_DTYPE_BYTES = {"cuda": 2, "cpu": 4}      # the engine computes in bf16 on CUDA, float32 on the CPU
COMPUTE_DTYPE = {"cuda": "bfloat16", "cpu": "float32"}
FAST_TOK_S = 5.0                   # about reading speed: below this a chat feels slow
# Per layer per token: kernel launches, Python and small-op overhead that no byte count explains.
# CPU: engine.load on a 12-layer model whose experts all sat in slots. CUDA: OLMoE-1B-7B int8 with every
# expert in a slot decodes at 5.49 ms a token on an H200, 0.37 ms of it reading 1.6 GB of HBM: 320 us for
# each of its 16 layers (the layer's host sync, the decode thread's Python, launches).
LAYER_OVERHEAD_S = {"cuda": 320e-6, "cpu": 800e-6}
# The generic path on a GPU, a layer on top of the native path's (the measured difference; on the CPU the two paths
# run alike): replayed as CUDA graph segments where engine.model.generic.graphs.graph_blocker finds nothing in the
# way, else transformers' layers run eagerly, each paying its launches and host work.
GENERIC_EXTRA_S = {"graphs": 110e-6, "eager": 1.27e-3}
RAM_RESERVE_BYTES = 3 * 2**30      # the OS, the app and Python stay resident
# Hybrid execution: the rate at which the CPU computes RAM-resident int8 experts, as a share of the
# machine's memory bandwidth (an H200 box: 415 us for a 6.3 MB expert while decoding, DRAM 73 GB/s).
CPU_EXPERT_SHARE_OF_MEM_BW = 0.2


def model_shape(config: dict) -> ModelShape:
    """Parameter counts of a supported MoE config (matches transformers' num_parameters()): the family module's
    `param_counts` where it has one, else the common count (engine.model.param_counts)."""
    family = FAMILIES.get(config.get("model_type"))
    counts = getattr(family_module(family.model_type), "param_counts", None) if family else None
    return (counts or moe_shape)(config)


def format_params(n: int) -> str:
    """30532122624 -> '30.5B'."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def expert_block_bytes(shape: ModelShape, quant: str) -> int:
    """Bytes of one (layer, expert) block in experts.bin: the engine's own layout, 4096-aligned."""
    from engine.format.layout import FAMILIES_WITH_EXPERT_BIAS, block_layout
    return block_layout(shape.expert_intermediate, shape.hidden, quant,
                        bias=shape.family in FAMILIES_WITH_EXPERT_BIAS, gated=shape.has_expert_gate).block_bytes


def roofline_tok_s(disk_bytes: float, disk_bps: float, h2d_bytes: float, pcie_bps: float, compute_s: float) -> float:
    seconds = disk_bytes / max(disk_bps, 1.0) + h2d_bytes / max(pcie_bps, 1.0) + compute_s
    return 1.0 / seconds if seconds > 0 else float("inf")


@dataclass
class Machine:
    """What the estimate needs to know about the computer (see engine.plan.hardware.probe)."""
    device: str                    # "cpu" | "cuda"
    ram_available_bytes: int
    mem_bw_bps: float
    disk_read_bps: float
    free_disk_bytes: int
    vram_bytes: int = 0            # free VRAM
    pcie_bps: float | None = None
    gpu_mem_bw_bps: float | None = None

    @classmethod
    def from_hardware(cls, hw, free_disk_bytes: int, device: str | None = None) -> "Machine":
        device = device or ("cuda" if hw.has_gpu else "cpu")
        gpu = hw.gpus[0] if hw.gpus and device == "cuda" else None
        return cls(device, hw.ram_available_bytes, hw.mem_bw_bps, hw.disk_read_bps or 1e9, free_disk_bytes,
                   gpu.vram_free_bytes if gpu else 0, hw.pcie_bps, hw.gpu_mem_bw_bps)


@dataclass
class Estimate:
    quant: str
    shape: ModelShape
    block_bytes: int
    expert_bytes: int              # all routed experts at this quant
    repacked_bytes: int            # the Sluice model dir: dense + experts
    download_bytes: int
    disk_needed_bytes: int         # download (still missing) + repack
    vram_budget_bytes: int         # the engine's plan (on the CPU device: slot banks in RAM)
    ram_cache_bytes: int
    slot_hit: float
    ram_hit: float
    disk_bytes_per_token: float
    h2d_bytes_per_token: float
    compute_s: float
    tok_s: float
    verdict: str                   # "fits fast" | "fits but slow" | "will not run" | "unavailable"
    reason: str                    # one sentence for the user
    dense_quant: str | None = None  # "int8": the dense weights as int8 (engine.model.dense_quant)
    int8_dense_tip: "Estimate | None" = None   # the same with int8 dense weights, where they would help

    @property
    def is_usable(self) -> bool:
        """The model can be repacked at this quant and run here."""
        return self.verdict not in ("will not run", "unavailable")

    @property
    def bytes_per_token(self) -> float:
        """Bytes moved per token: from disk plus over PCIe (the disk bytes cross PCIe too)."""
        return self.disk_bytes_per_token + self.h2d_bytes_per_token

    @property
    def expert_bytes_per_token(self) -> int:
        """Expert bytes one token needs (moe_layers x top_k blocks), cached or not."""
        return self.shape.num_moe_layers * self.shape.top_k * self.block_bytes


def estimate(config: dict, download_bytes: int, machine: Machine, quant: str = "bf16",
             vram_budget: int | None = None, ram_cache: int | None = None,
             hit_rates: tuple[float, float] | None = None, missing_download_bytes: int | None = None,
             dense_quant: str | None = None, suggest_int8_dense: bool = False) -> Estimate:
    """Fit and speed of `config` at `quant` on `machine`; budgets None = the engine's defaults.
    dense_quant "int8": the dense weights loaded as int8, where the family has them (else as stored).
    suggest_int8_dense: with the dense weights as stored, also estimate them as int8 and keep that
    (`int8_dense_tip`) where it runs a model that would not, or runs it at least 10% faster."""
    if quant not in QUANTS:
        raise SluiceError(f"Unknown quant '{quant}': choose one of {', '.join(QUANTS)}.")
    shape = model_shape(config)
    from engine.model import dense_quant as dense_quant_
    dense_quant = dense_quant if dense_quant and dense_quant_.available(shape.family) else None
    try:
        block = expert_block_bytes(shape, quant)
    except SluiceError as exc:          # e.g. nvfp4 on widths not divisible by 16: the other quants still apply
        return unavailable(quant, shape, download_bytes, str(exc))
    num_blocks = shape.num_moe_layers * shape.num_experts
    expert_bytes = num_blocks * block
    source_elem = _source_elem(config)
    # dense tensors keep the source dtype; n-gram rows too (block-FP8 ones dequantised: bf16 at least)
    repacked = shape.dense_params * source_elem + expert_bytes + ngram_file_bytes(shape, max(source_elem, 2))
    disk_needed = (download_bytes if missing_download_bytes is None else missing_download_bytes) + repacked

    plan, problem = _plan_budgets(config, shape, quant, block, machine, vram_budget, ram_cache, dense_quant)
    slot_hit, ram_hit = hit_rates if hit_rates is not None else _uniform_hit_rates(plan, num_blocks, block)
    disk, h2d, compute_s, tok_s = _roofline(shape, block, machine, slot_hit, ram_hit, quant, dense_quant)

    verdict, reason = _verdict(machine, plan, problem, disk_needed, tok_s)
    if _is_generic(shape.family):                  # transformers' modules run its dense parts
        reason += f" Sluice runs {shape.family} on its {FAMILIES[shape.family].path} path."
    est = Estimate(quant, shape, block, expert_bytes, repacked, download_bytes, disk_needed,
                   plan.vram_budget_bytes if plan else 0, plan.ram_cache_bytes if plan else 0,
                   slot_hit, ram_hit, disk, h2d, compute_s, tok_s, verdict, reason, dense_quant)
    if suggest_int8_dense and not dense_quant and dense_quant_.available(shape.family):
        est.int8_dense_tip = _int8_dense_tip(est, lambda: estimate(
            config, download_bytes, machine, quant, vram_budget, ram_cache, hit_rates, missing_download_bytes,
            dense_quant="int8"))
    return est


def _is_generic(family: str) -> bool:
    return family in FAMILIES and FAMILIES[family].is_generic


def _int8_dense_tip(est: Estimate, with_int8_dense) -> Estimate | None:
    """The estimate with int8 dense weights, where it runs a model `est` cannot run, or runs it >= 10% faster."""
    tip = with_int8_dense()
    return tip if tip.is_usable and (not est.is_usable or tip.tok_s >= 1.1 * est.tok_s) else None


def ngram_file_bytes(shape: ModelShape, elem_bytes: int) -> int:
    """ngram.bin's size: rows laid out `row_stride` apart (engine.format.ngram)."""
    from engine.format.ngram import row_stride
    return shape.ngram_rows * row_stride(shape.ngram_row_dim * elem_bytes) if shape.ngram_rows else 0


def ngram_disk_bytes(shape: ModelShape) -> int:
    """What a token's n-gram rows cost from disk, uncached: a page each (engine.runtime.ngram reads by page)."""
    from engine.format.ngram import PAGE
    return shape.ngram_rows_per_token * PAGE


def ngram_table_bytes(shape: ModelShape) -> int:
    """The n-gram tables on disk (bf16 rows, each at its stride: engine.format.ngram), 0 for other models."""
    from engine.format.ngram import row_stride
    return shape.ngram_rows * row_stride(2 * shape.ngram_row_dim) if shape.ngram_rows else 0


def _source_elem(config: dict) -> int:
    """Bytes a weight of the checkpoint's dense tensors (2 where the config does not say)."""
    return DTYPE_BYTES.get(str(config.get("dtype") or config.get("torch_dtype")), 2)


def dense_bytes(shape: ModelShape, elem: int, dense_quant: str | None) -> int:
    """What the dense weights take once loaded: `elem` bytes a parameter, or for those int8 dense weights
    quantise (engine.model.dense_quant) one byte, plus a 2-byte scale per row of about `hidden` of them;
    an embedding table read from the file takes nothing."""
    loaded = shape.dense_params - (shape.embedding_params if shape.embedding_in_file else 0)
    if not dense_quant:
        return loaded * elem
    quantised = loaded - shape.exact_params
    return quantised + 2 * quantised // shape.hidden + shape.exact_params * elem


def _plan_budgets(config: dict, shape: ModelShape, quant: str, block: int, machine: Machine,
                  vram_budget: int | None, ram_cache: int | None, dense_quant: str | None = None):
    """The engine's own budget split (engine.runtime.budget) at its own default context; (plan, None), or
    (None, the sentence saying why the budgets cannot hold the model)."""
    import torch
    from engine.format.layout import block_layout
    from engine.runtime.budget import (CUDA_CONTEXT_BYTES, computes_in_place, default_budgets, default_context,
                                       in_place_defaults, plan_budgets, prefill_workspace_bytes)
    from engine.runtime.experts import decoded_expert_bytes
    on_gpu = machine.device == "cuda"
    elem = COMPUTE_DTYPE_BYTES[machine.device]
    dense = dense_bytes(shape, elem, dense_quant)
    available = machine.ram_available_bytes
    # the CPU device keeps each resident expert decoded to float32 beside its block (engine.runtime.experts)
    decoded = 0 if on_gpu else decoded_expert_bytes(block_layout(shape.expert_intermediate, shape.hidden, quant,
                                                                 gated=shape.has_expert_gate),
                                                    torch.float32)
    spec = read_spec(config)
    default_vram, default_ram = default_budgets(machine.device, machine.vram_bytes, available)
    compute_dtype = getattr(torch, COMPUTE_DTYPE[machine.device])
    context = default_context(spec, compute_dtype, machine.device, vram_budget or default_vram,
                              dense, block + decoded)             # the engine's own choice
    kv_bytes = _state_bytes(config, compute_dtype, context)
    workspace = prefill_workspace_bytes(spec, context, elem) + CUDA_CONTEXT_BYTES if on_gpu else 0

    if computes_in_place(machine.device, quant):
        default_vram, default_ram = in_place_defaults(default_vram, default_ram, dense + kv_bytes, block + decoded,
                                                      shape.top_k)

    def plan_for(ram_cache_bytes):
        return plan_budgets(block_bytes=block, top_k=shape.top_k, num_experts=shape.num_experts,
                            num_moe_layers=shape.num_moe_layers, dense_bytes=dense, kv_bytes=kv_bytes,
                            workspace_bytes=workspace, vram_budget=vram_budget, ram_cache=ram_cache_bytes,
                            default_vram=default_vram,
                            default_ram=default_ram, device_slot_bytes=block + decoded,
                            table_bytes=ngram_table_bytes(shape))
    try:
        plan = plan_for(ram_cache)
        in_ram = plan.ram_cache_bytes + (0 if on_gpu else plan.vram_budget_bytes)
        if ram_cache is None and in_ram > available - RAM_RESERVE_BYTES:
            # the engine's default cache would not fit beside the rest: assume the user sets a smaller one
            room = available - RAM_RESERVE_BYTES - (0 if on_gpu else plan.vram_budget_bytes)
            plan = plan_for(max(room, shape.top_k * block))
    except SluiceError as exc:
        return None, str(exc)
    return plan, None


def _roofline(shape: ModelShape, block: int, machine: Machine, slot_hit: float, ram_hit: float, quant: str = "fp8",
              dense_quant: str | None = None):
    """Bytes per token from disk and over PCIe at these hit rates, the compute seconds per token, and the
    decode speed they bound: (disk_bytes, h2d_bytes, compute_s, tok_s). With a format the CPU computes in
    place, hybrid execution splits the RAM-resident misses between PCIe and the CPU, both at once, where
    the CPU computes an expert faster than PCIe copies it (engine.runtime.placement.Placement.pays_off)."""
    on_gpu = machine.device == "cuda"
    needed = shape.num_moe_layers * shape.top_k * block                  # expert bytes one token touches
    h2d = needed * (1 - slot_hit)
    disk = h2d * (1 - ram_hit) + ngram_disk_bytes(shape)
    pcie_bps = machine.pcie_bps if on_gpu and machine.pcie_bps else machine.mem_bw_bps
    cpu_bps = CPU_EXPERT_SHARE_OF_MEM_BW * machine.mem_bw_bps
    if on_gpu and QUANT_FORMATS[quant].cpu_kernel and cpu_bps > pcie_bps:     # as "auto" decides: the CPU beats a copy
        pcie_bps += cpu_bps
    compute_bw = machine.gpu_mem_bw_bps if on_gpu and machine.gpu_mem_bw_bps else machine.mem_bw_bps
    elem = COMPUTE_DTYPE_BYTES[machine.device]
    # int8 dense weights: a decode step's kernel reads the codes, on a GPU and on the CPU (kernels/cpu_gemv.py)
    per_code = 1
    quantised = shape.dense_params - shape.exact_params if dense_quant else 0
    dense_read = (shape.dense_params - quantised) * elem + quantised * per_code \
        - shape.embedding_params * (per_code if dense_quant else elem)
    # one embedding row per token: not counted; a GPU's expert kernels read the blocks as stored
    expert_read = needed if on_gpu else (shape.active_params - shape.dense_params) * elem
    compute_s = (dense_read + expert_read) / compute_bw + layer_overhead_s(shape, machine.device)
    return disk, h2d, compute_s, roofline_tok_s(disk, machine.disk_read_bps, h2d, pcie_bps, compute_s)


def layer_overhead_s(shape: ModelShape, device: str) -> float:
    """A token's time no byte count explains: the family's path's overhead for each of its layers."""
    per_layer = LAYER_OVERHEAD_S[device]
    if device == "cuda" and _is_generic(shape.family):
        per_layer += GENERIC_EXTRA_S["graphs" if shape.generic_graphs else "eager"]
    return shape.num_layers * per_layer


def _uniform_hit_rates(plan, num_blocks: int, block: int) -> tuple[float, float]:
    """(slot hit, RAM hit of the slot misses) of LRU caches under uniform routing: the fraction of all
    expert blocks each tier holds (exclusive tiers: RAM holds what the slots do not)."""
    if not num_blocks:
        return 1.0, 1.0
    slot_capacity = 2 * plan.slots_per_bank if plan else 0
    ram_blocks = plan.ram_cache_bytes // block if plan else 0
    slot_hit = min(1.0, slot_capacity / num_blocks)
    if slot_hit >= 1:
        return 1.0, 1.0
    return slot_hit, min(1.0, ram_blocks / (num_blocks - slot_capacity))


def _state_bytes(config: dict, dtype, context: int | None = None) -> int:
    """The model state (KV cache, ...) the engine reserves: the family's own per-layer state for
    `context` tokens (default: the model's limit, at most the engine's MAX_CONTEXT_TOKENS)."""
    from engine.model.state import state_bytes
    spec = read_spec(config)
    context = context or min(spec.max_position_embeddings, MAX_CONTEXT_TOKENS)
    return state_bytes(family_module(spec.family).state_specs(spec), context, dtype)


def unavailable(quant: str, shape: ModelShape, download_bytes: int, reason: str) -> Estimate:
    """The estimate of a quant this model cannot be repacked to: no sizes, no speed, the reason."""
    return Estimate(quant, shape, 0, 0, 0, download_bytes, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                    "unavailable", reason)


def _verdict(machine: Machine, plan, problem: str | None, disk_needed: int, tok_s: float) -> tuple[str, str]:
    from engine.sizes import format_size
    if disk_needed > machine.free_disk_bytes:
        return "will not run", (f"It needs {format_size(disk_needed)} of disk for download and repack, "
                                f"but only {format_size(machine.free_disk_bytes)} is free.")
    if problem:
        return "will not run", problem
    if machine.device == "cuda" and plan.vram_budget_bytes > machine.vram_bytes:
        return "will not run", (f"It needs at least {format_size(plan.vram_budget_bytes)} of GPU memory "
                                f"(dense weights, KV cache, two expert banks); {format_size(machine.vram_bytes)} is free.")
    ram_needed = plan.ram_cache_bytes + (0 if machine.device == "cuda" else plan.vram_budget_bytes)
    if ram_needed > machine.ram_available_bytes - RAM_RESERVE_BYTES:
        return "will not run", (f"It needs at least {format_size(ram_needed)} of memory beyond what the system uses, "
                                f"and only {format_size(machine.ram_available_bytes)} is available.")
    if tok_s >= FAST_TOK_S:
        return "fits fast", f"About {tok_s:.1f} tokens per second: faster than you read."
    return "fits but slow", (f"About {tok_s:.2f} tokens per second: it runs, but answers will take a while "
                             "(a smaller quant or more RAM makes it faster).")


def estimate_model_dir(model_dir, machine: Machine, vram_budget: int | None = None, ram_cache: int | None = None,
                       hit_rates: tuple[float, float] | None = None, dense_quant: str | None = None) -> Estimate:
    """The prediction for an installed Sluice model dir (its config and quant from sluice.json): what the
    app shows beside the measured speed after a chat, with hit_rates from the engine's telemetry."""
    import json
    from pathlib import Path
    manifest = json.loads((Path(model_dir) / "sluice.json").read_text())
    return estimate(manifest["config"], 0, machine, manifest["quant"], vram_budget=vram_budget,
                    ram_cache=ram_cache, hit_rates=hit_rates, dense_quant=dense_quant)
