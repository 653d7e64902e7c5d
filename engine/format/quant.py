"""Expert weight formats and their plain-torch reference quantize / dequantize.

Every format maps a 2D weight [out, in] to named parts; kernels are judged against `dequantize`.
  bf16 : w bf16 [out, in]                                               (lossless for bf16 sources)
  fp8  : w float8_e4m3fn [out, in], scale fp32 [out]                    w = w8 * scale[:, None]
  int8 : w int8 [out, in] in -127..127, scale bf16 [out]                 w = w8 * scale[:, None]
  nvfp4: w uint8 [out, in/2] (two e2m1 codes: element 2j low nibble, 2j+1 high nibble),
         scale float8_e4m3fn [out, in/16], gscale fp32 [1]              w = e2m1 * scale * gscale
  mxfp4: w uint8 [out, in/2] (e2m1 pairs as nvfp4), scale uint8 [out, in/32] (e8m0, bias 127)
                                                                        w = e2m1 * 2^(scale - 127)
An expert bias is one part "b" (float32), stored as it is in every format.
"""
from __future__ import annotations

import numpy as np
import torch

from kernels.formats import (E2M1_VALUES as _E2M1, E8M0_BIAS, MXFP4_GROUP, NVFP4_GROUP, e2m1_decode,
                             part_specs as kernel_part_specs)
from kernels.quant_formats import FORMATS, QUANT_FORMATS, QuantFormat

from engine.errors import SluiceError

FP8_MAX = 448.0
INT8_MAX = 127
E2M1_MAX = 6.0
E2M1_VALUES = torch.tensor(_E2M1)
# Every e4m3 byte's value: on the CPU a table lookup is ~2.5x faster than the float8 -> float32 cast.
_FP8_TABLE = torch.nan_to_num(torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float())


def quant_format(fmt: str) -> QuantFormat:
    """The descriptor of a quant format the user named (kernels.quant_formats), or a sentence saying what to choose."""
    if fmt not in QUANT_FORMATS:
        raise SluiceError(f"Unknown quant format '{fmt}': choose one of {', '.join(FORMATS)}.")
    return QUANT_FORMATS[fmt]


def part_specs(fmt: str, out_features: int, in_features: int) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    """(name, dtype, shape) of each part, in storage order: the kernels' own definition, with user-facing errors."""
    problem = quant_format(fmt).width_problem(in_features)
    if problem:
        raise SluiceError(f"{problem}; choose fp8 or bf16.")
    return kernel_part_specs(fmt, out_features, in_features)


def _fp8_to_float(w: torch.Tensor) -> torch.Tensor:
    if w.device.type != "cpu":
        return w.float()
    return torch.take(_FP8_TABLE, w.view(torch.uint8).long())


def quantize(weight: torch.Tensor, fmt: str) -> dict[str, torch.Tensor]:
    part_specs(fmt, *weight.shape)  # validates fmt and shape
    return _QUANTIZE[fmt](weight.detach())


def _quantize_fp8(w: torch.Tensor) -> dict[str, torch.Tensor]:
    w = w.float()
    scale = (w.abs().amax(dim=1) / FP8_MAX).clamp_min(1e-12)                      # [out]
    w8 = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return {"w": w8.contiguous(), "scale": scale.contiguous()}


