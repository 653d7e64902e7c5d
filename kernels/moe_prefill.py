"""One MoE layer over many tokens (prefill): a grouped GEMM over the (token, choice) pairs sorted by
expert (pair_routing.py), each expert's weights read straight from the VRAM slot bank it sits in.

  T = tokens, K = choices a token, H = hidden, I = expert intermediate, BM/BN/BK = config.block_*
  rows [R] int32: the pair (t * K + k) of each row, grouped by expert, each group padded to BM (-1)
  gate_up launch, grid (blocks, I/BN): h[r] = act(gate_e x_t + bg_e, up_e x_t + bu_e)   [rows, I], x's dtype
  down launch,    grid (blocks, H/BN): out[t] += w[t, k] * (down_e h[r] + bd_e)        fp32 atomic adds
A program finds its expert's slot from the block index (the launch's groups' block ends); a launch
covers a contiguous run of groups, so the engine computes the resident experts, then each batch
brought in, one call each. Weight tiles are dequantised in registers as engine.format.quant does it
(in fp32: fp8 / int8 codes times the row scale; nvfp4 e2m1 times its group's e4m3 scale, times the
global scale; mxfp4 e2m1 times its group's power of two; then rounded to the compute dtype), so the
products use the very weights the torch path multiplies; accumulation is fp32 (tl.dot; float32 inputs
in IEEE precision, never TF32). Formats: all of kernels.formats. act: the experts' activation
(kernels.activation: silu, gpt-oss's clamped SwiGLU, DeepSeek-V4's clamped silu); the biases b*_e
(gpt-oss's fp32 fields, rounded to the compute dtype as the torch path holds them) are added after the
row scale, bd_e before the routing weight.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import triton
import triton.language as tl

from .activation import SILU, Activation, biased
from .formats import FORMAT_IDS, dequantize_block
from .quant_formats import QUANT_FORMATS
from .pair_routing import Routing, int32_on, route_pairs
from .tiles import (activate, bias_rows, byte_weights, check_bank_inputs, field_offsets, fp4_tile, interpreting,
                    mma, raw_tile, row_scale)

KERNEL_VERSION = 3     # bump on any change to the kernels below: cached self-check verdicts are keyed on it
PREFILL_FORMATS = tuple(name for name, f in QUANT_FORMATS.items() if f.prefill_kernel)
FP4_GROUPS = {name: f.group_size for name, f in QUANT_FORMATS.items() if f.is_fp4}   # a reduction tile holds whole scale groups
ROUTING_BYTES_PER_PAIR = 48    # route_pairs' transient int64 / int32 tensors, per pair (budgeted with h)


@dataclass(frozen=True)
class PrefillConfig:
    block_m: int = 64       # rows (pairs) per program: one expert's tokens, padded
    block_n: int = 64       # output columns per program (I in gate_up, H in down)
    block_k: int = 64       # reduction tile
    num_warps: int = 4      # 4 beat 8 on the H200 for bf16 activations: int8 305 vs 353 us a layer, fp8 289 vs 344
    num_stages: int = 3


def default_config(dtype: torch.dtype) -> PrefillConfig:
    """bf16 / fp16 activations: the best of 10 configs on the H200 (`python -m bench prefill-kernel`). float32 activations (the token-exact tests) take smaller tiles and 8 warps, chosen from
    ptxas's register counts for sm_90a (no spills), as their IEEE dot holds twice the registers."""
    return PrefillConfig(block_m=32, block_k=32, num_warps=8) if dtype == torch.float32 else PrefillConfig()


@triton.jit
def _slot_of_block(table_ptr, block, num_groups, GROUPS: tl.constexpr):
    """The bank slot of the expert that `block` belongs to. table: the launch's groups' block ends
    (cumulative, [num_groups]), then their slots ([num_groups]); an empty group is skipped."""
    g = tl.arange(0, GROUPS)
    ends = tl.load(table_ptr + g, mask=g < num_groups, other=2147483647)
    group = tl.sum((ends <= block).to(tl.int32), axis=0)
    return tl.load(table_ptr + num_groups + group)


