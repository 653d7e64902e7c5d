"""Triton helpers that read weight tiles straight out of a slot bank (uint8 bytes) for each format.

The bank is passed twice, as uint8 and as bf16 / float32 views of the same memory, so a field at
byte offset `off` is element `off // 2` (bf16) or `off // 4` (float32); the 256-byte field alignment
and 4096-byte block size make those exact. FMT: 0 bf16, 1 fp8 (row-scaled), 2 nvfp4, 3 mxfp4 (e2m1
like nvfp4, an e8m0 power-of-two scale per 32 values and no global scale), 4 int8 (row-scaled like
fp8, its scale stored as bf16).
The decode kernel reads nvfp4 / mxfp4 tiles as 32-bit words of 8 values and decodes them by moving bits into
fp16 halves (e2m1_halves, tile_dot): a few integer operations a pair of values, one multiply-add a value,
one multiply a scale group.
Also the pieces the MoE kernels share: gate_up_rows (h = act(gate x + gate bias, up x + up bias) for a
block of rows) and raw_tile (a tile loaded as stored words): the prefill kernel reads fp4 tiles with it and
decodes them whole with fp4_tile. Both MoE kernels take
the expert activation (kernels.activation: ACT, alpha, limit) through `activate` and the biases through
`bias_rows` (bias field byte offsets as constexprs, -1 where a block has none).
"""
import triton
import triton.language as tl


def interpreting() -> bool:
    """Whether Triton runs its kernels in its interpreter (TRITON_INTERPRET=1: the CPU tests), as Triton reads it."""
    return bool(triton.knobs.runtime.interpret)


@triton.jit
def _e2m1(code):
    """4-bit e2m1 code (int32, bit3 sign) -> float32 in {0, .5, 1, 1.5, 2, 3, 4, 6} with sign.
    For magnitude codes m >= 2 the float32 bits are (m << 22) + (126 << 23): exponent e + 126 and
    the mantissa bit on top, i.e. 2^(e-1) * (1 + mant/2); codes 0 and 1 are 0 and 0.5."""
    m = code & 7
    normal = ((m << 22) + (126 << 23)).to(tl.float32, bitcast=True)
    value = tl.where(m < 2, m.to(tl.float32) * 0.5, normal)
    return tl.where(code >= 8, -value, value)


