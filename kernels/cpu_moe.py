"""One int8 expert on the CPU, fused: gate and up, the activation, down, scaled by the routing weight
and added into the layer's output, in two parallel loops (numba, compiled on first use; no C compiler).

  T = tokens, H = hidden, I = intermediate
  x [T, H] float32, the block's parts (formats.py, int8: w int8 [out, in], scale bf16 [out], biases
  float32 where the family has them), tokens [t] int64 (rows of x routed here), weight [t] float32
  -> y[tokens] += weight * expert(x[tokens])   (y [T, H] float32)

The reference is the family's torch expert over the dequantised weights (swiglu_mlp / the clamped
variants, kernels.activation): each product is x * (w * scale) as there (w * scale is exact in
float32: 8 by 8 significant bits), only the order of the sums differs. Why: torch has no fast int8
matmul for float32 activations (its `_weight_int8pack_mm` takes 1.5 ms for a 1024 x 2048 projection
in float32 on the 2-core dev machine, 0.23 ms in bf16), so the CPU device dequantised slabs of rows
(~1 ms a projection); this reads the int8 codes once (~0.23 ms, the memory's speed there), and one
call does the expert's three projections, its activation and the weighted add that took ~8 torch calls.
`available()` is False where numba is missing; callers then keep the torch path.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .activation import ACTIVATION_IDS, Activation

try:
    import numba
    from numba import njit, prange
except ImportError:                        # noqa: the torch path serves
    numba = None

# Reassociation and contraction only: the sums may be vectorised, exp and division stay exact.
_FAST = {"reassoc", "contract"}
ROWS = 16       # weight rows a parallel iteration takes (each dequantised once into a small scratch row)


def available() -> bool:
    return numba is not None


if numba is not None:
    @njit(cache=True, nogil=True)
    def _bf16_to_f32(bits):
        """bf16 values given as their int16 bit patterns -> float32 (exact: the top half of the bits)."""
        out = np.empty(bits.shape[0], np.uint32)
        for i in range(bits.shape[0]):
            out[i] = np.uint32(np.uint16(bits[i])) << np.uint32(16)
        return out.view(np.float32)

    @njit(cache=True, nogil=True, inline="always")
    def _activate(g, u, act, alpha, limit):
        if act != 0:                                  # the clamped variants (gpt-oss, DeepSeek-V4)
            g = min(g, limit)
            u = min(max(u, -limit), limit)
        if act == 1:                                  # clamped_swiglu
            return (u + np.float32(1.0)) * (g / (np.float32(1.0) + np.float32(math.exp(-g * alpha))))
        return g / (np.float32(1.0) + np.float32(math.exp(-g))) * u   # silu(g) * u

    @njit(cache=True, nogil=True, fastmath=_FAST, inline="always")
    def _row(q, r, scale, out):
        """Row r of an int8 weight, dequantised into out (float32)."""
        for i in range(out.shape[0]):
            out[i] = np.float32(q[r, i]) * scale

    @njit(cache=True, nogil=True, fastmath=_FAST, inline="always")
    def _dots(a, b, out):
        """out[j] = a[j] . b for every row j of a, four rows a pass (b is read once for the four)."""
        n = a.shape[0]
        for j in range(0, n - 3, 4):
            s0 = s1 = s2 = s3 = np.float32(0.0)
            for i in range(b.shape[0]):
                s0 += a[j, i] * b[i]
                s1 += a[j + 1, i] * b[i]
                s2 += a[j + 2, i] * b[i]
                s3 += a[j + 3, i] * b[i]
            out[j], out[j + 1], out[j + 2], out[j + 3] = s0, s1, s2, s3
        for j in range(n - n % 4, n):
            acc = np.float32(0.0)
            for i in range(b.shape[0]):
                acc += a[j, i] * b[i]
            out[j] = acc

    @njit(cache=True, nogil=True, fastmath=_FAST, inline="always")
    def _row_dot(a, q, r, scale):
        """a . (row r of an int8 weight, dequantised): one token, no scratch row."""
        acc = np.float32(0.0)
        for i in range(a.shape[0]):
            acc += a[i] * (np.float32(q[r, i]) * scale)
        return acc

    @njit(cache=True, nogil=True, parallel=True, fastmath=_FAST)
    def _expert_into(x, tokens, weight, gq, gs_bits, uq, us_bits, dq, ds_bits, gb, ub, db, act, alpha, limit, y):
        inter, hidden = gq.shape
        n = tokens.shape[0]
        gs, us, ds = _bf16_to_f32(gs_bits), _bf16_to_f32(us_bits), _bf16_to_f32(ds_bits)
        xs = np.empty((n, hidden), np.float32)        # the rows routed here, gathered
        for j in range(n):
            xs[j] = x[tokens[j]]
        h = np.empty((n, inter), np.float32)
        chunks = (inter + ROWS - 1) // ROWS
        for c in prange(chunks):                      # gate and up rows, then the activation
            wg = np.empty(hidden, np.float32)         # a row dequantised once, then used by every token
            wu = np.empty(hidden, np.float32)
            g = np.empty(n, np.float32)
            u = np.empty(n, np.float32)
            for r in range(c * ROWS, min((c + 1) * ROWS, inter)):
                if n == 1:
                    g[0] = _row_dot(xs[0], gq, r, gs[r])
                    u[0] = _row_dot(xs[0], uq, r, us[r])
                else:
                    _row(gq, r, gs[r], wg)
                    _row(uq, r, us[r], wu)
                    _dots(xs, wg, g)
                    _dots(xs, wu, u)
                for j in range(n):
                    gj, uj = g[j], u[j]
                    if gb.shape[0]:
                        gj += gb[r]
                        uj += ub[r]
                    h[j, r] = _activate(gj, uj, act, np.float32(alpha), np.float32(limit))
        chunks = (hidden + ROWS - 1) // ROWS
        for c in prange(chunks):                      # down rows, weighted into y
            wd = np.empty(inter, np.float32)
            d = np.empty(n, np.float32)
            for o in range(c * ROWS, min((c + 1) * ROWS, hidden)):
                if n == 1:
                    d[0] = _row_dot(h[0], dq, o, ds[o])
                else:
                    _row(dq, o, ds[o], wd)
                    _dots(h, wd, d)
                for j in range(n):
                    acc = d[j]
                    if db.shape[0]:
                        acc += db[o]
                    y[tokens[j], o] += weight[j] * acc


_NO_BIAS = np.zeros(0, np.float32)


def expert_into(y: torch.Tensor, x: torch.Tensor, parts: dict[str, dict[str, torch.Tensor]], tokens: torch.Tensor,
                weight: torch.Tensor, activation: Activation) -> None:
    """y[tokens] += weight[:, None] * expert(x[tokens]) for one int8 block's parts (see the module doc).
    x, y float32 contiguous; tokens int64, weight float32, both [t]."""
    def bits(name):
        return parts[name]["scale"].view(torch.int16).numpy()

    def bias(name):
        return parts[name]["b"].numpy() if name in parts else _NO_BIAS

    _expert_into(x.numpy(), tokens.numpy(), weight.numpy(), parts["gate"]["w"].numpy(), bits("gate"),
                 parts["up"]["w"].numpy(), bits("up"), parts["down"]["w"].numpy(), bits("down"),
                 bias("gate_bias"), bias("up_bias"), bias("down_bias"),
                 ACTIVATION_IDS[activation.name], activation.alpha, activation.limit, y.numpy())


def set_threads(count: int) -> None:
    """The fused loops' threads (numba's own pool; torch's is set apart)."""
    if numba is not None:
        numba.set_num_threads(max(1, min(count, numba.config.NUMBA_NUM_THREADS)))
