"""Will this model run here, and how fast? Computed from config.json and the file list alone.

Decode speed is the roofline (docs/ARCHITECTURE.md), the same bound `sluice bench` and the telemetry use:

    tok/s = 1 / (disk_bytes / disk_bw + h2d_bytes / pcie_bw + compute_s)

per token, with N = moe_layers * top_k expert blocks needed and B = one block's bytes at the quant:
    h2d_bytes  = N * B * (1 - slot_hit)               blocks not already in a device slot
    disk_bytes = N * B * (1 - slot_hit) * (1 - ram_hit) of those, blocks not in the RAM cache
    compute_s  = (active dense params + N * expert params) * compute dtype bytes / device_mem_bw
                 + layers * LAYER_OVERHEAD_S
                 (int8 dense weights: one byte for each dense parameter they quantise)
The budgets are split exactly as the engine splits them (engine.runtime.budget.plan_budgets, with the
engine's defaults). Hit rates default to the cached fraction of all expert blocks: what an LRU
cache gets when routing is uniform (slots first, then the RAM cache holding a superset). Real
routing is skewed, so this errs on the slow side. On the CPU device the slots are RAM buffers and
"PCIe" is a host memcpy.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.errors import SluiceError
from engine.model.spec import read_spec
from engine.runtime.budget import MAX_CONTEXT_TOKENS
from kernels.quant_formats import FORMATS as QUANTS, QUANT_FORMATS
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
COMPUTE_DTYPE_BYTES = {"cuda": 2, "cpu": 4}      # the engine computes in bf16 on CUDA, float32 on the CPU
COMPUTE_DTYPE = {"cuda": "bfloat16", "cpu": "float32"}
FAST_TOK_S = 5.0                   # about reading speed: below this a chat feels slow
# Per layer per token: kernel launches, Python and small-op overhead that no byte count explains.
# CPU value measured with engine.load on a 12-layer model whose experts all sat in slots (see the
# setup README notes). CUDA value: OLMoE-1B-7B int8 with every expert in a slot decoded at 5.49 ms a
# token on the H200 box (BENCHMARKS run 31), 0.37 ms of it reading 1.6 GB of HBM: 320 us for each of
# its 16 layers (the layer's host sync, the decode thread's Python, launches). A desktop's faster
# cores take less; 60 us, the figure used before, came from a loop without the host sync.
LAYER_OVERHEAD_S = {"cuda": 320e-6, "cpu": 800e-6}
RAM_RESERVE_BYTES = 3 * 2**30      # the OS, the app and Python stay resident
# Hybrid execution: the rate at which the CPU computes RAM-resident int8 experts, as a share of the
# machine's memory bandwidth (H200 box: 415 us for a 6.3 MB expert while decoding, DRAM 73 GB/s; BENCHMARKS run 22).
CPU_EXPERT_SHARE_OF_MEM_BW = 0.2


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
    exact_params: int = 0          # dense params int8 dense weights leave in the compute dtype (routers, norms, biases, ...)
    embedding_in_file: bool = False  # the table is read from the model's file, not loaded (engine.model.file_table)
    ngram_disk_bytes: int = 0      # n-gram rows one token reads from disk, uncached (qwen4_exp: engine.runtime.ngram)

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden * self.expert_intermediate


def model_shape(config: dict) -> ModelShape:
    """Parameter counts of a supported MoE config (matches transformers' num_parameters())."""
    family = config.get("model_type", "?")
    if family == "deepseek_v4":
        return _deepseek_v4_shape(config)
    if isinstance(config.get("text_config"), dict):       # a vision-language checkpoint: its text model only
        config = {**config, **config["text_config"], "model_type": family}
    if family in ("qwen4_exp", "qwen4_exp_text"):
        return _qwen4_shape(config)
    from engine.model.families import FAMILIES
    if family in FAMILIES and FAMILIES[family].is_generic:
        return _generic_shape(config)
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
    expert = 3 * H * I_expert
    router = E * H
    if family == "gpt_oss":                             # o_proj bias, sinks; router and expert biases
        attn += H + nh
        router += E
        expert += 2 * I_expert + H
    moe_layer_ids = _moe_layers(config, L, E)
    shared = 0
    if config.get("shared_expert_intermediate_size"):
        shared = 3 * H * config["shared_expert_intermediate_size"] + H   # shared expert + its sigmoid gate
    exact = len(moe_layer_ids) * router + L * 2 * H + H          # routers, norms
    if shared:
        exact += len(moe_layer_ids) * H                          # the shared expert's sigmoid gate
    if family == "gpt_oss":
        exact += L * (nh * hd + 2 * nkv * hd + H + nh)           # q/k/v/o biases, sinks
    if family in DEEPSEEK_STYLE:
        attn, shared, I_expert = _deepseek_style_sizes(config, attn, E)
        if family in MLA_FAMILIES:              # kv_b_proj stays exact (engine.model.families.deepseek_style)
            exact += L * config["kv_lora_rank"] * config["num_attention_heads"] * (config["qk_nope_head_dim"] + config["v_head_dim"])
    mixers = L * attn
    if family in HYBRID_FAMILIES:
        mixers = _hybrid_mixer_params(config, attn + nh * hd * H + 2 * hd)  # q_proj doubled (output gate), q/k norm
        exact += _hybrid_exact_params(config, 2 * hd)
    dense_params = mixers + L * 2 * H + H + (L - len(moe_layer_ids)) * 3 * H * I_dense
    dense_params += len(moe_layer_ids) * (router + shared)               # routers, shared experts
    embedding = V * H
    dense_params += embedding + (0 if config.get("tie_word_embeddings") else V * H)
    total = dense_params + len(moe_layer_ids) * E * expert
    active = dense_params + len(moe_layer_ids) * k * expert
    from engine.model.file_table import table_in_file
    return ModelShape(family, L, len(moe_layer_ids), E, k, H, I_expert, V, total, active, dense_params, embedding, exact,
                      table_in_file(family, tied=bool(config.get("tie_word_embeddings"))))


def _qwen4_shape(config: dict) -> ModelShape:
    """qwen4_exp: its counts (engine.model.qwen4.sizes); the n-gram tables stay on disk, a few rows a token."""
    from engine.model.qwen4.sizes import qwen4_counts
    c = qwen4_counts(config)
    L, E, k, H, V = (config[n] for n in ("num_hidden_layers", "num_experts", "num_experts_per_tok", "hidden_size",
                                         "vocab_size"))
    return ModelShape(config["model_type"], L, L, E, k, H, config["moe_intermediate_size"], V,
                      c.dense + L * E * c.experts + c.table_params, c.dense + L * k * c.experts, c.dense, V * H,
                      c.exact, ngram_disk_bytes=c.rows_per_token * c.row_disk_bytes)


def _generic_shape(config: dict) -> ModelShape:
    """A family run generically (engine.model.generic): its counts from transformers' model on the meta device."""
    from engine.model.generic.scan import parameter_counts
    spec = read_spec(config)
    total, experts, embedding = parameter_counts(spec.cfg)
    dense = total - experts
    expert = 3 * spec.hidden_size * spec.expert_intermediate
    return ModelShape(spec.family, spec.num_layers, len(spec.moe_layers), spec.num_experts, spec.top_k,
                      spec.hidden_size, spec.expert_intermediate, spec.vocab_size, total,
                      dense + len(spec.moe_layers) * spec.top_k * expert, dense, embedding)


# ---- Gated-DeltaNet hybrids (qwen3_next, qwen3_5_moe): DeltaNet layers between gated attention layers
HYBRID_FAMILIES = ("qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text")


def _layer_types(config: dict) -> list[str]:
    L = config["num_hidden_layers"]
    interval = config.get("full_attention_interval") or 4
    return config.get("layer_types") or ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                         for i in range(L)]


