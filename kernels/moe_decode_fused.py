"""The single-launch variant of the MoE decode kernel (moe_decode with config.fused): both passes in
one launch, for one MoE layer at decode.

Fused (one launch, 1-D grid of T*K * (I/BLOCK_I + H/BLOCK_H) programs, pair = t*K + k major):
  programs [0, T*K*I/BLOCK_I)  gate_up producers: the work of moe_decode's gate_up launch, then a release increment of an
                               int32 counter of their pair once their h rows are stored;
  the rest                     split-down consumers (pair, BLOCK_H rows of H): they first load their
                               down weight tile, which does not depend on h, so these reads overlap
                               the gate_up tail instead of starting cold after a launch gap; then
                               they spin (acquire) until the pair's counter reaches I/BLOCK_I, read
                               h[pair] and atomically add weight * (down_e h + bias) into out (zeroed by
                               the launcher just before).
  Preload: the words loaded before the wait are columns [0, PRE_A + PRE_B) of I as two
  power-of-two tiles (PRE_A = the largest power of two <= I, PRE_B = the rest rounded up and
  masked: I = 768 is 512 + 256, I = 1024 one tile, no padding), kept as stored words (1 byte an
  element for fp8 and int8, 2 for bf16, 9/16 for nvfp4 with its group scales) and decoded only after the
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

import torch
import triton
import triton.language as tl

from .formats import FORMAT_IDS
from .tiles import bias_rows, gate_up_rows, interpreting, raw_dot, raw_tile, row_scale


@triton.jit
def _fused_gate_up(x_ptr, h_ptr, slot_ptr, counter_ptr, bank_u8, bank_bf16, bank_f32, block_bytes, H, I, K,
                   q, gu_per_pair, alpha, limit,
                   GW: tl.constexpr, GS: tl.constexpr, GG: tl.constexpr,
                   UW: tl.constexpr, US: tl.constexpr, UG: tl.constexpr, GB: tl.constexpr, UB: tl.constexpr,
                   FMT: tl.constexpr, ACT: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr):
    """Producer q in [0, T*K*gu_per_pair): rows block q % gu_per_pair of h[pair = q // gu_per_pair],
    then one release increment of the pair's counter."""
    pair = q // gu_per_pair
    rows = (q % gu_per_pair) * BLOCK_I + tl.arange(0, BLOCK_I)
    gate_up_rows(x_ptr, h_ptr, slot_ptr, bank_u8, bank_bf16, bank_f32, block_bytes, H, I, K, pair, rows, alpha, limit,
                  GW, GS, GG, UW, US, UG, GB, UB, FMT, ACT, BLOCK_I, BLOCK_K, slot_ptr, False)   # (no bases here)
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
                DW: tl.constexpr, DS: tl.constexpr, DG: tl.constexpr, DB: tl.constexpr, FMT: tl.constexpr,
                BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
                PRE_A: tl.constexpr, PRE_B: tl.constexpr, TAIL: tl.constexpr, INTERPRET: tl.constexpr):
    """Consumer q in [0, T*K*down_per_pair): rows block q % down_per_pair of down_e h[pair] for
    pair = q // down_per_pair, plus the down bias, times the routing weight, atomically added into out[token]."""
    pair = q // down_per_pair
    rows = (q % down_per_pair) * BLOCK_H + tl.arange(0, BLOCK_H)
    slot = tl.load(slot_ptr + pair)
    n = tl.where(slot >= 0, H, 0)                             # skipped pair: no reads, nothing added
    base = tl.maximum(slot, 0).to(tl.int64) * block_bytes
    # 1. Everything that does not depend on h: the down weight words of columns [0, PRE_A + PRE_B)
    #    (all of I unless config.preload caps it), the row scale, the down bias and the routing weight.
    if PRE_A > 0:
        words_a, scales_a = raw_tile(bank_u8, bank_bf16, base + DW, base + DS, rows, 0, n, I, FMT, BLOCK_H, PRE_A)
    if PRE_B > 0:
        words_b, scales_b = raw_tile(bank_u8, bank_bf16, base + DW, base + DS, rows, PRE_A, n, I, FMT, BLOCK_H, PRE_B)
    factor = row_scale(bank_bf16, bank_f32, base + DS, base + DG, rows, n, FMT)
    bias = bias_rows(bank_f32, base + DB, rows, n, DB)
    weight = tl.load(weight_ptr + pair)
    # 2. Wait for the pair's gate_up producers (gu_per_pair release increments).
    weight = _wait_for(counter_ptr + pair, gu_per_pair, weight, INTERPRET)
    # 3. Decode, dot with h, then the columns that were not preloaded, BLOCK_K at a time.
    h_row = h_ptr + pair * I
    part = tl.zeros([BLOCK_H], dtype=tl.float32)
    if PRE_A > 0:
        part += raw_dot(words_a, scales_a, h_row, 0, I, FMT, BLOCK_H, PRE_A)
    if PRE_B > 0:
        part += raw_dot(words_b, scales_b, h_row, PRE_A, I, FMT, BLOCK_H, PRE_B)
    if TAIL:
        for i0 in range(PRE_A + PRE_B, I, BLOCK_K):
            words, scales = raw_tile(bank_u8, bank_bf16, base + DW, base + DS, rows, i0, n, I, FMT, BLOCK_H, BLOCK_K)
            part += raw_dot(words, scales, h_row, i0, I, FMT, BLOCK_H, BLOCK_K)
    tl.atomic_add(out_ptr + (pair // K) * H + rows, (part * factor + bias) * weight, mask=rows < n, sem="relaxed")
    # 4. Self-cleaning counter, counted last: after its wait the count is off the critical path
    #    (on an H200 that saved 1.6 us of 19.7 against counting right after the wait).
    _check_out(counter_ptr + pair, gu_per_pair + down_per_pair)


@triton.jit
def _fused_kernel(x_ptr, h_ptr, out_ptr, slot_ptr, weight_ptr, counter_ptr, bank_u8, bank_bf16, bank_f32,
                  block_bytes, H, I, K, n_gate_up, gu_per_pair, down_per_pair, alpha, limit,
                  GW: tl.constexpr, GS: tl.constexpr, GG: tl.constexpr,
                  UW: tl.constexpr, US: tl.constexpr, UG: tl.constexpr, GB: tl.constexpr, UB: tl.constexpr,
                  DW: tl.constexpr, DS: tl.constexpr, DG: tl.constexpr, DB: tl.constexpr,
                  FMT: tl.constexpr, ACT: tl.constexpr,
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
                       H, I, K, pid, gu_per_pair, alpha, limit, GW, GS, GG, UW, US, UG, GB, UB, FMT, ACT,
                       BLOCK_I, BLOCK_K)
    else:
        _fused_down(h_ptr, out_ptr, slot_ptr, weight_ptr, counter_ptr, bank_u8, bank_bf16, bank_f32, block_bytes,
                    H, I, K, pid - n_gate_up, gu_per_pair, down_per_pair, DW, DS, DG, DB, FMT,
                    BLOCK_H, BLOCK_K, PRE_A, PRE_B, TAIL, INTERPRET)


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
    loads before its wait; each >= one scale group (16 nvfp4, 32 mxfp4, 16 otherwise) or 0. Covers
    all of I (the last tile rounded up, masked) unless that passes `preload` bytes a thread; then the
    first columns that fit."""
    if preload <= 0:
        return 0, 0
    group = 32 if fmt == "mxfp4" else 16
    budget = preload * 32 * num_warps
    cap = max(group, int(budget / (block_h * {"bf16": 2.0, "fp8": 1.0, "int8": 1.0, "nvfp4": 9 / 16, "mxfp4": 17 / 32}[fmt])))
    if intermediate <= cap:
        a = max(group, _prev_pow2(intermediate))
        rest = intermediate - a
        return a, (max(group, _next_pow2(rest)) if rest > 0 else 0)
    a = _prev_pow2(cap)
    rest = cap - a
    return a, (_prev_pow2(rest) if rest >= group else 0)

def checked_counters(counters: torch.Tensor | None, device: torch.device, pairs: int) -> torch.Tensor:
    """The counter buffer a fused launch of `pairs` (token, expert) pairs uses: the given one, checked,
    or the shared per-device one."""
    if counters is None:
        counters = fused_counters(device)
    if counters.dtype != torch.int32 or not counters.is_contiguous() or counters.device != device:
        raise ValueError(f"counters must be a contiguous int32 tensor on {device}, "
                         f"not {counters.dtype} on {counters.device}")
    if pairs > counters.numel():
        raise ValueError(f"moe_decode(fused): {pairs} (token, expert) pairs, more than the {counters.numel()} "
                         f"counters; pass a larger counters= buffer or use a config with fused=False")
    return counters


def launch_fused(x, h_buf, out, slots, weights, counters, views, off, fmt, intermediate, cfg, accumulate, act, launch):
    """The one launch (moe_decode's arguments, already checked; `off` the field offsets by name, `act`
    the activation's (alpha, limit, kernel id))."""
    num_tokens, hidden = x.shape
    top_k = slots.shape[1]
    pairs = num_tokens * top_k
    gu_per_pair = triton.cdiv(intermediate, cfg.block_i)
    down_per_pair = triton.cdiv(hidden, cfg.block_h)
    pre_a, pre_b = _preload_split(fmt, intermediate, cfg.block_h, cfg.num_warps, cfg.preload)
    # The consumers add into out. Zeroing it in the kernel instead (the producers of each
    # token's k = 0 pair zero it before their release; consumers of the token's other pairs
    # also wait for that pair) measured 0.3-2 us slower on an H200 than this memset node.
    if not accumulate:
        out.zero_()
    _fused_kernel[(pairs * (gu_per_pair + down_per_pair),)](
        x, h_buf, out, slots, weights, counters, *views, views[0].shape[1], hidden, intermediate, top_k,
        pairs * gu_per_pair, gu_per_pair, down_per_pair, act[0], act[1],
        off["gate.w"], off["gate.scale"], off["gate.gscale"], off["up.w"], off["up.scale"], off["up.gscale"],
        off["gate_bias.b"], off["up_bias.b"], off["down.w"], off["down.scale"], off["down.gscale"], off["down_bias.b"],
        FORMAT_IDS[fmt], act[2],
        cfg.block_i, cfg.block_h, cfg.block_k, pre_a, pre_b, pre_a + pre_b < intermediate, interpreting(),
        **launch)
