"""Will this model run here, and how fast? Computed from config.json and the file list alone.

Decode speed is the roofline of DESIGN.md, the same bound the engine's telemetry reports:

    tok/s = 1 / (disk_bytes / disk_bw + h2d_bytes / pcie_bw + compute_s)

per token, with N = moe_layers * top_k expert blocks needed and B = one block's bytes at the quant:
    h2d_bytes  = N * B * (1 - vram_hit)                 blocks not already in a device slot
    disk_bytes = N * B * (1 - vram_hit) * (1 - ram_hit) of those, blocks not in the RAM cache
    compute_s  = (dense_active_bytes + N * B) / device_mem_bw + layers * LAYER_OVERHEAD_S
Hit rates default to the cached fraction of all expert bytes (what an LRU cache gets when routing
is uniform; real routing is skewed, so this errs on the slow side). On the CPU device the "slots"
are RAM buffers, so pcie_bw is the host memcpy bandwidth and vram_hit is 0.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import SluiceError

QUANTS = ("bf16", "fp8", "nvfp4")
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}   # dense tensors keep the checkpoint's dtype
FAST_TOK_S = 5.0                   # about reading speed: below this a chat feels slow
LAYER_OVERHEAD_S = {"cuda": 60e-6, "cpu": 150e-6}   # launches + Python per layer per token, measured order
VRAM_RESERVE_BYTES = 512 * 2**20   # KV cache, activations, CUDA context slack
RAM_RESERVE_BYTES = 3 * 2**30      # the OS, the app and Python stay resident
MIN_CACHE_BLOCKS_PER_LAYER = 2     # a layer's top-k must fit twice (two banks) for the pipeline to move


@dataclass
class ModelShape:
    family: str
    num_layers: int
    num_moe_layers: int
    num_experts: int
    top_k: int
    hidden: int
    expert_intermediate: int
    vocab: int
    total_params: int
    active_params: int
    dense_params: int              # everything but routed experts (embeddings included)
    embedding_params: int          # read one row per token, so not counted as moved bytes

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden * self.expert_intermediate


def model_shape(config: dict) -> ModelShape:
    """Parameter counts of a supported MoE config (matches transformers' num_parameters())."""
    family = config.get("model_type", "?")
    try:
        H, L, V = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
        nh = config["num_attention_heads"]
        nkv = config.get("num_key_value_heads") or nh
        hd = config.get("head_dim") or H // nh
        E = next(config[k] for k in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
                 if config.get(k))
        k = config["num_experts_per_tok"]
    except (KeyError, StopIteration, TypeError) as exc:
        raise SluiceError(f"This {family} config.json lacks the MoE sizes Sluice needs ({exc}); the repo may be broken.") from exc
    I_dense = config.get("intermediate_size") or 0
    I_expert = config.get("moe_intermediate_size") or I_dense
    attn = H * nh * hd + 2 * H * nkv * hd + nh * hd * H
    if family == "qwen2_moe" or config.get("qkv_bias") or config.get("attention_bias"):
        attn += nh * hd + 2 * nkv * hd
    if family == "qwen3_moe":
        attn += 2 * hd                                  # per-head q_norm, k_norm
    elif family == "olmoe":
        attn += nh * hd + nkv * hd                      # q_norm, k_norm over the whole projection
    moe_layer_ids = _moe_layers(config, L, E)
    shared = 0
    if config.get("shared_expert_intermediate_size"):
        shared = 3 * H * config["shared_expert_intermediate_size"] + H   # shared expert + its sigmoid gate
    per_layer = attn + 2 * H
    dense_params = L * per_layer + H + (L - len(moe_layer_ids)) * 3 * H * I_dense
    dense_params += len(moe_layer_ids) * (E * H + shared)                # routers, shared experts
    embedding = V * H
    dense_params += embedding + (0 if config.get("tie_word_embeddings") else V * H)
    expert = 3 * H * I_expert
    total = dense_params + len(moe_layer_ids) * E * expert
    active = dense_params + len(moe_layer_ids) * k * expert
    return ModelShape(family, L, len(moe_layer_ids), E, k, H, I_expert, V, total, active, dense_params, embedding)


def _moe_layers(config: dict, num_layers: int, num_experts: int) -> list[int]:
    skip = set(config.get("mlp_only_layers") or [])
    step = config.get("decoder_sparse_step") or 1
    first_dense = config.get("first_k_dense_replace") or 0
    return [i for i in range(num_layers)
            if num_experts > 0 and i not in skip and (i + 1) % step == 0 and i >= first_dense]


def expert_block_bytes(shape: ModelShape, quant: str) -> int:
    """Bytes of one (layer, expert) block in experts.bin: the engine's own layout, 4096-aligned."""
    from .layout import block_layout
    return block_layout(shape.expert_intermediate, shape.hidden, quant).block_bytes


def roofline_tok_s(disk_bytes: float, disk_bps: float, h2d_bytes: float, pcie_bps: float, compute_s: float) -> float:
    seconds = disk_bytes / max(disk_bps, 1.0) + h2d_bytes / max(pcie_bps, 1.0) + compute_s
    return 1.0 / seconds if seconds > 0 else float("inf")


@dataclass
class Machine:
    """What the estimate needs to know about the computer (see engine.hardware.probe)."""
    device: str                    # "cpu" | "cuda"
    ram_available_bytes: int
    mem_bw_bps: float
    disk_read_bps: float
    free_disk_bytes: int
    vram_bytes: int = 0
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
    vram_budget_bytes: int
    ram_cache_bytes: int
    vram_hit: float
    ram_hit: float
    disk_bytes_per_token: float
    h2d_bytes_per_token: float
    compute_s: float
    tok_s: float
    verdict: str                   # "fits fast" | "fits but slow" | "will not run"
    reason: str                    # one sentence for the user

    @property
    def bytes_per_token(self) -> float:
        """Bytes moved per token: from disk plus over PCIe (the disk bytes cross PCIe too)."""
        return self.disk_bytes_per_token + self.h2d_bytes_per_token


def estimate(config: dict, download_bytes: int, machine: Machine, quant: str = "bf16",
             vram_budget: int | None = None, ram_cache: int | None = None,
             hit_rates: tuple[float, float] | None = None, missing_download_bytes: int | None = None) -> Estimate:
    if quant not in QUANTS:
        raise SluiceError(f"Unknown quant '{quant}': choose one of {', '.join(QUANTS)}.")
    shape = model_shape(config)
    block = expert_block_bytes(shape, quant)
    num_blocks = shape.num_moe_layers * shape.num_experts
    expert_bytes = num_blocks * block
    dense_bytes_per_param = DTYPE_BYTES.get(str(config.get("dtype") or config.get("torch_dtype")), 2)
    dense_bytes = shape.dense_params * dense_bytes_per_param
    repacked = dense_bytes + expert_bytes
    missing = download_bytes if missing_download_bytes is None else missing_download_bytes
    disk_needed = missing + repacked
    min_cache = shape.num_moe_layers and MIN_CACHE_BLOCKS_PER_LAYER * shape.top_k * block

    on_gpu = machine.device == "cuda"
    if vram_budget is None:
        vram_budget = max(0, machine.vram_bytes - VRAM_RESERVE_BYTES) if on_gpu else 0
    ram_for_cache = machine.ram_available_bytes - RAM_RESERVE_BYTES - (0 if on_gpu else dense_bytes)
    if ram_cache is None:
        ram_cache = max(0, min(int(0.8 * ram_for_cache), expert_bytes))
    slot_bytes = max(0, vram_budget - dense_bytes) if on_gpu else 0
    if hit_rates is None:
        vram_hit = min(1.0, slot_bytes / expert_bytes) if expert_bytes else 1.0
        ram_hit = min(1.0, ram_cache / expert_bytes) if expert_bytes else 1.0
    else:
        vram_hit, ram_hit = hit_rates

    needed = shape.num_moe_layers * shape.top_k * block                  # expert bytes one token touches
    h2d = needed * (1 - vram_hit)
    disk = h2d * (1 - ram_hit)
    pcie_bps = machine.pcie_bps if on_gpu and machine.pcie_bps else machine.mem_bw_bps
    compute_bw = machine.gpu_mem_bw_bps if on_gpu and machine.gpu_mem_bw_bps else machine.mem_bw_bps
    dense_active = (shape.dense_params - shape.embedding_params) * dense_bytes_per_param
    compute_s = (dense_active + needed) / compute_bw + shape.num_layers * LAYER_OVERHEAD_S[machine.device]
    tok_s = roofline_tok_s(disk, machine.disk_read_bps, h2d, pcie_bps, compute_s)

    verdict, reason = _verdict(machine, dense_bytes, vram_budget, ram_cache, min_cache, disk_needed, tok_s)
    return Estimate(quant, shape, block, expert_bytes, repacked, download_bytes, disk_needed, vram_budget, ram_cache,
                    vram_hit, ram_hit, disk, h2d, compute_s, tok_s, verdict, reason)


def _verdict(machine: Machine, dense_bytes: int, vram_budget: int, ram_cache: int, min_cache: int,
             disk_needed: int, tok_s: float) -> tuple[str, str]:
    from .sizes import format_size
    if disk_needed > machine.free_disk_bytes:
        return "will not run", (f"It needs {format_size(disk_needed)} of disk for download and repack, "
                                f"but only {format_size(machine.free_disk_bytes)} is free.")
    if machine.device == "cuda" and dense_bytes + min_cache > vram_budget:
        return "will not run", (f"Its dense part ({format_size(dense_bytes)}) and two expert banks do not fit in "
                                f"{format_size(vram_budget)} of GPU memory.")
    ram_needed = min_cache + (0 if machine.device == "cuda" else dense_bytes)
    if ram_needed > machine.ram_available_bytes - RAM_RESERVE_BYTES or ram_cache < min_cache:
        return "will not run", (f"It needs at least {format_size(ram_needed)} of free memory beyond what the "
                                f"system uses, and only {format_size(machine.ram_available_bytes)} is available.")
    if tok_s >= FAST_TOK_S:
        return "fits fast", f"About {tok_s:.1f} tokens per second: faster than you read."
    return "fits but slow", (f"About {tok_s:.2f} tokens per second: it runs, but answers will take a while "
                             "(a smaller quant or more RAM makes it faster).")
