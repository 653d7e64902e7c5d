"""Triton helpers that read weight tiles straight out of a slot bank (uint8 bytes) for each format.

The bank is passed twice, as uint8 and as bf16 / float32 views of the same memory, so a field at
byte offset `off` is element `off // 2` (bf16) or `off // 4` (float32); the 256-byte field alignment
and 4096-byte block size make those exact. FMT: 0 bf16, 1 fp8 (row-scaled), 2 nvfp4.
"""
import triton
import triton.language as tl


@triton.jit
def _e2m1(code):
    """4-bit e2m1 code (int32, bit3 sign) -> float32 value in {0, .5, 1, 1.5, 2, 3, 4, 6} with sign."""
    m = code & 7
    e = m >> 1
    frac = (m & 1).to(tl.float32)
    pow2 = (1 << tl.maximum(e - 1, 0)).to(tl.float32)
    mag = tl.where(e == 0, 0.5 * frac, (1.0 + 0.5 * frac) * pow2)
    return tl.where((code & 8) != 0, -mag, mag)


@triton.jit
def weight_tile(bank_u8, bank_bf16, w_off, s_off, rows, k0, n_rows, row_len,
                FMT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """float32 tile W[rows, k0:k0+BLOCK_K] ([BLOCK_R, BLOCK_K]; zero outside the matrix), with the
    nvfp4 group scales applied; per-row (fp8) and global (nvfp4) scales are left to `row_scale`.
    w_off / s_off: int64 byte offsets of the weight / scale field of this expert in the bank."""
    row_ok = rows[:, None] < n_rows
    if FMT == 0:
        cols = k0 + tl.arange(0, BLOCK_K)
        ptr = bank_bf16 + w_off // 2 + rows[:, None] * row_len + cols[None, :]
        return tl.load(ptr, mask=row_ok & (cols[None, :] < row_len), other=0.0).to(tl.float32)
    elif FMT == 1:
        cols = k0 + tl.arange(0, BLOCK_K)
        ptr = bank_u8 + w_off + rows[:, None] * row_len + cols[None, :]
        raw = tl.load(ptr, mask=row_ok & (cols[None, :] < row_len), other=0)
        return raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        half = row_len // 2                                   # bytes per row
        jb = k0 // 2 + tl.arange(0, BLOCK_K // 2)             # byte columns
        raw = tl.load(bank_u8 + w_off + rows[:, None] * half + jb[None, :],
                      mask=row_ok & (jb[None, :] < half), other=0).to(tl.int32)
        values = tl.reshape(tl.join(_e2m1(raw & 15), _e2m1(raw >> 4)), [BLOCK_R, BLOCK_K])   # 2j low, 2j+1 high
        groups = row_len // 16
        jg = k0 // 16 + tl.arange(0, BLOCK_K // 16)
        scale = tl.load(bank_u8 + s_off + rows[:, None] * groups + jg[None, :],
                        mask=row_ok & (jg[None, :] < groups), other=0)
        scale = scale.to(tl.float8e4nv, bitcast=True).to(tl.float32)                           # [R, K/16]
        scale = tl.reshape(tl.broadcast_to(scale[:, :, None], [BLOCK_R, BLOCK_K // 16, 16]), [BLOCK_R, BLOCK_K])
        return values * scale


@triton.jit
def row_scale(bank_f32, s_off, g_off, rows, n_rows, FMT: tl.constexpr):
    """[BLOCK_R] float32 factor applied to each output row after the dot product."""
    if FMT == 1:
        return tl.load(bank_f32 + s_off // 4 + rows, mask=rows < n_rows, other=0.0)
    elif FMT == 2:
        return tl.zeros(rows.shape, tl.float32) + tl.load(bank_f32 + g_off // 4)
    else:
        return tl.full(rows.shape, 1.0, tl.float32)