def _deltanet_dims(config: dict) -> tuple[int, int, int]:
    """(key width, value width, value heads) of a DeltaNet layer."""
    nv = config.get("linear_num_value_heads", 32)
    return (config.get("linear_num_key_heads", 16) * config.get("linear_key_head_dim", 128),
            nv * config.get("linear_value_head_dim", 128), nv)


def _hybrid_mixer_params(config: dict, full_attention: int) -> int:
    H, kernel = config["hidden_size"], config.get("linear_conv_kernel_dim", 4)
    key, value, nv = _deltanet_dims(config)
    deltanet = (H * (2 * key + 2 * value + 2 * nv)           # in_proj q, k, v, z, b, a
                + (2 * key + value) * kernel + 2 * nv        # conv1d, A_log, dt_bias
                + value // nv + value * H)                   # gated norm, out_proj
    types = _layer_types(config)
    return sum(full_attention if t == "full_attention" else deltanet for t in types)


def _hybrid_exact_params(config: dict, full_attention: int) -> int:
    """What int8 dense weights leave exact in the mixers (engine.model.families.hybrid.DENSE_INT8): the
    DeltaNet's b/a projections, conv, A_log, dt_bias and gated norm; the attention's q/k norms."""
    H, kernel = config["hidden_size"], config.get("linear_conv_kernel_dim", 4)
    key, value, nv = _deltanet_dims(config)
    deltanet = 2 * H * nv + (2 * key + value) * kernel + 2 * nv + value // nv
    return sum(full_attention if t == "full_attention" else deltanet for t in _layer_types(config))


# DeepSeek-style families (engine.model.families.deepseek_style): MLA, shared experts without a gate,
# a correction bias per router, leading dense layers (first_k_dense_replace, mlp_layer_types)
DEEPSEEK_STYLE = ("deepseek_v2", "deepseek_v3", "glm4_moe", "glm4_moe_lite", "minimax_m2")
MLA_FAMILIES = ("deepseek_v2", "deepseek_v3", "glm4_moe_lite")


def _deepseek_style_sizes(config: dict, gqa_attn: int, num_experts: int) -> tuple[int, int, int]:
    """(attention params per layer, shared expert + router bias params per MoE layer, expert intermediate)."""
    H, nh = config["hidden_size"], config["num_attention_heads"]
    family = config["model_type"]
    if family in MLA_FAMILIES:
        r, dr = config["kv_lora_rank"], config["qk_rope_head_dim"]
        qk, v = config["qk_nope_head_dim"] + dr, config["v_head_dim"]
        q_lora = config.get("q_lora_rank")
        attn = (H * q_lora + q_lora + q_lora * nh * qk) if q_lora else H * nh * qk
        attn += H * (r + dr) + r + r * nh * (config["qk_nope_head_dim"] + v) + nh * v * H
    else:
        hd = config.get("head_dim") or H // nh
        nkv = config.get("num_key_value_heads") or nh
        attn = gqa_attn + (2 * hd if config.get("use_qk_norm") else 0) + (nh * hd + nkv * hd if family == "minimax_m2" else 0)
    if family == "minimax_m2":
        return attn, num_experts, config["intermediate_size"]
    shared = 3 * H * config["moe_intermediate_size"] * (config.get("n_shared_experts") or 0)
    bias = 0 if family == "deepseek_v2" else num_experts                 # V2 routes without a correction bias
    return attn, shared + bias, config["moe_intermediate_size"]


def _deepseek_v4_shape(config: dict) -> ModelShape:
    from engine.model.dsv4.params import int8_dense_params, model_dense_params
    from engine.model.spec import hf_config
    cfg = hf_config(config)
    H, L, E, k, I = cfg.hidden_size, cfg.num_hidden_layers, cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size
    dense, expert = model_dense_params(cfg), 3 * H * I
    return ModelShape("deepseek_v4", L, L, E, k, H, I, cfg.vocab_size, dense + L * E * expert, dense + L * k * expert,
                      dense, cfg.vocab_size * H, dense - int8_dense_params(cfg))


def format_params(n: int) -> str:
    """30532122624 -> '30.5B'."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def _moe_layers(config: dict, num_layers: int, num_experts: int) -> list[int]:
    skip = set(config.get("mlp_only_layers") or [])
    step = config.get("decoder_sparse_step") or 1
    first_dense = config.get("first_k_dense_replace") or 0
    types = config.get("mlp_layer_types") or ["sparse"] * num_layers        # glm4_moe_lite
    return [i for i in range(num_layers)
            if num_experts > 0 and i not in skip and (i + 1) % step == 0 and i >= first_dense and types[i] == "sparse"]


def expert_block_bytes(shape: ModelShape, quant: str) -> int:
    """Bytes of one (layer, expert) block in experts.bin: the engine's own layout, 4096-aligned."""
    from engine.format.layout import FAMILIES_WITH_EXPERT_BIAS, block_layout
    return block_layout(shape.expert_intermediate, shape.hidden, quant,
                        bias=shape.family in FAMILIES_WITH_EXPERT_BIAS).block_bytes


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
    suggest_int8_dense: on a GPU with the dense weights as stored, also estimate them as int8 and keep that
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
    source_elem = DTYPE_BYTES.get(str(config.get("dtype") or config.get("torch_dtype")), 2)
    repacked = shape.dense_params * source_elem + expert_bytes        # dense tensors keep the source dtype
    missing = download_bytes if missing_download_bytes is None else missing_download_bytes
    disk_needed = missing + repacked

    plan, problem = _plan_budgets(config, shape, quant, block, machine, vram_budget, ram_cache, dense_quant)
    slot_hit, ram_hit = hit_rates if hit_rates is not None else _uniform_hit_rates(plan, num_blocks, block)
    disk, h2d, compute_s, tok_s = _roofline(shape, block, machine, slot_hit, ram_hit, quant, dense_quant)

    verdict, reason = _verdict(machine, plan, problem, disk_needed, tok_s)
    from engine.model.families import FAMILIES
    if shape.family in FAMILIES and FAMILIES[shape.family].is_generic:     # transformers' modules run its dense parts
        reason += f" Sluice runs {shape.family} on its {FAMILIES[shape.family].path} path."
    est = Estimate(quant, shape, block, expert_bytes, repacked, download_bytes, disk_needed,
                   plan.vram_budget_bytes if plan else 0, plan.ram_cache_bytes if plan else 0,
                   slot_hit, ram_hit, disk, h2d, compute_s, tok_s, verdict, reason, dense_quant)
    if suggest_int8_dense and machine.device == "cuda" and not dense_quant and dense_quant_.available(shape.family):
        tip = estimate(config, download_bytes, machine, quant, vram_budget, ram_cache, hit_rates,
                       missing_download_bytes, dense_quant="int8")
        if tip.is_usable and (not est.is_usable or tip.tok_s >= 1.1 * est.tok_s):
            est.int8_dense_tip = tip
    return est


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
    decoded = 0 if on_gpu else decoded_expert_bytes(block_layout(shape.expert_intermediate, shape.hidden, quant),
                                                    torch.float32)
    spec = read_spec(config)
    default_vram, default_ram = default_budgets(machine.device, machine.vram_bytes, available)
    compute_dtype = getattr(torch, COMPUTE_DTYPE[machine.device])
    context = default_context(spec, compute_dtype, machine.device, vram_budget or default_vram,
                              dense, block + decoded)             # the engine's own choice
    kv_bytes = _state_bytes(config, compute_dtype, context)
    workspace = prefill_workspace_bytes(spec, context, elem) + CUDA_CONTEXT_BYTES if on_gpu else 0

    if computes_in_place(machine.device, quant):
        default_vram, default_ram = in_place_defaults(default_vram, default_ram, dense + kv_bytes, block + decoded)

    def plan_for(ram_cache_bytes):
        return plan_budgets(block_bytes=block, top_k=shape.top_k, num_experts=shape.num_experts,
                            num_moe_layers=shape.num_moe_layers, dense_bytes=dense, kv_bytes=kv_bytes,
                            workspace_bytes=workspace, vram_budget=vram_budget, ram_cache=ram_cache_bytes,
                            default_vram=default_vram,
                            default_ram=default_ram, device_slot_bytes=block + decoded)
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
    disk = h2d * (1 - ram_hit) + shape.ngram_disk_bytes
    pcie_bps = machine.pcie_bps if on_gpu and machine.pcie_bps else machine.mem_bw_bps
    cpu_bps = CPU_EXPERT_SHARE_OF_MEM_BW * machine.mem_bw_bps
    if on_gpu and QUANT_FORMATS[quant].cpu_kernel and cpu_bps > pcie_bps:     # as "auto" decides: the CPU beats a copy
        pcie_bps += cpu_bps
    compute_bw = machine.gpu_mem_bw_bps if on_gpu and machine.gpu_mem_bw_bps else machine.mem_bw_bps
    elem = COMPUTE_DTYPE_BYTES[machine.device]
    # int8 dense weights: a GPU kernel reads the codes; the CPU's slabbed reference also writes and reads a
    # float copy of each weight, every token (decode measured at half the speed: scripts/probe_dense_cpu.py)
    per_code = 1 if on_gpu else 1 + 2 * elem
    quantised = shape.dense_params - shape.exact_params if dense_quant else 0
    dense_read = (shape.dense_params - quantised) * elem + quantised * per_code \
        - shape.embedding_params * (per_code if dense_quant else elem)
    expert_read = (shape.active_params - shape.dense_params) * elem      # one embedding row per token: not counted
    compute_s = (dense_read + expert_read) / compute_bw + shape.num_layers * LAYER_OVERHEAD_S[machine.device]
    return disk, h2d, compute_s, roofline_tok_s(disk, machine.disk_read_bps, h2d, pcie_bps, compute_s)


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
    from engine.model.families import family_module
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
