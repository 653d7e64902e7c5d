"""Row helpers of the CPU's int8 kernels (numba, inlined into their callers: kernels/cpu_moe.py's experts,
kernels/cpu_gemv.py's dense weights). An int8 weight's row r times its scale is exact in float32 (8 by 8
significant bits), so a row dequantised here is the reference's row, bit for bit; only the order of the sums
differs from torch's.
Imported only where numba is (the callers check `available()`)."""
from __future__ import annotations

import numpy as np
from numba import njit

# Reassociation and contraction only: the sums may be vectorised, exp and division stay exact.
FAST = {"reassoc", "contract"}


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def row(q, r, scale, out):
    """Row r of an int8 weight, dequantised into out (float32)."""
    for i in range(out.shape[0]):
        out[i] = np.float32(q[r, i]) * scale


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def dots(a, b, out):
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


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def row_dot(a, q, r, scale):
    """a . (row r of an int8 weight, dequantised): one token, no scratch row. The row's scale multiplies
    the sum, not each product (one multiply a row instead of one a weight: the loop is the CPU's
    compute bound at one token; the result differs from the reference's by float32 rounding only)."""
    acc = np.float32(0.0)
    for i in range(a.shape[0]):
        acc += a[i] * np.float32(q[r, i])
    return acc * scale


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def bf16_scales(bits, first, count, out):
    """bf16 values (their int16 bit patterns) bits[first:first + count] -> float32 out[:count] (exact)."""
    raw = out.view(np.uint32)
    for i in range(count):
        raw[i] = np.uint32(np.uint16(bits[first + i])) << np.uint32(16)