@triton.jit
def group_scale(raw, FMT: tl.constexpr):
    """Stored group scale bytes -> float32: e4m3 (nvfp4), or e8m0 (mxfp4: 2^(raw - 127), built as the
    float32 whose exponent field is raw; raw 0 gives 0 instead of 2^-127, which only a zero group has)."""
    if FMT == 3:
        return (raw.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    else:
        return raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def fp4_scales(bank_u8, s_off, rows, c0, n_rows, row_len, FMT: tl.constexpr, BLOCK_R: tl.constexpr,
               NCOLS: tl.constexpr):
    """The group scale bytes of W[rows, c0:c0+NCOLS] ([BLOCK_R, NCOLS/group]; zero outside)."""
    if FMT == 3:
        groups = row_len // 32
        jg = c0 // 32 + tl.arange(0, NCOLS // 32)
    else:
        groups = row_len // 16
        jg = c0 // 16 + tl.arange(0, NCOLS // 16)
    return tl.load(bank_u8 + s_off + rows[:, None] * groups + jg[None, :],
                   mask=(rows[:, None] < n_rows) & (jg[None, :] < groups), other=0)


@triton.jit
def fp4_tile(words, scales, FMT: tl.constexpr, BLOCK_R: tl.constexpr, NCOLS: tl.constexpr):
    """float32 [BLOCK_R, NCOLS] weights of a `raw_tile` of nvfp4 / mxfp4 words, in element order (a byte's
    low nibble first): e2m1 values times their group scale, the product kernels.formats.dequantize_parts
    forms first (exact: a 2-bit by 4-bit significand); nvfp4's global scale is left to `row_scale`."""
    code = words.to(tl.int32)
    values = tl.reshape(tl.join(_e2m1(code & 15), _e2m1(code >> 4)), [BLOCK_R, NCOLS])     # [R, NCOLS/2, 2]
    if FMT == 3:
        grouped = tl.reshape(values, [BLOCK_R, NCOLS // 32, 32]) * group_scale(scales, FMT)[:, :, None]
    else:
        grouped = tl.reshape(values, [BLOCK_R, NCOLS // 16, 16]) * group_scale(scales, FMT)[:, :, None]
    return tl.reshape(grouped, [BLOCK_R, NCOLS])


@triton.jit
def _fp16_bits(bits):
    """int32 holding an fp16 bit pattern in its low 16 bits -> float32 (exact, subnormals included)."""
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def e2m1_halves(words, J: tl.constexpr):
    """uint32 words of 8 packed e2m1 values -> float32 (value J, value J + 4) of each word (J < 4), 2^-14 times
    their e2m1 values. Values J and J + 4 lie 16 bits apart, so one shift and mask move both their sign and three
    magnitude bits to where the two halves of an fp16 pair keep a sign, two low exponent bits and the top
    mantissa bit; e2m1's 0.5 is then fp16's subnormal 2^-15, and the fp16 -> fp32 converts are exact."""
    if J == 3:
        magnitude = (words >> 3) & 0x0E000E00
    else:
        magnitude = (words << (9 - 4 * J)) & 0x0E000E00
    bits = magnitude | ((words << (12 - 4 * J)) & 0x80008000)
    return _fp16_bits(bits), _fp16_bits(bits >> 16)


@triton.jit
def fp4_words(k0, row_len, FMT: tl.constexpr, BLOCK_K: tl.constexpr):
    """([G, GW] index of each 32-bit word of W[r, k0:k0+BLOCK_K] in its row, [G, 1] whether it is in the row):
    G scale groups of GW words (8 packed e2m1 values a word; 4 words a group mxfp4, 2 nvfp4)."""
    GW: tl.constexpr = 4 if FMT == 3 else 2
    jg = k0 // (8 * GW) + tl.arange(0, BLOCK_K // (8 * GW))
    word = jg[:, None] * GW + tl.arange(0, GW)[None, :]
    return word, (jg < row_len // (8 * GW))[:, None]              # by group: one mask a group's words


@triton.jit
def _word_elements(vec_ptr, word, ok, J: tl.constexpr):
    """float32 [G, GW]: element J of each word's 8 (zero outside the row)."""
    return tl.load(vec_ptr + word * 8 + J, mask=ok, other=0.0).to(tl.float32)


@triton.jit
def fp4_vector(vec_ptr, k0, row_len, FMT: tl.constexpr, BLOCK_K: tl.constexpr):
    """vec[k0:k0+BLOCK_K] as float32 in tile_dot's order: the tuple of 8 [G, GW] tiles x_j (element j of
    each word), read once for all the weights that meet it."""
    word, ok = fp4_words(k0, row_len, FMT, BLOCK_K)
    return (_word_elements(vec_ptr, word, ok, 0), _word_elements(vec_ptr, word, ok, 1),
            _word_elements(vec_ptr, word, ok, 2), _word_elements(vec_ptr, word, ok, 3),
            _word_elements(vec_ptr, word, ok, 4), _word_elements(vec_ptr, word, ok, 5),
            _word_elements(vec_ptr, word, ok, 6), _word_elements(vec_ptr, word, ok, 7))


@triton.jit
def mma(a, b, acc, FP32_DOT: tl.constexpr):
    """acc + a @ b. FP32_DOT: float32 inputs (IEEE products, not TF32's 10-bit mantissa), or bf16 / fp16 ones in
    Triton's interpreter, whose low-precision dot is wrong (upcast: the same exact products)."""
    if FP32_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def byte_weights(raw, FMT: tl.constexpr):
    """Stored weight bytes (uint8) of a one-byte format -> float32: e4m3 (fp8) or int8."""
    if FMT == 1:
        return raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        return raw.to(tl.int8, bitcast=True).to(tl.float32)


@triton.jit
def tile_words(bank_u8, bank_bf16, bank_f32, w_off, s_off, rows, k0, n_rows, row_len,
               FMT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """(words, scales): W[rows, k0:k0+BLOCK_K] as stored, loaded for `tile_dot` (zero outside the matrix, so a tile
    past the row's end reads nothing). nvfp4 / mxfp4 as 32-bit words [BLOCK_R, G, GW] (fp4_words: a group's words in
    one thread) and their group scale bytes [BLOCK_R, G]; bf16, fp8 and int8 as [BLOCK_R, BLOCK_K] of their stored
    type, `scales` the words again (unused). The decode loops load an fp4 tile one iteration before they decode it,
    so its loads are in flight during the long decode of the tile before; a one-byte tile is used as it is loaded
    (its short arithmetic hides less, and the registers held ahead cost its configs occupancy). w_off / s_off: int64
    byte offsets of the weight / scale field of this expert in the bank."""
    row_ok = rows < n_rows
    if FMT == 2 or FMT == 3:
        GW: tl.constexpr = 4 if FMT == 3 else 2                   # words a scale group (32 / 16 values)
        word, word_ok = fp4_words(k0, row_len, FMT, BLOCK_K)      # [G, GW]
        ptr = bank_f32 + w_off // 4 + rows[:, None, None] * tl.multiple_of(row_len // 8, GW) + word[None, :, :]
        words = tl.load(ptr, mask=row_ok[:, None, None] & word_ok[None, :, :], other=0.0).to(tl.uint32, bitcast=True)
        groups = row_len // (8 * GW)
        jg = k0 // (8 * GW) + tl.arange(0, BLOCK_K // (8 * GW))
        scales = tl.load(bank_u8 + s_off + rows[:, None] * groups + jg[None, :],
                         mask=row_ok[:, None] & (jg[None, :] < groups), other=0)
        return words, scales
    else:
        cols = k0 + tl.arange(0, BLOCK_K)
        ok = row_ok[:, None] & (cols[None, :] < row_len)
        if FMT == 0:
            words = tl.load(bank_bf16 + w_off // 2 + rows[:, None] * row_len + cols[None, :], mask=ok, other=0.0)
        else:
            words = tl.load(bank_u8 + w_off + rows[:, None] * row_len + cols[None, :], mask=ok, other=0)
        return words, words


@triton.jit
def row_scale(bank_bf16, bank_f32, s_off, g_off, rows, n_rows, FMT: tl.constexpr):
    """[BLOCK_R] float32 factor applied to each output row after the dot product."""
    if FMT == 1:
        return tl.load(bank_f32 + s_off // 4 + rows, mask=rows < n_rows, other=0.0)
    elif FMT == 4:
        return tl.load(bank_bf16 + s_off // 2 + rows, mask=rows < n_rows, other=0.0).to(tl.float32)
    elif FMT == 2:
        return tl.zeros(rows.shape, tl.float32) + tl.load(bank_f32 + g_off // 4)
    else:
        return tl.full(rows.shape, 1.0, tl.float32)


@triton.jit
def dot_acc(FMT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """Zeros to sum tile_dot's results into over the reduction loop: [BLOCK_R, groups a tile] for fp4 (the sum
    over groups left to `dot_total`, after the loop), else [BLOCK_R]."""
    if FMT == 2 or FMT == 3:
        return tl.zeros([BLOCK_R, BLOCK_K // (32 if FMT == 3 else 16)], dtype=tl.float32)
    else:
        return tl.zeros([BLOCK_R], dtype=tl.float32)


@triton.jit
def dot_total(acc):
    """[BLOCK_R] from a dot_acc accumulator (fp4's in units of 2^-14: e2m1_halves')."""
    if len(acc.shape) == 2:
        return tl.sum(acc, axis=1) * 16384.0
    else:
        return acc


@triton.jit
def vector_tile(vec_ptr, k0, row_len, FMT: tl.constexpr, BLOCK_K: tl.constexpr):
    """vec[k0:k0+BLOCK_K] (any float dtype, zero past row_len) as float32 in the form `tile_dot` takes, read
    once for all the weights it meets: fp4_vector's tuple for nvfp4 / mxfp4, else a tuple of one [BLOCK_K]."""
    if FMT == 2 or FMT == 3:
        return fp4_vector(vec_ptr, k0, row_len, FMT, BLOCK_K)
    else:
        cols = k0 + tl.arange(0, BLOCK_K)
        return (tl.load(vec_ptr + cols, mask=cols < row_len, other=0.0).to(tl.float32),)


@triton.jit
def tile_dot(tile, xs, FMT: tl.constexpr):
    """The sum over the tile's k of W[rows, k] * vec[k], before `row_scale`, in dot_acc's shape; tile = tile_words(W,
    k0, ...), xs = vector_tile(vec, k0, ...). nvfp4 / mxfp4: for each scale group, 2^-14 times its sum with its group
    scale applied (nvfp4's global scale is left to `row_scale`, the sum over groups and the 2^14 to `dot_total`):
    each word decoded as four pairs of values (e2m1_halves) and its products summed in place, each group's sum
    scaled once."""
    words, scales = tile
    if FMT == 2 or FMT == 3:
        acc = tl.zeros(words.shape, dtype=tl.float32)
        for j in tl.static_range(4):
            lo, hi = e2m1_halves(words, j)
            acc += lo * xs[j][None, :, :]                 # two statements: two fused multiply-adds
            acc += hi * xs[j + 4][None, :, :]
        return tl.sum(acc, axis=2) * group_scale(scales, FMT)                             # [R, G]
    elif FMT == 0:
        return tl.sum(words.to(tl.float32) * xs[0][None, :], axis=1)
    else:
        return tl.sum(byte_weights(words, FMT) * xs[0][None, :], axis=1)


@triton.jit
def activate(gate, up, ACT: tl.constexpr, alpha, limit):
    """h from float32 gate and up (biases included), as kernels.activation.Activation computes it:
    ACT 0 silu(gate) * up; 1 gpt-oss's clamped SwiGLU (u + 1) * g * sigmoid(alpha g), g = min(gate, limit),
    u = clamp(up, -limit, limit); 2 DeepSeek-V4's silu(g) * u."""
    if ACT == 1:
        g = tl.minimum(gate, limit)
        u = tl.minimum(tl.maximum(up, -limit), limit)
        return (u + 1.0) * (g / (1.0 + tl.exp(-(g * alpha))))
    elif ACT == 2:
        g = tl.minimum(gate, limit)
        return g / (1.0 + tl.exp(-g)) * tl.minimum(tl.maximum(up, -limit), limit)
    else:
        return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def bias_rows(bank_f32, b_off, rows, n_rows, B: tl.constexpr):
    """[BLOCK_R] float32 bias of `rows` (fp32 field at byte b_off, i.e. the block's base + B); zero outside
    n_rows, and everywhere when the block has no such field (B < 0)."""
    if B >= 0:
        return tl.load(bank_f32 + b_off // 4 + rows, mask=rows < n_rows, other=0.0)
    else:
        return tl.zeros(rows.shape, tl.float32)


@triton.jit
def block_base(slot, block_bytes):
    """Byte offset of a slot's expert block from the bank's start (a skipped pair's slot < 0: the first's)."""
    return tl.maximum(slot, 0).to(tl.int64) * block_bytes


@triton.jit
def gate_up_rows(x_ptr, h_ptr, slot_ptr, bank_u8, bank_bf16, bank_f32, block_bytes, H, I, K, pair, rows, alpha, limit,
                  GW: tl.constexpr, GS: tl.constexpr, GG: tl.constexpr,
                  UW: tl.constexpr, US: tl.constexpr, UG: tl.constexpr, GB: tl.constexpr, UB: tl.constexpr,
                  FMT: tl.constexpr, ACT: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr):
    """h[pair, rows] = act(gate_e x_t + gate bias, up_e x_t + up bias) for pair = t * K + k (stored to h_ptr)."""
    token = pair // K
    slot = tl.load(slot_ptr + pair)
    n = tl.where(slot >= 0, I, 0)                             # a skipped pair (slot < 0) reads nothing: h = act(0, 0) = 0
    base = block_base(slot, block_bytes)
    acc_gate = dot_acc(FMT, BLOCK_I, BLOCK_K)
    acc_up = dot_acc(FMT, BLOCK_I, BLOCK_K)
    x_t = x_ptr + token * H
    if FMT == 2 or FMT == 3:     # fp4: the next tiles loaded before these are decoded (see `tile_words`)
        gate_w = tile_words(bank_u8, bank_bf16, bank_f32, base + GW, base + GS, rows, 0, n, H, FMT, BLOCK_I, BLOCK_K)
        up_w = tile_words(bank_u8, bank_bf16, bank_f32, base + UW, base + US, rows, 0, n, H, FMT, BLOCK_I, BLOCK_K)
        xs = vector_tile(x_t, 0, H, FMT, BLOCK_K)                         # read once for gate and up
        for k0 in range(0, H, BLOCK_K):
            k1 = k0 + BLOCK_K
            next_gate = tile_words(bank_u8, bank_bf16, bank_f32, base + GW, base + GS, rows, k1, n, H, FMT, BLOCK_I,
                                   BLOCK_K)
            next_up = tile_words(bank_u8, bank_bf16, bank_f32, base + UW, base + US, rows, k1, n, H, FMT, BLOCK_I,
                                 BLOCK_K)
            next_xs = vector_tile(x_t, k1, H, FMT, BLOCK_K)
            acc_gate += tile_dot(gate_w, xs, FMT)
            acc_up += tile_dot(up_w, xs, FMT)
            gate_w, up_w, xs = next_gate, next_up, next_xs
    else:
        for k0 in range(0, H, BLOCK_K):
            xs = vector_tile(x_t, k0, H, FMT, BLOCK_K)
            acc_gate += tile_dot(tile_words(bank_u8, bank_bf16, bank_f32, base + GW, base + GS, rows, k0, n, H, FMT,
                                            BLOCK_I, BLOCK_K), xs, FMT)
            acc_up += tile_dot(tile_words(bank_u8, bank_bf16, bank_f32, base + UW, base + US, rows, k0, n, H, FMT,
                                          BLOCK_I, BLOCK_K), xs, FMT)
    gate = (dot_total(acc_gate) * row_scale(bank_bf16, bank_f32, base + GS, base + GG, rows, n, FMT)
            + bias_rows(bank_f32, base + GB, rows, n, GB))
    up = (dot_total(acc_up) * row_scale(bank_bf16, bank_f32, base + US, base + UG, rows, n, FMT)
          + bias_rows(bank_f32, base + UB, rows, n, UB))
    tl.store(h_ptr + pair * I + rows, activate(gate, up, ACT, alpha, limit), mask=rows < I)


@triton.jit
def raw_tile(bank_u8, bank_bf16, w_off, s_off, rows, c0, n_rows, row_len,
              FMT: tl.constexpr, BLOCK_R: tl.constexpr, NCOLS: tl.constexpr):
    """The stored words of W[rows, c0:c0+NCOLS] (zero outside the matrix), not yet decoded: bf16 as
    bf16, fp8 and int8 as uint8, nvfp4 as (packed uint8 [BLOCK_R, NCOLS/2], e4m3 group scales as uint8
    [BLOCK_R, NCOLS/16]), decoded by the caller. Returns (words, scales); `scales` is `words` again
    (unused) for bf16 / fp8 / int8."""
    row_ok = rows[:, None] < n_rows
    if FMT == 2 or FMT == 3:
        half = row_len // 2                                   # bytes per row
        jb = c0 // 2 + tl.arange(0, NCOLS // 2)
        words = tl.load(bank_u8 + w_off + rows[:, None] * half + jb[None, :],
                        mask=row_ok & (jb[None, :] < half), other=0)
        return words, fp4_scales(bank_u8, s_off, rows, c0, n_rows, row_len, FMT, BLOCK_R, NCOLS)
    else:
        cols = c0 + tl.arange(0, NCOLS)
        if FMT == 0:
            ptr = bank_bf16 + w_off // 2 + rows[:, None] * row_len + cols[None, :]
        else:
            ptr = bank_u8 + w_off + rows[:, None] * row_len + cols[None, :]
        words = tl.load(ptr, mask=row_ok & (cols[None, :] < row_len), other=0)
        return words, words


def field_offsets(offsets) -> dict[str, int]:
    """The kernels' constexpr field offsets by name: every projection part (0 where a format has none) and
    the bias fields (-1 where the block has none: bias_rows adds nothing)."""
    parts = {f"{proj}.{part}": offsets.get(f"{proj}.{part}", 0) for proj in ("gate", "up", "down")
             for part in ("w", "scale", "gscale")}
    return parts | {f"{proj}_bias.b": offsets.get(f"{proj}_bias.b", -1) for proj in ("gate", "up", "down")}


def check_bank_inputs(x, bank, tensors: dict, offsets) -> None:
    """What both MoE kernels ask of their inputs: activations in a float dtype, every tensor contiguous and
    on the GPU with x (or the interpreter), blocks 4096-byte multiples with 256-byte aligned fields."""
    import torch
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"x must be float32, bfloat16 or float16, not {x.dtype}")
    for name, t in {"x": x, "bank": bank, **tensors}.items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if t.device != x.device or (t.device.type != "cuda" and not interpreting()):
            raise ValueError(f"{name} must be on the GPU with the others (or set TRITON_INTERPRET=1 for CPU)")
    if bank.shape[1] % 4096 or any(off % 256 for off in offsets.values()):
        raise ValueError("blocks must be 4096-byte multiples with 256-byte aligned fields")
