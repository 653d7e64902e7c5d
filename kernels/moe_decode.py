"""One MoE layer at decode (a few tokens): every active expert of the layer, read straight from the
VRAM slot bank it sits in, in two launches.

  T = tokens, K = experts per token, H = hidden, I = expert intermediate, S = slots in the bank
  x [T, H]  slots [T, K] int32 (bank row of the expert of token t, choice k)  weights [T, K] fp32
  gate_up launch, grid (T*K, I/BLOCK_I): h[t,k] = act(gate_e x_t + bg_e, up_e x_t + bu_e)  [T*K, I] fp32
  down launch,    grid (T, H/BLOCK_H):  out[t] = sum_k weights[t,k] * (down_e h[t,k] + bd_e)  [T, H] fp32
                  or, split_down, grid (T*K, H/BLOCK_H) with atomic adds (more programs in flight)
Gate and up keep separate accumulators; the routing weight and the top-k sum happen in the down
launch, so nothing but h (T*K*I floats) goes through memory between the two. act: the expert
activation (kernels.activation: silu, gpt-oss's clamped SwiGLU, DeepSeek-V4's clamped silu); the
biases b*_e (fp32 fields of the block, gpt-oss) are added after the row scale, the down bias before
the routing weight.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import triton
import triton.language as tl

from .activation import SILU, Activation, biased
from .formats import FORMAT_IDS, FORMATS, dequantize_block
from .quant_formats import QUANT_FORMATS
from .tiles import (bias_rows, block_base, check_bank_inputs, dot_acc, dot_total, field_offsets, gate_up_rows,
                    row_scale, tile_dot, tile_words, vector_tile)

KERNEL_VERSION = 12     # bump on any change to the kernels below: cached self-check verdicts are keyed on it


@dataclass(frozen=True)
class DecodeConfig:
    block_i: int = 16       # gate/up output rows per program
    block_h: int = 16       # down output rows per program
    block_k: int = 256      # reduction tile (input elements)
    num_warps: int = 4
    split_down: bool = False  # down grid over (token, expert) with atomic adds instead of a loop over experts
    num_stages: int | None = None   # Triton software pipelining depth (None: Triton's default)


def default_config(fmt: str) -> DecodeConfig:
    """Fastest measured: one-byte formats on an H200 at qwen3-30b-a3b / olmoe expert shapes, fp4 on an H100 at
    gpt-oss-120b's (`python -m bench kernels`)."""
    if fmt in ("fp8", "int8"):   # int8: fp8's (same bytes an element), not yet swept on its own
        return DecodeConfig(block_i=4, block_h=4, block_k=1024, num_warps=2, split_down=True)
    if fmt in ("nvfp4", "mxfp4"):
        return DecodeConfig(block_i=8, block_h=8, block_k=512, num_warps=4 if fmt == "nvfp4" else 2, split_down=True)
    return DecodeConfig(block_i=16, block_h=8, block_k=512, split_down=True)


@triton.jit
def _gate_up_kernel(x_ptr, h_ptr, out_ptr, slot_ptr, bank_u8, bank_bf16, bank_f32, block_bytes, H, I, K,
                    alpha, limit, GW: tl.constexpr, GS: tl.constexpr, GG: tl.constexpr,
                    UW: tl.constexpr, US: tl.constexpr, UG: tl.constexpr, GB: tl.constexpr, UB: tl.constexpr,
                    FMT: tl.constexpr, ACT: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr,
                    ZERO_OUT: tl.constexpr):
    pair = tl.program_id(0)                                   # t * K + k
    token = pair // K
    rows = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    gate_up_rows(x_ptr, h_ptr, slot_ptr, bank_u8, bank_bf16, bank_f32, block_bytes, H, I, K, pair, rows, alpha, limit,
                  GW, GS, GG, UW, US, UG, GB, UB, FMT, ACT, BLOCK_I, BLOCK_K)
    if ZERO_OUT:                                              # the split down pass adds into out
        if (pair % K == 0) & (tl.program_id(1) == 0):
            for h0 in range(0, H, BLOCK_K):
                cols = h0 + tl.arange(0, BLOCK_K)
                tl.store(out_ptr + token * H + cols, tl.zeros([BLOCK_K], dtype=tl.float32), mask=cols < H)


