"""int8 experts on the CPU, fused: gate and up, the activation, down, scaled by the routing weight and
added into the layer's output, a layer's experts in two parallel loops (numba, compiled on first use;
no C compiler).

  T = tokens, H = hidden, I = intermediate
  x [T, H] float32; per expert e: its block (uint8, the engine's layout: kernels.formats.block_fields,
  int8: w int8 [out, in], scale bf16 [out], biases float32 where the family has them), tokens_e [t_e]
  int64 (rows of x routed to it), weight_e [t_e] float32
  -> y[tokens_e] += weight_e * expert_e(x[tokens_e]) for each e in order   (y [T, H] float32)
  Ungated blocks (no gate fields, relu2: Nemotron-H's) skip the gate rows: h = relu(up x)^2.

The reference is the family's torch expert over the dequantised weights (swiglu_mlp / the clamped
variants, kernels.activation): each product is x * (w * scale) as there (w * scale is exact in
float32: 8 by 8 significant bits), only the order of the sums differs. Why: torch has no fast int8
matmul for float32 activations (its `_weight_int8pack_mm` takes 1.5 ms for a 1024 x 2048 projection
in float32 on the 2-core dev machine, 0.23 ms in bf16), so the CPU device dequantised slabs of rows
(~1 ms a projection); this reads the int8 codes once (~0.23 ms, the memory's speed there), and one
call does the three projections, activation and weighted add of up to MAX_BLOCKS experts that took ~8
torch calls each. One call for a layer's experts, not one each: each parallel loop costs its threads a
wake-up and a join, which on the 16-core GPU box is a large part of one expert's ~100 us.
`available()` is False where numba is missing; callers then keep the torch path.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .activation import ACTIVATION_IDS, Activation
from .formats import is_gated

try:
    import numba
    from numba import njit, prange
except ImportError:                        # noqa: the torch path serves
    numba = None
else:
    from .cpu_rows import FAST as _FAST, bf16_scales, dots, row, row_dot

ROWS = 16       # weight rows a parallel iteration takes (each dequantised once into a small scratch row)


def available() -> bool:
    return numba is not None


if numba is not None:
    @njit(cache=True, nogil=True, inline="always")
    def _activate(g, u, act, alpha, limit):
        if act == 3:                                  # relu2: up alone (g is unused)
            r = max(u, np.float32(0.0))
            return r * r
        if act != 0:                                  # the clamped variants (gpt-oss, DeepSeek-V4)
            g = min(g, limit)
            u = min(max(u, -limit), limit)
        if act == 1:                                  # clamped_swiglu
            return (u + np.float32(1.0)) * (g / (np.float32(1.0) + np.float32(math.exp(-g * alpha))))
        return g / (np.float32(1.0) + np.float32(math.exp(-g))) * u   # silu(g) * u

    @njit(cache=True, nogil=True, fastmath=_FAST, inline="always")
    def _gate_up_rows(xs, b, off, first, n, c, inter, hidden, bias, gated, act, alpha, limit, h):
        """Rows c * ROWS.. of one expert's gate (where `gated`) and up (block b) for its n gathered rows
        xs[first:first + n], activated into h[first:first + n] at those columns."""
        gq = b[off[0]:off[0] + inter * hidden].view(np.int8).reshape((inter, hidden))
        uq = b[off[2]:off[2] + inter * hidden].view(np.int8).reshape((inter, hidden))
        rows = min(ROWS, inter - c * ROWS)
        gs = np.empty(ROWS, np.float32)
        us = np.empty(ROWS, np.float32)
        bf16_scales(b[off[1]:off[1] + 2 * inter].view(np.int16), c * ROWS, rows, gs)
        bf16_scales(b[off[3]:off[3] + 2 * inter].view(np.int16), c * ROWS, rows, us)
        gb = b[off[6]:off[6] + 4 * inter].view(np.float32)    # (the biases: read only where the block has them)
        ub = b[off[7]:off[7] + 4 * inter].view(np.float32)
        wg = np.empty(hidden, np.float32)             # a row dequantised once, then used by every token
        wu = np.empty(hidden, np.float32)
        g = np.zeros(n, np.float32)                   # stays zero for an ungated block
        u = np.empty(n, np.float32)
        for i in range(rows):
            r = c * ROWS + i
            if n == 1:
                if gated:
                    g[0] = row_dot(xs[first], gq, r, gs[i])
                u[0] = row_dot(xs[first], uq, r, us[i])
            else:
                if gated:
                    row(gq, r, gs[i], wg)
                    dots(xs[first:first + n], wg, g)
                row(uq, r, us[i], wu)
                dots(xs[first:first + n], wu, u)
            for j in range(n):
                gj, uj = g[j], u[j]
                if bias:
                    gj += gb[r]
                    uj += ub[r]
                h[first + j, r] = _activate(gj, uj, act, np.float32(alpha), np.float32(limit))

    @njit(cache=True, nogil=True, fastmath=_FAST, inline="always")
    def _down_rows_into(h, b, off, first, n, c, inter, hidden, bias, tokens, weight, ds, wd, d, y):
        """Output columns c * ROWS.. of one expert's down projection (block b) over its activations
        h[first:first + n], weighted and added into y at its tokens; ds, wd, d: scratch."""
        rows = min(ROWS, hidden - c * ROWS)
        dq = b[off[4]:off[4] + hidden * inter].view(np.int8).reshape((hidden, inter))
        db = b[off[8]:off[8] + 4 * hidden].view(np.float32)
        bf16_scales(b[off[5]:off[5] + 2 * hidden].view(np.int16), c * ROWS, rows, ds)
        for i in range(rows):
            o = c * ROWS + i
            if n == 1:
                d[0] = row_dot(h[first], dq, o, ds[i])
            else:
                row(dq, o, ds[i], wd)
                dots(h[first:first + n], wd, d)
            for j in range(n):
                acc = d[j]
                if bias:
                    acc += db[o]
                y[tokens[first + j], o] += weight[first + j] * acc

    @njit(cache=True, nogil=True, parallel=True, fastmath=_FAST)
    def _experts_into(x, tokens, weight, starts, blocks, off, inter, hidden, bias, gated, act, alpha, limit, y):
        """Experts e = 0..E-1 (blocks[e], the rows tokens[starts[e]:starts[e + 1]] of x with their weights):
        every expert's gate (where `gated`) and up rows in one parallel loop, then the down rows in a second,
        each output column adding the experts in order (so y's sums do not depend on the threads)."""
        num = starts.shape[0] - 1
        total = starts[num]
        xs = np.empty((total, hidden), np.float32)    # the rows routed to each expert, gathered
        for j in range(total):
            xs[j] = x[tokens[j]]
        h = np.empty((total, inter), np.float32)
        chunks = (inter + ROWS - 1) // ROWS
        for it in prange(num * chunks):               # gate and up rows, then the activation
            e = it // chunks
            _gate_up_rows(xs, blocks[e], off, starts[e], starts[e + 1] - starts[e], it - e * chunks, inter, hidden,
                          bias, gated, act, alpha, limit, h)
        for c in prange((hidden + ROWS - 1) // ROWS):  # down rows, weighted into y, expert by expert
            ds = np.empty(ROWS, np.float32)
            wd = np.empty(inter, np.float32)
            d = np.empty(total, np.float32)
            for e in range(num):
                _down_rows_into(h, blocks[e], off, starts[e], starts[e + 1] - starts[e], c, inter, hidden, bias,
                                tokens, weight, ds, wd, d, y)


MAX_BLOCKS = 8      # experts one call takes (the kernel's tuple of blocks; more go in further calls)
FIELDS = ("gate.w", "gate.scale", "up.w", "up.scale", "down.w", "down.scale",
          "gate_bias.b", "up_bias.b", "down_bias.b")


class FusedExperts:
    """int8 expert blocks of one layout (kernels.formats.block_fields), computed by the fused loops.
    `offsets`: each field's byte offset in a block (the bias fields where the family has them, no gate fields
    for ungated experts: their activation is then an ungated one)."""

    def __init__(self, offsets: dict[str, int], intermediate: int, hidden: int, activation: Activation):
        self.gated = is_gated(offsets)
        if self.gated != activation.is_gated:
            raise ValueError(f"a {'gated' if self.gated else 'ungated'} block takes no {activation.name} activation")
        self.bias = "up_bias.b" in offsets
        self.off = np.array([offsets.get(name, 0) for name in FIELDS], np.int64)
        self.intermediate, self.hidden, self.activation = intermediate, hidden, activation
        self._pad = np.zeros(1, np.uint8)

    def into(self, y: torch.Tensor, x: torch.Tensor, blocks: list[torch.Tensor], tokens: list[torch.Tensor],
             weights: list[torch.Tensor]) -> None:
        """y[tokens[e]] += weights[e][:, None] * expert e(x[tokens[e]]) for each block e (uint8 [block_bytes]);
        x, y float32 contiguous [T, H]; tokens[e] int64 and weights[e] float32, both [t_e]. The experts add
        into y in the order given."""
        act = self.activation
        for first in range(0, len(blocks), MAX_BLOCKS):
            part = range(first, min(first + MAX_BLOCKS, len(blocks)))
            arrays = tuple(blocks[e].numpy() for e in part)
            arrays += (self._pad,) * (MAX_BLOCKS - len(arrays))
            starts = np.zeros(len(part) + 1, np.int64)
            np.cumsum([len(tokens[e]) for e in part], out=starts[1:])
            _experts_into(x.numpy(), np.concatenate([tokens[e].numpy() for e in part]),
                          np.concatenate([weights[e].numpy() for e in part]).astype(np.float32, copy=False),
                          starts, arrays, self.off, self.intermediate, self.hidden, self.bias, self.gated,
                          ACTIVATION_IDS[act.name], act.alpha, act.limit, y.numpy())


def set_threads(count: int) -> None:
    """The fused loops' threads (numba's own pool; torch's is set apart)."""
    if numba is not None:
        numba.set_num_threads(max(1, min(count, numba.config.NUMBA_NUM_THREADS)))
