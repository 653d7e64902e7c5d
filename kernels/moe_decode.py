"""One MoE layer at decode (a few tokens): every active expert of the layer, read straight from the
VRAM slot bank it sits in, in two launches or (config.fused) one.

  T = tokens, K = experts per token, H = hidden, I = expert intermediate, S = slots in the bank
  x [T, H]  slots [T, K] int32 (bank row of the expert of token t, choice k)  weights [T, K] fp32
  gate_up launch, grid (T*K, I/BLOCK_I): h[t,k] = silu(gate_e x_t) * (up_e x_t)       [T*K, I] fp32
  down launch,    grid (T, H/BLOCK_H):  out[t] = sum_k weights[t,k] * down_e h[t,k]  [T, H] fp32
                  or, split_down, grid (T*K, H/BLOCK_H) with atomic adds (more programs in flight)
Gate and up keep separate accumulators; the routing weight and the top-k sum happen in the down
launch, so nothing but h (T*K*I floats) goes through memory between the two.

Fused (one launch, 1-D grid of T*K * (I/BLOCK_I + H/BLOCK_H) programs, pair = t*K + k major):
  programs [0, T*K*I/BLOCK_I)  gate_up producers: the work above, then a release increment of an
                               int32 counter of their pair once their h rows are stored;
  the rest                     split-down consumers (pair, BLOCK_H rows of H): they first load their
                               down weight tile, which does not depend on h, so these reads overlap
                               the gate_up tail instead of starting cold after a launch gap; then
                               they spin (acquire) until the pair's counter reaches I/BLOCK_I, read
                               h[pair] and atomically add weight * down_e h into out (zeroed by
                               the launcher just before).
  Preload: the words loaded before the wait are columns [0, PRE_A + PRE_B) of I as two
  power-of-two tiles (PRE_A = the largest power of two <= I, PRE_B = the rest rounded up and
  masked: I = 768 is 512 + 256, I = 1024 one tile, no padding), kept as stored words (1 byte an
  element for fp8, 2 for bf16, 9/16 for nvfp4 with its group scales) and decoded only after the
  wait. At BLOCK_H = 16 and 4 warps that is 12 KiB (I = 768) / 16 KiB (I = 1024) of fp8 per
  program, 96 / 128 bytes (24 / 32 registers) a thread; bf16 twice that. config.preload caps the
  bytes a thread holds (default 256, 64 registers): columns past the cap are read after the wait,
  BLOCK_K at a time, as are all of them with preload = 0 (wait first).
  Registers a thread (H200, Triton 3.6), blocks i/h/k/warps, I = 768 / 1024: fp8 8/16/512/w4
  72 / 72, 16/32/512/w4 106 / 128; bf16 16/8/512/w4 126; nvfp4 4/8/512/w2 79, at 4 warps 55. No
  spills. The one launch runs at the larger footprint of its two halves.
  Counters: one int32 per pair, in a per-device module buffer (or `counters=`), zero between
  launches: each consumer adds 1 as its last act and the one that sees I/BLOCK_I + H/BLOCK_H - 1
  writes 0 back, so there is no memset of counters per launch (CUDA-graph friendly). One launch
  at a time may use a counter buffer: launches on concurrent streams need their own `counters=`.
  Measured on an H200 (CUDA graph, T = 1, qwen3-30b-a3b experts): fp8 split 8/16/512/w4 16.6 us,
  fused 17.0 us at best (16/32/512/w4), of which the memset of out is about 1 us; nvfp4 fused
  29.1 us against 34.1 split; bf16 fused 28.4 against 26.9. Not a default anywhere yet.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

import torch
import triton
import triton.language as tl

from .formats import FORMAT_IDS, FORMATS, dequantize_block
from .tiles import _e2m1, partial_dot, row_scale

KERNEL_VERSION = 5     # bump on any change to the kernels below: cached self-check verdicts are keyed on it


@dataclass(frozen=True)
class DecodeConfig:
    block_i: int = 16       # gate/up output rows per program
    block_h: int = 16       # down output rows per program
    block_k: int = 256      # reduction tile (input elements)
    num_warps: int = 4
    split_down: bool = False  # down grid over (token, expert) with atomic adds instead of a loop over experts
    fused: bool = False       # one launch: gate_up producers, then split-down consumers that wait on counters
                              # (always a split down pass: split_down is ignored)
    num_stages: int | None = None   # Triton software pipelining depth (None: Triton's default)
    preload: int = 256        # fused: down weight bytes a thread loads before its wait (0: wait first)


def default_config(fmt: str) -> DecodeConfig:
    """Fastest measured on an H200 at qwen3-30b-a3b / olmoe expert shapes (BENCHMARKS.md)."""
    if fmt == "fp8":        # session 2 sweep: 16.0-16.9 us at qwen3 shapes vs 19.1-19.3 for 8/16/512/w4
        return DecodeConfig(block_i=4, block_h=4, block_k=1024, num_warps=2, split_down=True)
    if fmt == "nvfp4":
        return DecodeConfig(block_i=4, block_h=8, block_k=512, num_warps=2, split_down=True)
    return DecodeConfig(block_i=16, block_h=8, block_k=512, split_down=True)


@triton.jit
def _gate_up_rows(x_ptr, h_ptr, slot_ptr, bank_u8, bank_bf16, bank_f32, block_bytes, H, I, K, pair, rows,
                  GW: tl.constexpr, GS: tl.constexpr, GG: tl.constexpr,
                  UW: tl.constexpr, US: tl.constexpr, UG: tl.constexpr, FMT: tl.constexpr,
                  BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr):
    """h[pair, rows] = silu(gate_e x_t) * (up_e x_t) for pair = t * K + k (stored to h_ptr)."""
    token = pair // K
    slot = tl.load(slot_ptr + pair)
    n = tl.where(slot >= 0, I, 0)                             # a skipped pair (slot < 0) reads nothing: h = 0
    base = tl.maximum(slot, 0).to(tl.int64) * block_bytes
    acc_gate = tl.zeros([BLOCK_I], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_I], dtype=tl.float32)
    x_row = x_ptr + token * H
    for k0 in range(0, H, BLOCK_K):
        acc_gate += partial_dot(bank_u8, bank_bf16, base + GW, base + GS, rows, k0, n, H, x_row, FMT, BLOCK_I, BLOCK_K)
        acc_up += partial_dot(bank_u8, bank_bf16, base + UW, base + US, rows, k0, n, H, x_row, FMT, BLOCK_I, BLOCK_K)
    acc_gate *= row_scale(bank_f32, base + GS, base + GG, rows, n, FMT)
    acc_up *= row_scale(bank_f32, base + US, base + UG, rows, n, FMT)
    hidden = acc_gate / (1.0 + tl.exp(-acc_gate)) * acc_up   # silu(gate) * up
    tl.store(h_ptr + pair * I + rows, hidden, mask=rows < I)


@triton.jit
def _gate_up_kernel(x_ptr, h_ptr, out_ptr, slot_ptr, bank_u8, bank_bf16, bank_f32, block_bytes, H, I, K,
                    GW: tl.constexpr, GS: tl.constexpr, GG: tl.constexpr,
                    UW: tl.constexpr, US: tl.constexpr, UG: tl.constexpr, FMT: tl.constexpr,
                    BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr, ZERO_OUT: tl.constexpr):
    pair = tl.program_id(0)                                   # t * K + k
    token = pair // K
    rows = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    _gate_up_rows(x_ptr, h_ptr, slot_ptr, bank_u8, bank_bf16, bank_f32, block_bytes, H, I, K, pair, rows,
                  GW, GS, GG, UW, US, UG, FMT, BLOCK_I, BLOCK_K)
    if ZERO_OUT:                                              # the split down pass adds into out
        if (pair % K == 0) & (tl.program_id(1) == 0):
            for h0 in range(0, H, BLOCK_K):
                cols = h0 + tl.arange(0, BLOCK_K)
                tl.store(out_ptr + token * H + cols, tl.zeros([BLOCK_K], dtype=tl.float32), mask=cols < H)


@triton.jit
def _down_kernel(h_ptr, out_ptr, slot_ptr, weight_ptr, bank_u8, bank_bf16, bank_f32, block_bytes, H, I, K,
                 DW: tl.constexpr, DS: tl.constexpr, DG: tl.constexpr, FMT: tl.constexpr,
                 BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, ACCUMULATE: tl.constexpr):
    """SPLIT: grid (T*K, H/BLOCK_H), one expert per program, atomic add into out (zeroed by
    gate_up unless accumulating). Else grid (T, H/BLOCK_H), the K experts summed in a loop, stored
    (added to out when ACCUMULATE)."""
    rows = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    if SPLIT:
        pair = tl.program_id(0)
        slot = tl.load(slot_ptr + pair)
        n = tl.where(slot >= 0, H, 0)                         # skipped pair: no reads, nothing added
        base = tl.maximum(slot, 0).to(tl.int64) * block_bytes
        part = tl.zeros([BLOCK_H], dtype=tl.float32)
        for i0 in range(0, I, BLOCK_K):
            part += partial_dot(bank_u8, bank_bf16, base + DW, base + DS, rows, i0, n, I, h_ptr + pair * I,
                                FMT, BLOCK_H, BLOCK_K)
        part *= row_scale(bank_f32, base + DS, base + DG, rows, n, FMT) * tl.load(weight_ptr + pair)
        tl.atomic_add(out_ptr + (pair // K) * H + rows, part, mask=rows < n, sem="relaxed")
    else:
        token = tl.program_id(0)
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for k in range(0, K):
            pair = token * K + k
            slot = tl.load(slot_ptr + pair)
            n = tl.where(slot >= 0, H, 0)
            base = tl.maximum(slot, 0).to(tl.int64) * block_bytes
            part = tl.zeros([BLOCK_H], dtype=tl.float32)
            for i0 in range(0, I, BLOCK_K):
                part += partial_dot(bank_u8, bank_bf16, base + DW, base + DS, rows, i0, n, I, h_ptr + pair * I,
                                    FMT, BLOCK_H, BLOCK_K)
            acc += part * row_scale(bank_f32, base + DS, base + DG, rows, n, FMT) * tl.load(weight_ptr + pair)
        if ACCUMULATE:
            acc += tl.load(out_ptr + token * H + rows, mask=rows < H, other=0.0)
        tl.store(out_ptr + token * H + rows, acc, mask=rows < H)


@triton.jit
def _raw_tile(bank_u8, bank_bf16, w_off, s_off, rows, c0, n_rows, row_len,
              FMT: tl.constexpr, BLOCK_R: tl.constexpr, NCOLS: tl.constexpr):
    """The stored words of W[rows, c0:c0+NCOLS] (zero outside the matrix), not yet decoded: bf16 as
    bf16, fp8 as uint8, nvfp4 as (packed uint8 [BLOCK_R, NCOLS/2], e4m3 group scales as uint8
    [BLOCK_R, NCOLS/16]). Decoding to float32 is left to `_raw_dot`, so that a tile loaded ahead of
    a wait holds 1 (fp8), 2 (bf16) or 9/16 (nvfp4) bytes an element in registers, not 4.
    Returns (words, scales); `scales` is `words` again (unused) for bf16 / fp8."""
    row_ok = rows[:, None] < n_rows
    if FMT == 2:
        half = row_len // 2                                   # bytes per row
        jb = c0 // 2 + tl.arange(0, NCOLS // 2)
        words = tl.load(bank_u8 + w_off + rows[:, None] * half + jb[None, :],
                        mask=row_ok & (jb[None, :] < half), other=0)
        groups = row_len // 16
        jg = c0 // 16 + tl.arange(0, NCOLS // 16)
        scales = tl.load(bank_u8 + s_off + rows[:, None] * groups + jg[None, :],
                         mask=row_ok & (jg[None, :] < groups), other=0)
        return words, scales
    else:
        cols = c0 + tl.arange(0, NCOLS)
        if FMT == 0:
            ptr = bank_bf16 + w_off // 2 + rows[:, None] * row_len + cols[None, :]
        else:
            ptr = bank_u8 + w_off + rows[:, None] * row_len + cols[None, :]
        words = tl.load(ptr, mask=row_ok & (cols[None, :] < row_len), other=0)
        return words, words


@triton.jit
def _raw_dot(words, scales, vec_ptr, c0, row_len, FMT: tl.constexpr, BLOCK_R: tl.constexpr, NCOLS: tl.constexpr):
    """[BLOCK_R] float32: sum over c in [c0, c0+NCOLS) of W[rows, c] * vec[c] for a `_raw_tile`
    (before `row_scale`). vec is read through L2 only (.cg): it was written by other programs of
    this launch, and the L1 of this multiprocessor is not coherent with their stores."""
    if FMT == 2:
        j = c0 + 2 * tl.arange(0, NCOLS // 2)
        x_even = tl.load(vec_ptr + j, mask=j < row_len, other=0.0, cache_modifier=".cg").to(tl.float32)
        x_odd = tl.load(vec_ptr + j + 1, mask=j + 1 < row_len, other=0.0, cache_modifier=".cg").to(tl.float32)
        code = words.to(tl.int32)
        prod = _e2m1(code & 15) * x_even[None, :] + _e2m1(code >> 4) * x_odd[None, :]      # [R, NCOLS/2]
        per_group = tl.sum(tl.reshape(prod, [BLOCK_R, NCOLS // 16, 8]), axis=2)           # 8 bytes = 16 values
        return tl.sum(per_group * scales.to(tl.float8e4nv, bitcast=True).to(tl.float32), axis=1)
    else:
        cols = c0 + tl.arange(0, NCOLS)
        vec = tl.load(vec_ptr + cols, mask=cols < row_len, other=0.0, cache_modifier=".cg").to(tl.float32)
        if FMT == 1:
            w = words.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        else:
            w = words.to(tl.float32)
        return tl.sum(w * vec[None, :], axis=1)


@triton.jit
def _fused_gate_up(x_ptr, h_ptr, slot_ptr, counter_ptr, bank_u8, bank_bf16, bank_f32, block_bytes, H, I, K,
                   q, gu_per_pair,
                   GW: tl.constexpr, GS: tl.constexpr, GG: tl.constexpr,
                   UW: tl.constexpr, US: tl.constexpr, UG: tl.constexpr, FMT: tl.constexpr,
                   BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr):
    """Producer q in [0, T*K*gu_per_pair): rows block q % gu_per_pair of h[pair = q // gu_per_pair],
    then one release increment of the pair's counter."""
    pair = q // gu_per_pair
    rows = (q % gu_per_pair) * BLOCK_I + tl.arange(0, BLOCK_I)
    _gate_up_rows(x_ptr, h_ptr, slot_ptr, bank_u8, bank_bf16, bank_f32, block_bytes, H, I, K, pair, rows,
                  GW, GS, GG, UW, US, UG, FMT, BLOCK_I, BLOCK_K)
    # Every thread's h stores happen before the one thread that performs the scalar atomic
    # releases them (the CUTLASS semaphore pattern: __syncthreads, then st.release.gpu).
    tl.debug_barrier()
    tl.atomic_add(counter_ptr + pair, 1, sem="release")


@triton.jit
def _wait_for(counter, target, factor, INTERPRET: tl.constexpr):
    """Spin until *counter >= target (acquire); returns `factor` (NaN in the interpreter if the
    counter is short, where programs run one by one in grid order, so the producers are done:
    check, don't spin, or a bug would hang the test suite). One thread does each scalar atomic
    and Triton broadcasts its result through shared memory behind a barrier, so the loop is
    uniform and every thread's later loads come after the acquire."""
    if INTERPRET:
        ready = tl.atomic_add(counter, 0, sem="acquire")
        factor = factor * tl.where(ready >= target, 1.0, float("nan"))
    else:
        while tl.atomic_add(counter, 0, sem="acquire") < target:
            pass
    return factor


@triton.jit
def _check_out(counter, final):
    """Count one consumer out; the last of `final` counts puts the counter back to 0 for the next
    launch (every consumer that waits on it has passed its wait by then)."""
    seen = tl.atomic_add(counter, 1, sem="acq_rel")
    if seen == final - 1:
        tl.atomic_xchg(counter, 0, sem="relaxed")


@triton.jit
def _fused_down(h_ptr, out_ptr, slot_ptr, weight_ptr, counter_ptr, bank_u8, bank_bf16, bank_f32, block_bytes,
                H, I, K, q, gu_per_pair, down_per_pair,
                DW: tl.constexpr, DS: tl.constexpr, DG: tl.constexpr, FMT: tl.constexpr,
                BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
                PRE_A: tl.constexpr, PRE_B: tl.constexpr, TAIL: tl.constexpr, INTERPRET: tl.constexpr):
    """Consumer q in [0, T*K*down_per_pair): rows block q % down_per_pair of down_e h[pair] for
    pair = q // down_per_pair, times the routing weight, atomically added into out[token]."""
    pair = q // down_per_pair
    rows = (q % down_per_pair) * BLOCK_H + tl.arange(0, BLOCK_H)
    slot = tl.load(slot_ptr + pair)
    n = tl.where(slot >= 0, H, 0)                             # skipped pair: no reads, nothing added
    base = tl.maximum(slot, 0).to(tl.int64) * block_bytes
    # 1. Everything that does not depend on h: the down weight words of columns [0, PRE_A + PRE_B)
    #    (all of I unless config.preload caps it), the row scale and the routing weight.
    if PRE_A > 0:
        words_a, scales_a = _raw_tile(bank_u8, bank_bf16, base + DW, base + DS, rows, 0, n, I, FMT, BLOCK_H, PRE_A)
    if PRE_B > 0:
        words_b, scales_b = _raw_tile(bank_u8, bank_bf16, base + DW, base + DS, rows, PRE_A, n, I, FMT, BLOCK_H, PRE_B)
    factor = row_scale(bank_f32, base + DS, base + DG, rows, n, FMT) * tl.load(weight_ptr + pair)
    # 2. Wait for the pair's gate_up producers (gu_per_pair release increments).
    factor = _wait_for(counter_ptr + pair, gu_per_pair, factor, INTERPRET)
    # 3. Decode, dot with h, then the columns that were not preloaded, BLOCK_K at a time.
    h_row = h_ptr + pair * I
    part = tl.zeros([BLOCK_H], dtype=tl.float32)
    if PRE_A > 0:
        part += _raw_dot(words_a, scales_a, h_row, 0, I, FMT, BLOCK_H, PRE_A)
    if PRE_B > 0:
        part += _raw_dot(words_b, scales_b, h_row, PRE_A, I, FMT, BLOCK_H, PRE_B)
    if TAIL:
        for i0 in range(PRE_A + PRE_B, I, BLOCK_K):
            words, scales = _raw_tile(bank_u8, bank_bf16, base + DW, base + DS, rows, i0, n, I, FMT, BLOCK_H, BLOCK_K)
            part += _raw_dot(words, scales, h_row, i0, I, FMT, BLOCK_H, BLOCK_K)
    tl.atomic_add(out_ptr + (pair // K) * H + rows, part * factor, mask=rows < n, sem="relaxed")
    # 4. Self-cleaning counter, counted last: after its wait the count is off the critical path
    #    (on an H200 that saved 1.6 us of 19.7 against counting right after the wait).
    _check_out(counter_ptr + pair, gu_per_pair + down_per_pair)


@triton.jit
def _fused_kernel(x_ptr, h_ptr, out_ptr, slot_ptr, weight_ptr, counter_ptr, bank_u8, bank_bf16, bank_f32,
                  block_bytes, H, I, K, n_gate_up, gu_per_pair, down_per_pair,
                  GW: tl.constexpr, GS: tl.constexpr, GG: tl.constexpr,
                  UW: tl.constexpr, US: tl.constexpr, UG: tl.constexpr,
                  DW: tl.constexpr, DS: tl.constexpr, DG: tl.constexpr, FMT: tl.constexpr,
                  BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
                  PRE_A: tl.constexpr, PRE_B: tl.constexpr, TAIL: tl.constexpr, INTERPRET: tl.constexpr):
    """Both passes in one launch, 1-D grid: programs [0, n_gate_up) are gate_up producers,
    the rest split-down consumers (see the module docstring). out must be zero on entry.

    Deadlock freedom: a consumer only waits for producers, which have lower program ids, and CUDA
    hands out the blocks of a 1-D grid in increasing index order (not a documented guarantee, but
    what every GPU does and what stream-K style kernels rely on), so every producer has been given
    a multiprocessor (and then runs to completion, it waits on nothing) before any consumer can
    occupy one. The interpreter runs programs one after another in index order: no wait at all."""
    pid = tl.program_id(0)
    if pid < n_gate_up:
        _fused_gate_up(x_ptr, h_ptr, slot_ptr, counter_ptr, bank_u8, bank_bf16, bank_f32, block_bytes,
                       H, I, K, pid, gu_per_pair, GW, GS, GG, UW, US, UG, FMT, BLOCK_I, BLOCK_K)
    else:
        _fused_down(h_ptr, out_ptr, slot_ptr, weight_ptr, counter_ptr, bank_u8, bank_bf16, bank_f32, block_bytes,
                    H, I, K, pid - n_gate_up, gu_per_pair, down_per_pair, DW, DS, DG, FMT,
                    BLOCK_H, BLOCK_K, PRE_A, PRE_B, TAIL, INTERPRET)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _check_inputs(x, bank, slots, weights, fmt, offsets, intermediate):
    if fmt not in FORMATS:
        raise ValueError(f"unknown expert format {fmt!r}")
    if x.dim() != 2 or bank.dim() != 2 or slots.shape != weights.shape or slots.shape[0] != x.shape[0]:
        raise ValueError(f"shapes: x {tuple(x.shape)}, bank {tuple(bank.shape)}, slots {tuple(slots.shape)}, "
                         f"weights {tuple(weights.shape)}: want x [T,H], bank [S,B], slots/weights [T,K]")
    if bank.dtype != torch.uint8 or slots.dtype != torch.int32 or weights.dtype != torch.float32:
        raise TypeError(f"dtypes: bank {bank.dtype} (uint8), slots {slots.dtype} (int32), weights {weights.dtype} (float32)")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"x must be float32, bfloat16 or float16, not {x.dtype}")
    for name, t in (("x", x), ("bank", bank), ("slots", slots), ("weights", weights)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if t.device != x.device or (t.device.type != "cuda" and not _interpreting()):
            raise ValueError(f"{name} must be on the GPU with the others (or set TRITON_INTERPRET=1 for CPU)")
    if bank.shape[1] % 4096 or any(off % 256 for off in offsets.values()):
        raise ValueError("blocks must be 4096-byte multiples with 256-byte aligned fields")
    if fmt == "nvfp4" and (x.shape[1] % 16 or intermediate % 16):
        raise ValueError("nvfp4 needs hidden and intermediate sizes divisible by 16")


_COUNTER_PAIRS = 4096          # T*K pairs the shared per-device counter buffer serves
_counters: dict[torch.device, torch.Tensor] = {}


def fused_counters(device: torch.device | str) -> torch.Tensor:
    """The zeroed int32 [_COUNTER_PAIRS] counter buffer that fused launches on `device` share,
    made on first use. Call it (or run one fused moe_decode) before a CUDA graph capture: it
    cannot be made during one."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    buf = _counters.get(device)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("moe_decode(fused): the counter buffer must be made outside CUDA graph capture: "
                               "call kernels.moe_decode.fused_counters(device) or run moe_decode once before "
                               "capturing, or pass counters=")
        buf = _counters[device] = torch.zeros(_COUNTER_PAIRS, dtype=torch.int32, device=device)
    return buf


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _prev_pow2(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def _preload_split(fmt: str, intermediate: int, block_h: int, num_warps: int, preload: int) -> tuple[int, int]:
    """(PRE_A, PRE_B): the power-of-two column tiles of down's reduction (I) that a fused down program
    loads before its wait; each >= 16 (nvfp4 group) or 0. Covers all of I (the last tile rounded
    up, masked) unless that passes `preload` bytes a thread; then the first columns that fit."""
    if preload <= 0:
        return 0, 0
    budget = preload * 32 * num_warps
    cap = max(16, int(budget / (block_h * {"bf16": 2.0, "fp8": 1.0, "nvfp4": 9 / 16}[fmt])))
    if intermediate <= cap:
        a = max(16, _prev_pow2(intermediate))
        rest = intermediate - a
        return a, (max(16, _next_pow2(rest)) if rest > 0 else 0)
    a = _prev_pow2(cap)
    rest = cap - a
    return a, (_prev_pow2(rest) if rest >= 16 else 0)


def moe_decode(x: torch.Tensor, bank: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor, fmt: str,
               offsets: Mapping[str, int], intermediate: int, config: DecodeConfig | None = None,
               out: torch.Tensor | None = None, h_buf: torch.Tensor | None = None,
               counters: torch.Tensor | None = None, accumulate: bool = False) -> torch.Tensor:
    """sum_k weights[t,k] * expert_{slots[t,k]}(x[t]) -> [T, H] float32 (the caller adds it to its
    residual). A negative slot skips that (token, choice): no bytes are read for it (a launch over
    the experts that are resident while the others are still copying). `out` ([T, H] fp32) and
    `h_buf` ([T*K, I] fp32) may be given so that the call allocates nothing (CUDA graphs);
    accumulate=True adds into `out` instead of overwriting it. `counters` (fused only): a zeroed
    int32 buffer of >= T*K elements that the kernel leaves zeroed; default the shared per-device
    one (fused_counters)."""
    _check_inputs(x, bank, slots, weights, fmt, offsets, intermediate)
    if accumulate and out is None:
        raise ValueError("moe_decode(accumulate=True) needs the out= tensor to add into")
    cfg = config or default_config(fmt)
    num_tokens, hidden = x.shape
    top_k = slots.shape[1]
    pairs = num_tokens * top_k
    fmt_id = FORMAT_IDS[fmt]
    if cfg.fused:
        if counters is None:
            counters = fused_counters(x.device)
        if counters.dtype != torch.int32 or not counters.is_contiguous() or counters.device != x.device:
            raise ValueError(f"counters must be a contiguous int32 tensor on {x.device}, "
                             f"not {counters.dtype} on {counters.device}")
        if pairs > counters.numel():
            raise ValueError(f"moe_decode(fused): {num_tokens} tokens x {top_k} experts = {pairs} (token, expert) "
                             f"pairs, more than the {counters.numel()} counters; pass a larger counters= buffer "
                             f"or use a config with fused=False")
    if h_buf is None:
        h_buf = torch.empty(pairs, intermediate, device=x.device, dtype=torch.float32)
    if out is None:
        out = torch.empty(num_tokens, hidden, device=x.device, dtype=torch.float32)
    block_bytes = bank.shape[1]
    views = (bank, bank.view(torch.bfloat16), bank.view(torch.float32))
    off = {name: offsets.get(name, 0) for name in
           ("gate.w", "gate.scale", "gate.gscale", "up.w", "up.scale", "up.gscale", "down.w", "down.scale", "down.gscale")}
    launch = {"num_warps": cfg.num_warps}
    if cfg.num_stages is not None:
        launch["num_stages"] = cfg.num_stages
    if cfg.fused:
        gu_per_pair = triton.cdiv(intermediate, cfg.block_i)
        down_per_pair = triton.cdiv(hidden, cfg.block_h)
        pre_a, pre_b = _preload_split(fmt, intermediate, cfg.block_h, cfg.num_warps, cfg.preload)
        # The consumers add into out. Zeroing it in the kernel instead (the producers of each
        # token's k = 0 pair zero it before their release; consumers of the token's other pairs
        # also wait for that pair) measured 0.3-2 us slower on an H200 than this memset node.
        if not accumulate:
            out.zero_()
        _fused_kernel[(pairs * (gu_per_pair + down_per_pair),)](
            x, h_buf, out, slots, weights, counters, *views, block_bytes, hidden, intermediate, top_k,
            pairs * gu_per_pair, gu_per_pair, down_per_pair,
            off["gate.w"], off["gate.scale"], off["gate.gscale"], off["up.w"], off["up.scale"], off["up.gscale"],
            off["down.w"], off["down.scale"], off["down.gscale"], fmt_id,
            cfg.block_i, cfg.block_h, cfg.block_k, pre_a, pre_b, pre_a + pre_b < intermediate, _interpreting(),
            **launch)
        return out
    _gate_up_kernel[(pairs, triton.cdiv(intermediate, cfg.block_i))](
        x, h_buf, out, slots, *views, block_bytes, hidden, intermediate, top_k,
        off["gate.w"], off["gate.scale"], off["gate.gscale"], off["up.w"], off["up.scale"], off["up.gscale"],
        fmt_id, cfg.block_i, cfg.block_k, cfg.split_down and not accumulate, **launch)
    _down_kernel[(num_tokens * (top_k if cfg.split_down else 1), triton.cdiv(hidden, cfg.block_h))](
        h_buf, out, slots, weights, *views, block_bytes, hidden, intermediate, top_k,
        off["down.w"], off["down.scale"], off["down.gscale"],
        fmt_id, cfg.block_h, cfg.block_k, cfg.split_down, accumulate, **launch)
    return out


def moe_decode_ref(x: torch.Tensor, bank: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor, fmt: str,
                   offsets: Mapping[str, int], intermediate: int, config: DecodeConfig | None = None,
                   out: torch.Tensor | None = None, h_buf: torch.Tensor | None = None,
                   counters: torch.Tensor | None = None, accumulate: bool = False) -> torch.Tensor:
    """Plain-torch specification (and fallback, same signature): float32 math and result, each
    distinct expert dequantized once; negative slots are skipped; accumulate adds into `out`.
    `config`, `h_buf` and `counters` are accepted and ignored."""
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
        h = torch.nn.functional.silu(xs @ w["gate"].T) * (xs @ w["up"].T)            # [n, I]
        acc.index_add_(0, token_ids, (h @ w["down"].T) * weights[token_ids, choice][:, None])
    if out is None:
        return acc
    return out.add_(acc) if accumulate else out.copy_(acc)