@triton.jit
def _weight_tile(bank_u8, bank_bf16, w_off, s_off, out_rows, k0, num_rows, row_len, scale, FMT: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """W[out_rows, k0:k0+BK] transposed ([BK, BN] float32, zero outside the matrix) as engine.format.quant
    dequantizes it: bf16 as stored, fp8 / int8 codes times their row's scale, nvfp4 / mxfp4 e2m1 times
    their group scale (fp4_tile), times the row's (`scale`, [BN]: nvfp4's global scale, mxfp4's 1)."""
    if FMT == 2 or FMT == 3:
        words, scales = raw_tile(bank_u8, bank_bf16, w_off, s_off, out_rows, k0, num_rows, row_len, FMT,
                                 BLOCK_N, BLOCK_K)
        return tl.trans(fp4_tile(words, scales, FMT, BLOCK_N, BLOCK_K) * scale[:, None])
    cols = k0 + tl.arange(0, BLOCK_K)
    mask = (cols[:, None] < row_len) & (out_rows[None, :] < num_rows)
    offs = out_rows[None, :] * row_len + cols[:, None]
    if FMT == 0:
        return tl.load(bank_bf16 + w_off // 2 + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        return byte_weights(tl.load(bank_u8 + w_off + offs, mask=mask, other=0), FMT) * scale[None, :]


@triton.jit(do_not_specialize=["num_groups", "b0"])
def _gate_up_kernel(x_ptr, h_ptr, rows_ptr, table_ptr, bank_u8, bank_bf16, bank_f32, block_bytes, H, I, K,
                    num_groups, b0, alpha, limit, GW: tl.constexpr, GS: tl.constexpr, GG: tl.constexpr,
                    UW: tl.constexpr, US: tl.constexpr, UG: tl.constexpr, GB: tl.constexpr, UB: tl.constexpr,
                    FMT: tl.constexpr, ACT: tl.constexpr, GROUPS: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP32_DOT: tl.constexpr):
    block = b0 + tl.program_id(0)                                   # in the routing's rows
    base = _slot_of_block(table_ptr, block, num_groups, GROUPS).to(tl.int64) * block_bytes
    m = tl.arange(0, BLOCK_M)
    pair = tl.load(rows_ptr + block * BLOCK_M + m)                  # [BM], -1 for padding
    valid = pair >= 0
    x_rows = x_ptr + (tl.maximum(pair, 0) // K).to(tl.int64)[:, None] * H
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)          # [BN] rows of gate / up (I)
    gate_scale = row_scale(bank_bf16, bank_f32, base + GS, base + GG, n, I, FMT)
    up_scale = row_scale(bank_bf16, bank_f32, base + US, base + UG, n, I, FMT)
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        xs = tl.load(x_rows + k[None, :], mask=valid[:, None] & (k[None, :] < H), other=0.0)      # [BM, BK]
        w_gate = _weight_tile(bank_u8, bank_bf16, base + GW, base + GS, n, k0, I, H, gate_scale, FMT,
                              BLOCK_N, BLOCK_K).to(xs.dtype)
        acc_gate = mma(xs, w_gate, acc_gate, FP32_DOT)
        w_up = _weight_tile(bank_u8, bank_bf16, base + UW, base + US, n, k0, I, H, up_scale, FMT,
                            BLOCK_N, BLOCK_K).to(xs.dtype)
        acc_up = mma(xs, w_up, acc_up, FP32_DOT)
    gate = acc_gate + bias_rows(bank_f32, base + GB, n, I, GB).to(x_ptr.dtype.element_ty).to(tl.float32)[None, :]
    up = acc_up + bias_rows(bank_f32, base + UB, n, I, UB).to(x_ptr.dtype.element_ty).to(tl.float32)[None, :]
    hidden = activate(gate, up, ACT, alpha, limit)
    local = (tl.program_id(0) * BLOCK_M + m).to(tl.int64)           # this launch's h rows
    tl.store(h_ptr + local[:, None] * I + n[None, :], hidden.to(h_ptr.dtype.element_ty), mask=n[None, :] < I)


@triton.jit(do_not_specialize=["num_groups", "b0"])
def _down_kernel(h_ptr, out_ptr, rows_ptr, table_ptr, weight_ptr, bank_u8, bank_bf16, bank_f32, block_bytes,
                 H, I, K, num_groups, b0, DW: tl.constexpr, DS: tl.constexpr, DG: tl.constexpr, DB: tl.constexpr,
                 FMT: tl.constexpr,
                 GROUPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 FP32_DOT: tl.constexpr):
    block = b0 + tl.program_id(0)
    base = _slot_of_block(table_ptr, block, num_groups, GROUPS).to(tl.int64) * block_bytes
    m = tl.arange(0, BLOCK_M)
    pair = tl.load(rows_ptr + block * BLOCK_M + m)
    valid = pair >= 0
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)          # [BN] rows of down (H)
    down_scale = row_scale(bank_bf16, bank_f32, base + DS, base + DG, n, H, FMT)
    h_rows = h_ptr + (tl.program_id(0) * BLOCK_M + m).to(tl.int64)[:, None] * I
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        hs = tl.load(h_rows + k[None, :], mask=k[None, :] < I, other=0.0)                        # [BM, BK]
        w_down = _weight_tile(bank_u8, bank_bf16, base + DW, base + DS, n, k0, H, I, down_scale, FMT,
                              BLOCK_N, BLOCK_K).to(hs.dtype)
        acc = mma(hs, w_down, acc, FP32_DOT)
    acc += bias_rows(bank_f32, base + DB, n, H, DB).to(h_ptr.dtype.element_ty).to(tl.float32)[None, :]
    acc *= tl.load(weight_ptr + pair, mask=valid, other=0.0)[:, None]                            # routing weight
    out_rows = out_ptr + (tl.maximum(pair, 0) // K).to(tl.int64)[:, None] * H
    tl.atomic_add(out_rows + n[None, :], acc, mask=valid[:, None] & (n[None, :] < H), sem="relaxed")


def _check_inputs(x, bank, weights, out, fmt, offsets, block_k):
    if fmt not in PREFILL_FORMATS:
        raise ValueError(f"the prefill kernel takes {', '.join(PREFILL_FORMATS)} experts, not {fmt!r}")
    if x.dim() != 2 or bank.dim() != 2 or weights.dim() != 2 or weights.shape[0] != x.shape[0] \
            or out.shape != x.shape:
        raise ValueError(f"shapes: x {tuple(x.shape)}, bank {tuple(bank.shape)}, weights {tuple(weights.shape)}, "
                         f"out {tuple(out.shape)}: want x [T,H], bank [S,B], weights [T,K], out [T,H]")
    if bank.dtype != torch.uint8 or weights.dtype != torch.float32 or out.dtype != torch.float32:
        raise TypeError(f"dtypes: bank {bank.dtype} (uint8), weights {weights.dtype} (float32), out {out.dtype} (float32)")
    check_bank_inputs(x, bank, {"weights": weights, "out": out}, offsets)
    if fmt in FP4_GROUPS and block_k % FP4_GROUPS[fmt]:
        raise ValueError(f"{fmt} needs block_k a multiple of its {FP4_GROUPS[fmt]}-value scale groups, not {block_k}")


def max_blocks(workspace_bytes: int | None, routing: Routing, intermediate: int, dtype: torch.dtype) -> int | None:
    """Blocks per launch pair whose intermediate h fits in `workspace_bytes` beside the routing (None: no limit)."""
    if workspace_bytes is None:
        return None
    num_pairs = routing.num_tokens * routing.top_k
    free = workspace_bytes - num_pairs * ROUTING_BYTES_PER_PAIR - routing.rows.numel() * 4
    return max(1, free // (routing.block_m * intermediate * torch.empty((), dtype=dtype).element_size()))


def moe_prefill(x: torch.Tensor, bank: torch.Tensor, routing: Routing, slot_of: Mapping[int, int],
                weights: torch.Tensor, fmt: str, offsets: Mapping[str, int], intermediate: int, out: torch.Tensor,
                config: PrefillConfig | None = None, workspace_bytes: int | None = None,
                activation: Activation = SILU) -> torch.Tensor:
    """Add sum over the pairs routed to the experts of `slot_of` ({expert: bank slot}, a contiguous run
    of `routing`'s order) of w[t,k] * expert(x[t]) into out [T, H] float32. x [T, H] in the compute
    dtype, weights [T, K] float32. workspace_bytes: the device memory the routing and the intermediate
    may take (the launches are cut into chunks of blocks to fit). activation: the experts' (kernels.activation);
    biases are added where `offsets` has their fields."""
    cfg = config or default_config(x.dtype)
    _check_inputs(x, bank, weights, out, fmt, offsets, cfg.block_k)
    if cfg.block_m != routing.block_m or weights.shape[1] != routing.top_k or x.shape[0] != routing.num_tokens:
        raise ValueError(f"the routing (T={routing.num_tokens}, K={routing.top_k}, block_m={routing.block_m}) "
                         f"does not match x {tuple(x.shape)}, weights {tuple(weights.shape)}, block_m {cfg.block_m}")
    g0, g1 = routing.run(slot_of)
    b0, b1 = routing.blocks(g0, g1)
    if b1 == b0:
        return out
    hidden = x.shape[1]
    table = int32_on(x.device, routing.block_ends[g0:g1] + [slot_of[e] for e in routing.experts[g0:g1]])
    chunk = min(b1 - b0, max_blocks(workspace_bytes, routing, intermediate, x.dtype) or b1 - b0)
    h_buf = torch.empty(chunk * cfg.block_m, intermediate, device=x.device, dtype=x.dtype)
    views = (bank, bank.view(torch.bfloat16), bank.view(torch.float32))
    off = field_offsets(offsets)
    common = dict(GROUPS=max(64, triton.next_power_of_2(g1 - g0)), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                  BLOCK_K=cfg.block_k, FP32_DOT=x.dtype == torch.float32 or interpreting(), num_warps=cfg.num_warps,
                  num_stages=cfg.num_stages)
    for start in range(b0, b1, chunk):
        blocks = min(chunk, b1 - start)
        _gate_up_kernel[(blocks, triton.cdiv(intermediate, cfg.block_n))](
            x, h_buf, routing.rows, table, *views, bank.shape[1], hidden, intermediate, routing.top_k, g1 - g0, start,
            activation.alpha, activation.limit,
            off["gate.w"], off["gate.scale"], off["gate.gscale"], off["up.w"], off["up.scale"], off["up.gscale"],
            off["gate_bias.b"], off["up_bias.b"], FORMAT_IDS[fmt], activation.kernel_id, **common)
        _down_kernel[(blocks, triton.cdiv(hidden, cfg.block_n))](
            h_buf, out, routing.rows, table, weights, *views, bank.shape[1], hidden, intermediate, routing.top_k,
            g1 - g0, start, off["down.w"], off["down.scale"], off["down.gscale"], off["down_bias.b"], FORMAT_IDS[fmt],
            **common)
    return out


def moe_prefill_bank(x: torch.Tensor, bank: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor, fmt: str,
                     offsets: Mapping[str, int], intermediate: int, config: PrefillConfig | None = None,
                     activation: Activation = SILU) -> torch.Tensor:
    """A whole layer whose experts are all in `bank`: slots [T, K] int32 (bank row of each token's
    choice k) -> [T, H] float32, in one launch pair (moe_prefill_ref's signature: the self-check and
    tests). Reads the slots on the host."""
    cfg = config or default_config(x.dtype)
    routed = slots.flatten().tolist()
    if min(routed, default=0) < 0:
        raise ValueError("moe_prefill_bank needs every (token, choice) routed to a slot (no negative slots)")
    routing = route_pairs(routed, slots.flatten(), list(dict.fromkeys(routed)), slots.shape[1], cfg.block_m)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    return moe_prefill(x, bank, routing, {s: s for s in routing.experts}, weights, fmt, offsets, intermediate, out, cfg,
                       activation=activation)


def moe_prefill_ref(x: torch.Tensor, bank: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor, fmt: str,
                    offsets: Mapping[str, int], intermediate: int, config: PrefillConfig | None = None,
                    activation: Activation = SILU) -> torch.Tensor:
    """Plain-torch specification (moe_prefill_bank's signature; config ignored): each expert's weights and
    biases dequantised to x's dtype as the torch path does, fp32 products and sums, h rounded to x's dtype
    between the two GEMMs as the kernel stores it; [T, H] float32."""
    hidden = x.shape[1]
    acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for slot in slots.unique().tolist():
        w = {p: t.float() for p, t in dequantize_block(bank[slot], fmt, offsets, intermediate, hidden, x.dtype).items()}
        token_ids, choice = (slots == slot).nonzero(as_tuple=True)
        xs = x[token_ids].float()                                                         # [n, H]
        h = activation(biased(xs @ w["gate"].T, w, "gate_bias"), biased(xs @ w["up"].T, w, "up_bias")).to(x.dtype)
        down = biased(h.float() @ w["down"].T, w, "down_bias")                           # [n, H]
        acc.index_add_(0, token_ids, down * weights[token_ids, choice][:, None])
    return acc


class PrefillKernel:
    """What the engine holds: moe_prefill in one config, and the routing it reads (route_pairs with the
    config's block rows), so that the engine imports no Triton."""

    def __init__(self, config: PrefillConfig, activation: Activation = SILU):
        self.config, self.activation = config, activation

    def route(self, routed: list[int], routed_dev: torch.Tensor, experts: list[int], top_k: int) -> Routing:
        return route_pairs(routed, routed_dev, experts, top_k, self.config.block_m)

    def __call__(self, *args, **kwargs) -> torch.Tensor:
        return moe_prefill(*args, config=self.config, activation=self.activation, **kwargs)