def _quantize_int8(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """Symmetric per output row: scale = amax / 127 rounded to the nearest bf16, codes round(w / scale).
    The scale's rounding error is at most 2^-8 relative, so amax / scale lies in [126.51, 127.49] and
    the largest code is exactly 127 (the clamp never clips; the dequantized row is a fixed point)."""
    w = w.float()
    amax = w.abs().amax(dim=1)                                                            # [out]
    # A zero row gets the smallest normal scale instead of 0: its codes are 0 and nothing divides by 0.
    scale = (amax / INT8_MAX).clamp_min(torch.finfo(torch.bfloat16).tiny).to(torch.bfloat16)
    codes = torch.round(w / scale.float()[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return {"w": codes.contiguous(), "scale": scale.contiguous()}


def int8_round_trip(rows: torch.Tensor) -> torch.Tensor:
    """rows [N, H] (host) -> float32 [N, H]: each row int8-quantised as `_quantize_int8` does and dequantised
    (codes * scale), bit for bit, in a dozen numpy operations: torch's ~15 operators on one embedding row took
    ~0.2 ms of the decode thread a token on an H200 host (0.3 ms on a 2-core desktop).
    The bf16 rounding of the scale is done on the float32 bits (to nearest, ties to even, as torch's cast)."""
    w = rows.float().numpy()
    amax = np.abs(w).max(axis=1)
    scale = _bf16_round(np.maximum(amax / np.float32(INT8_MAX), np.float32(torch.finfo(torch.bfloat16).tiny)))
    codes = np.clip(np.rint(w / scale[:, None]), -INT8_MAX, INT8_MAX)
    return torch.from_numpy(codes * scale[:, None])


def _bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bf16 (ties to even), as float32 (finite inputs)."""
    bits = x.astype(np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def _e2m1_codes(scaled: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 code (sign in bit 3) of each value, already divided by its scale."""
    magnitude_idx = (scaled.abs()[..., None] - E2M1_VALUES).abs().argmin(dim=-1)
    return (magnitude_idx | ((scaled < 0).long() << 3)).to(torch.uint8)


def _pack_pairs(codes: torch.Tensor) -> torch.Tensor:
    """[O, n] codes -> [O, n/2] bytes, element 2j in the low nibble."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def quantize_mxfp4(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per 32 values, the smallest power of two that brings the largest magnitude to <= 6 (so nothing
    clips), then the nearest e2m1 value (ties to the smaller magnitude)."""
    out_features, in_features = w.shape
    groups = w.float().reshape(out_features, in_features // MXFP4_GROUP, MXFP4_GROUP)      # [O, G, 32]
    amax = groups.abs().amax(dim=2)                                                        # [O, G]
    # ceil(log2(amax / 6)) from frexp (exact): amax / 6 = m * 2^e with m in [0.5, 1)
    mantissa, exponent = torch.frexp(amax / E2M1_MAX)
    exponent = exponent - (mantissa == 0.5).int()                                         # an exact power of two
    exponent = torch.where(amax > 0, exponent, torch.full_like(exponent, -E8M0_BIAS)).clamp(-E8M0_BIAS, E8M0_BIAS)
    scaled = torch.ldexp(groups, -exponent[..., None].float())
    codes = _e2m1_codes(scaled).reshape(out_features, in_features)
    return {"w": _pack_pairs(codes).contiguous(), "scale": (exponent + E8M0_BIAS).to(torch.uint8).contiguous()}


def _quantize_nvfp4(w: torch.Tensor) -> dict[str, torch.Tensor]:
    w = w.float()
    out_features, in_features = w.shape
    groups = w.reshape(out_features, in_features // NVFP4_GROUP, NVFP4_GROUP)   # [O, G, 16]
    gscale = (w.abs().amax() / (FP8_MAX * E2M1_MAX)).clamp_min(1e-12).reshape(1)
    scale = (groups.abs().amax(dim=2) / E2M1_MAX / gscale).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)  # [O, G]
    denom = scale.float() * gscale                                              # [O, G]
    scaled = torch.where(denom[..., None] > 0, groups / denom[..., None].clamp_min(1e-30), torch.zeros_like(groups))
    codes = _e2m1_codes(scaled).reshape(out_features, in_features)
    return {"w": _pack_pairs(codes).contiguous(), "scale": scale.contiguous(), "gscale": gscale.float().contiguous()}


def _dequantize_mxfp4(parts: dict[str, torch.Tensor]) -> torch.Tensor:
    values = e2m1_decode(parts["w"])                                              # [O, in]
    exponent = parts["scale"].int() - E8M0_BIAS                                   # [O, in/32]
    return torch.ldexp(values.view(*exponent.shape, MXFP4_GROUP), exponent[..., None]).reshape(values.shape)


def _dequantize_nvfp4(parts: dict[str, torch.Tensor]) -> torch.Tensor:
    values = e2m1_decode(parts["w"])                                              # [O, in]
    scale = _fp8_to_float(parts["scale"])                                         # [O, in/16]
    grouped = values.view(*scale.shape, NVFP4_GROUP) * scale[..., None]           # [O, in/16, 16]
    return grouped.reshape(values.shape) * parts["gscale"].float()


# format -> parts -> float32 [out, in]: the reference the kernels are judged against
_DEQUANTIZE = {
    "bf16": lambda parts: parts["w"],
    "fp8": lambda parts: _fp8_to_float(parts["w"]) * parts["scale"].float()[:, None],
    "int8": lambda parts: parts["w"].float() * parts["scale"].float()[:, None],
    "mxfp4": _dequantize_mxfp4,
    "nvfp4": _dequantize_nvfp4,
}
_QUANTIZE = {
    "bf16": lambda w: {"w": w.to(torch.bfloat16).contiguous()},
    "fp8": _quantize_fp8,
    "int8": _quantize_int8,
    "mxfp4": lambda w: quantize_mxfp4(w.float()),
    "nvfp4": _quantize_nvfp4,
}


def dequantize(parts: dict[str, torch.Tensor], fmt: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if "b" in parts:                  # an expert bias: float32 in every format
        return parts["b"].to(dtype)
    return _DEQUANTIZE[quant_format(fmt).name](parts).to(dtype)
