"""How the VRAM budget and RAM cache are split, and the minimum each needs.

VRAM budget = dense weights + KV cache + two slot banks (+ workspace, CUDA graphs and the driver's
CUDA context on CUDA: the budget is what the driver shows). A bank must hold at least one token's
active experts (top_k) for a layer; the RAM cache at least one block.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.errors import SluiceError
from engine.sizes import format_size
from kernels.quant_formats import QUANT_FORMATS

# The longest context a model gets by default (the user may ask for up to the model's own limit): on
# CUDA the state is static at full size, and a decode step attends over the whole buffer.
MAX_CONTEXT_TOKENS = 16384
# The driver's CUDA context (kernel modules, library handles) before the runner measures it through
# NVML: about what a data-centre GPU shows. The default context and the estimate plan with it.
CUDA_CONTEXT_BYTES = 850 * 10**6


def default_budgets(device_type: str, free_vram_bytes: int, available_ram_bytes: int) -> tuple[int, int]:
    """(VRAM budget, RAM cache) a model gets unless the user sets them; the engine and the estimate both ask.
    CUDA: 90% of the free VRAM (the rest for the allocator's fragments and other processes). The CPU device's
    slot banks live in RAM: a quarter of the available memory, and the RAM cache half of it."""
    vram = free_vram_bytes * 9 // 10 if device_type == "cuda" else available_ram_bytes // 4
    return vram, available_ram_bytes // 2


@dataclass(frozen=True)
class Plan:
    vram_budget_bytes: int
    dense_bytes: int
    kv_bytes: int
    workspace_bytes: int
    slots_per_bank: int
    ram_cache_bytes: int
    block_bytes: int
    device_slot_bytes: int       # one device slot: a block, plus (CPU device) its weights decoded for compute

    @property
    def slot_bytes(self) -> int:
        return 2 * self.slots_per_bank * self.device_slot_bytes


def plan_budgets(*, block_bytes: int, top_k: int, num_experts: int, num_moe_layers: int, dense_bytes: int,
                 kv_bytes: int, workspace_bytes: int, vram_budget: int | None, ram_cache: int | None,
                 default_vram: int, default_ram: int, device_slot_bytes: int | None = None,
                 table_bytes: int = 0) -> Plan:
    """table_bytes: a PLE model's n-gram tables, which share the RAM cache's budget (engine.runtime.ngram): the
    default budget holds them beside every expert block where RAM allows."""
    slot = device_slot_bytes or block_bytes
    fixed = dense_bytes + kv_bytes + workspace_bytes
    min_vram = fixed + 2 * top_k * slot
    all_slots = (num_moe_layers + 1) // 2 * num_experts      # one bank can never need more than its layers' experts
    if vram_budget is None:
        vram_budget = max(min_vram, min(default_vram, fixed + 2 * all_slots * slot))
    if vram_budget < min_vram:
        raise SluiceError(
            f"The VRAM budget of {format_size(vram_budget)} is too small for this model: it needs at least "
            f"{format_size(min_vram)} ({min_vram} bytes: dense weights {format_size(dense_bytes)}, KV cache "
            f"{format_size(kv_bytes)}, workspace, graphs and the GPU driver's context {format_size(workspace_bytes)}, "
            f"two banks of {top_k} expert slots); raise the VRAM budget (--vram-budget, or Settings in the app) to at least that.")
    slots_per_bank = min((vram_budget - fixed) // (2 * slot), all_slots)
    min_ram = top_k * block_bytes
    if ram_cache is None:
        ram_cache = max(min_ram, min(default_ram, num_moe_layers * num_experts * block_bytes + table_bytes))
    if ram_cache < min_ram:
        raise SluiceError(
            f"The RAM cache of {format_size(ram_cache)} is too small for this model: it needs at least "
            f"{format_size(min_ram)} ({min_ram} bytes, one token's {top_k} experts); raise the RAM cache (--ram-cache, or Settings in the app) to at least that.")
    return Plan(vram_budget, dense_bytes, kv_bytes, workspace_bytes, slots_per_bank, ram_cache, block_bytes, slot)


def computes_in_place(device_type: str, fmt: str, cpu_experts: str = "auto") -> bool:
    """Whether the CPU device computes the model's experts where they sit in RAM: int8 blocks, unless hybrid
    execution is off. A slot costs a copy, a float copy of the expert and a matmul over 4x the bytes, in place
    the matmul alone (decode more than twice as fast). A disk miss is read into RAM and computed there too
    (experts.py), so no expert is ever copied into a slot. bf16 blocks would need a float copy each
    (QuantFormat.cpu_in_place)."""
    return device_type != "cuda" and QUANT_FORMATS[fmt].cpu_in_place and cpu_experts in ("auto", "all")


def in_place_defaults(default_vram: int, default_ram: int, fixed_bytes: int, device_slot_bytes: int,
                      top_k: int) -> tuple[int, int]:
    """(default VRAM budget, default RAM cache) on the CPU device when its experts are computed where they sit
    in RAM (int8): the slot tier serves nothing then, so it keeps the fewest slots a plan allows (two banks of
    top_k), and the memory it would have taken goes to the RAM cache, which holds 4-5x the experts in the same
    bytes."""
    small = fixed_bytes + 2 * top_k * device_slot_bytes
    if small >= default_vram:
        return default_vram, default_ram
    return small, default_ram + default_vram - small


def prefill_workspace_bytes(spec, prompt_tokens: int, dtype_bytes: int, device_type: str = "cuda") -> int:
    """Transient device memory of a whole-prompt prefill: attention (fused on CUDA: the [T, S] mask;
    else fp32 scores + probs), activations, one dequantised expert, logits. An upper estimate; the
    CUDA runtime adds the graph memory it measured and reports the measured peak."""
    t = prompt_tokens
    scores = t * t if device_type == "cuda" else spec.num_heads * t * t * (4 + dtype_bytes + 4)
    acts = t * (spec.hidden_size * 12 + spec.num_heads * spec.head_dim * 4) * 4
    expert = prefill_expert_bytes(spec.expert_intermediate, spec.hidden_size, t)
    return scores + acts + expert + spec.vocab_size * 8 + (64 << 20)


def prefill_expert_bytes(intermediate: int, hidden: int, prompt_tokens: int) -> int:
    """The prefill workspace's share for the routed experts: the torch path's one dequantised expert
    (float32 at most) and its [T, I] activations; the prefill kernel, which dequantises nothing, cuts its
    launches so that its routing and intermediate fit in the same bytes."""
    return 3 * intermediate * hidden * 4 + prompt_tokens * intermediate * 3 * 4


KV_SHARE = 0.5     # the context may take at most this share of the VRAM left after dense weights and minimal slots
MIN_CONTEXT_TOKENS = 512     # below this a chat is not usable: plan_budgets then reports the budget as too small


def fit_context(*, max_tokens: int, bytes_for_tokens, vram_budget: int, dense_bytes: int, top_k: int,
                device_slot_bytes: int) -> int:
    """The longest context (<= max_tokens, the model's own limit) whose KV cache (and prefill workspace,
    `bytes_for_tokens(n)`, growing with n) takes at most KV_SHARE of the VRAM budget left after the dense
    weights and one token's expert slots: the rest stays for expert slots. At least MIN_CONTEXT_TOKENS
    (or the model's limit); a budget too small for that is reported by plan_budgets."""
    room = int(KV_SHARE * (vram_budget - dense_bytes - 2 * top_k * device_slot_bytes))
    low, high = min(MIN_CONTEXT_TOKENS, max_tokens), max(1, max_tokens)
    while low < high:                               # the largest n with bytes_for_tokens(n) <= room
        middle = (low + high + 1) // 2
        if bytes_for_tokens(middle) <= room:
            low = middle
        else:
            high = middle - 1
    return low


def default_context(spec, dtype, device_type: str, vram_budget: int, dense_bytes: int, device_slot_bytes: int) -> int:
    """The context a model gets unless the user sets one: its own limit (at most MAX_CONTEXT_TOKENS),
    cut so that its state and (on CUDA) the prefill workspace fit `fit_context`'s share of the budget.
    The engine and the estimate both ask this."""
    import torch

    from engine.model.families import family_module
    from engine.model.state import state_bytes
    state_specs = family_module(spec.family).state_specs(spec)
    elem = torch.empty((), dtype=dtype).element_size()

    def bytes_for_tokens(n: int) -> int:
        workspace = prefill_workspace_bytes(spec, n, elem) if device_type == "cuda" else 0
        return state_bytes(state_specs, n, dtype) + workspace
    if device_type == "cuda":
        vram_budget -= CUDA_CONTEXT_BYTES
    return fit_context(max_tokens=min(spec.max_position_embeddings, MAX_CONTEXT_TOKENS), bytes_for_tokens=bytes_for_tokens,
                       vram_budget=vram_budget, dense_bytes=dense_bytes, top_k=spec.top_k,
                       device_slot_bytes=device_slot_bytes)