@triton.jit
def _down_rows(h_ptr, pair, bank_u8, bank_bf16, bank_f32, base, rows, n, I, DW: tl.constexpr, DS: tl.constexpr,
               DG: tl.constexpr, DB: tl.constexpr, FMT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    """down_e h[pair] + bd_e on `rows` ([BLOCK_H] float32, before the routing weight) for the expert block at byte
    `base`; n = H, or 0 for a skipped pair (nothing read)."""
    part = dot_acc(FMT, BLOCK_H, BLOCK_K)
    h_pair = h_ptr + pair * I
    if FMT == 2 or FMT == 3:     # fp4: the next tile loaded before this one is decoded (see tiles.tile_words)
        w = tile_words(bank_u8, bank_bf16, bank_f32, base + DW, base + DS, rows, 0, n, I, FMT, BLOCK_H, BLOCK_K)
        hs = vector_tile(h_pair, 0, I, FMT, BLOCK_K)
        for i0 in range(0, I, BLOCK_K):
            next_w = tile_words(bank_u8, bank_bf16, bank_f32, base + DW, base + DS, rows, i0 + BLOCK_K, n, I, FMT,
                                BLOCK_H, BLOCK_K)
            next_hs = vector_tile(h_pair, i0 + BLOCK_K, I, FMT, BLOCK_K)
            part += tile_dot(w, hs, FMT)
            w, hs = next_w, next_hs
    else:
        for i0 in range(0, I, BLOCK_K):
            part += tile_dot(tile_words(bank_u8, bank_bf16, bank_f32, base + DW, base + DS, rows, i0, n, I, FMT,
                                        BLOCK_H, BLOCK_K), vector_tile(h_pair, i0, I, FMT, BLOCK_K), FMT)
    return (dot_total(part) * row_scale(bank_bf16, bank_f32, base + DS, base + DG, rows, n, FMT)
            + bias_rows(bank_f32, base + DB, rows, n, DB))


@triton.jit
def _down_kernel(h_ptr, out_ptr, slot_ptr, weight_ptr, bank_u8, bank_bf16, bank_f32, block_bytes, H, I, K,
                 DW: tl.constexpr, DS: tl.constexpr, DG: tl.constexpr, DB: tl.constexpr, FMT: tl.constexpr,
                 BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, ACCUMULATE: tl.constexpr):
    """SPLIT: grid (T*K, H/BLOCK_H), one expert per program, atomic add into out (zeroed by
    gate_up unless accumulating). Else grid (T, H/BLOCK_H), the K experts summed in a loop, stored
    (added to out when ACCUMULATE)."""
    rows = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    if SPLIT:
        pair = tl.program_id(0)
        slot = tl.load(slot_ptr + pair)
        n = tl.where(slot >= 0, H, 0)                         # skipped pair: no reads, nothing added
        part = _down_rows(h_ptr, pair, bank_u8, bank_bf16, bank_f32, block_base(slot, block_bytes), rows, n, I,
                          DW, DS, DG, DB, FMT, BLOCK_H, BLOCK_K) * tl.load(weight_ptr + pair)
        tl.atomic_add(out_ptr + (pair // K) * H + rows, part, mask=rows < n, sem="relaxed")
    else:
        token = tl.program_id(0)
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for k in range(0, K):
            pair = token * K + k
            slot = tl.load(slot_ptr + pair)
            n = tl.where(slot >= 0, H, 0)
            acc += _down_rows(h_ptr, pair, bank_u8, bank_bf16, bank_f32, block_base(slot, block_bytes), rows, n, I,
                              DW, DS, DG, DB, FMT, BLOCK_H, BLOCK_K) * tl.load(weight_ptr + pair)
        if ACCUMULATE:
            acc += tl.load(out_ptr + token * H + rows, mask=rows < H, other=0.0)
        tl.store(out_ptr + token * H + rows, acc, mask=rows < H)


def _check_inputs(x, bank, slots, weights, fmt, offsets, intermediate):
    if fmt not in FORMATS:
        raise ValueError(f"unknown expert format {fmt!r}")
    if x.dim() != 2 or bank.dim() != 2 or slots.shape != weights.shape or slots.shape[0] != x.shape[0]:
        raise ValueError(f"shapes: x {tuple(x.shape)}, bank {tuple(bank.shape)}, slots {tuple(slots.shape)}, "
                         f"weights {tuple(weights.shape)}: want x [T,H], bank [S,B], slots/weights [T,K]")
    if bank.dtype != torch.uint8 or slots.dtype != torch.int32 or weights.dtype != torch.float32:
        raise TypeError(f"dtypes: bank {bank.dtype} (uint8), slots {slots.dtype} (int32), weights {weights.dtype} (float32)")
    check_bank_inputs(x, bank, {"slots": slots, "weights": weights}, offsets)
    if fmt == "nvfp4" and (x.shape[1] % 16 or intermediate % 16):
        raise ValueError("nvfp4 needs hidden and intermediate sizes divisible by 16")
    if fmt == "mxfp4" and (x.shape[1] % 32 or intermediate % 32):
        raise ValueError("mxfp4 needs hidden and intermediate sizes divisible by 32")


def _check_config(cfg: DecodeConfig, fmt: str) -> None:
    group = QUANT_FORMATS[fmt].group_size
    if group and (cfg.block_k % group or cfg.block_k & (cfg.block_k - 1)):
        raise ValueError(f"{fmt} decode tiles need block_k a power of two and a multiple of {group} "
                         f"(got {cfg.block_k})")


def moe_decode(x: torch.Tensor, bank: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor, fmt: str,
               offsets: Mapping[str, int], intermediate: int, config: DecodeConfig | None = None,
               out: torch.Tensor | None = None, h_buf: torch.Tensor | None = None, accumulate: bool = False,
               activation: Activation = SILU) -> torch.Tensor:
    """sum_k weights[t,k] * expert_{slots[t,k]}(x[t]) -> [T, H] float32 (the caller adds it to its
    residual). A negative slot skips that (token, choice): no bytes are read for it (a launch over
    the experts that are resident while the others are still copying). `out` ([T, H] fp32) and
    `h_buf` ([T*K, I] fp32) may be given so that the call allocates nothing (CUDA graphs);
    accumulate=True adds into `out` instead of overwriting it. `activation`: the experts' (kernels.activation);
    biases are added where `offsets` has their fields."""
    _check_inputs(x, bank, slots, weights, fmt, offsets, intermediate)
    if accumulate and out is None:
        raise ValueError("moe_decode(accumulate=True) needs the out= tensor to add into")
    cfg = config or default_config(fmt)
    _check_config(cfg, fmt)
    num_tokens, hidden = x.shape
    top_k = slots.shape[1]
    pairs = num_tokens * top_k
    fmt_id = FORMAT_IDS[fmt]
    if h_buf is None:
        h_buf = torch.empty(pairs, intermediate, device=x.device, dtype=torch.float32)
    if out is None:
        out = torch.empty(num_tokens, hidden, device=x.device, dtype=torch.float32)
    block_bytes = bank.shape[1]
    views = (bank, bank.view(torch.bfloat16), bank.view(torch.float32))
    off = field_offsets(offsets)
    act = (activation.alpha, activation.limit, activation.kernel_id)
    launch = {"num_warps": cfg.num_warps}
    if cfg.num_stages is not None:
        launch["num_stages"] = cfg.num_stages
    _gate_up_kernel[(pairs, triton.cdiv(intermediate, cfg.block_i))](
        x, h_buf, out, slots, *views, block_bytes, hidden, intermediate, top_k, act[0], act[1],
        off["gate.w"], off["gate.scale"], off["gate.gscale"], off["up.w"], off["up.scale"], off["up.gscale"],
        off["gate_bias.b"], off["up_bias.b"], fmt_id, act[2], cfg.block_i, cfg.block_k, cfg.split_down and not accumulate,
        **launch)
    _down_kernel[(num_tokens * (top_k if cfg.split_down else 1), triton.cdiv(hidden, cfg.block_h))](
        h_buf, out, slots, weights, *views, block_bytes, hidden, intermediate, top_k,
        off["down.w"], off["down.scale"], off["down.gscale"], off["down_bias.b"],
        fmt_id, cfg.block_h, cfg.block_k, cfg.split_down, accumulate, **launch)
    return out


def moe_decode_ref(x: torch.Tensor, bank: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor, fmt: str,
                   offsets: Mapping[str, int], intermediate: int, config: DecodeConfig | None = None,
                   out: torch.Tensor | None = None, h_buf: torch.Tensor | None = None, accumulate: bool = False,
                   activation: Activation = SILU) -> torch.Tensor:
    """Plain-torch specification (and fallback, same signature): float32 math and result, each
    distinct expert dequantized once (with its biases, if any); negative slots are skipped; accumulate adds into `out`.
    `config` and `h_buf` are accepted and ignored."""
    if accumulate and out is None:
        raise ValueError("moe_decode_ref(accumulate=True) needs the out= tensor to add into")
    hidden = x.shape[1]
    acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    xf = x.float()
    for slot in slots.unique().tolist():
        if slot < 0:
            continue
        w = dequantize_block(bank[slot], fmt, offsets, intermediate, hidden)
        token_ids, choice = (slots == slot).nonzero(as_tuple=True)
        xs = xf[token_ids]                                                          # [n, H]
        h = activation(biased(xs @ w["gate"].T, w, "gate_bias"), biased(xs @ w["up"].T, w, "up_bias"))   # [n, I]
        down = biased(h @ w["down"].T, w, "down_bias")
        acc.index_add_(0, token_ids, down * weights[token_ids, choice][:, None])
    if out is None:
        return acc
    return out.add_(acc) if accumulate else out.copy_(acc)

