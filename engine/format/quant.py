"""Expert weight formats and their plain-torch reference quantize / dequantize.

Every format maps a 2D weight [out, in] to named parts; kernels are judged against `dequantize`.
  bf16 : w bf16 [out, in]                                               (lossless for bf16 sources)
  fp8  : w float8_e4m3fn [out, in], scale fp32 [out]                    w = w8 * scale[:, None]
  nvfp4: w uint8 [out, in/2] (two e2m1 codes: element 2j low nibble, 2j+1 high nibble),
         scale float8_e4m3fn [out, in/16], gscale fp32 [1]              w = e2m1 * scale * gscale
"""
from __future__ import annotations

import torch

from kernels.formats import E2M1_VALUES as _E2M1, FORMATS, NVFP4_GROUP, part_specs as kernel_part_specs

from engine.errors import SluiceError

FP8_MAX = 448.0
E2M1_MAX = 6.0
E2M1_VALUES = torch.tensor(_E2M1)
# Every e4m3 byte's value: on the CPU a table lookup is ~2.5x faster than the float8 -> float32 cast.
_FP8_TABLE = torch.nan_to_num(torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float())


def part_specs(fmt: str, out_features: int, in_features: int) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    """(name, dtype, shape) of each part, in storage order: the kernels' own definition, with user-facing errors."""
    if fmt not in FORMATS:
        raise SluiceError(f"Unknown quant format '{fmt}': choose one of {', '.join(FORMATS)}.")
    if fmt == "nvfp4" and in_features % NVFP4_GROUP:
        raise SluiceError(f"nvfp4 needs tensor widths divisible by {NVFP4_GROUP} (this model has {in_features}); choose fp8 or bf16.")
    return kernel_part_specs(fmt, out_features, in_features)


def _fp8_to_float(w: torch.Tensor) -> torch.Tensor:
    if w.device.type != "cpu":
        return w.float()
    return torch.take(_FP8_TABLE, w.view(torch.uint8).long())


def quantize(weight: torch.Tensor, fmt: str) -> dict[str, torch.Tensor]:
    w = weight.detach().float()
    part_specs(fmt, *w.shape)  # validates fmt and shape
    if fmt == "bf16":
        return {"w": weight.detach().to(torch.bfloat16).contiguous()}
    if fmt == "fp8":
        scale = (w.abs().amax(dim=1) / FP8_MAX).clamp_min(1e-12)                  # [out]
        w8 = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return {"w": w8.contiguous(), "scale": scale.contiguous()}
    return _quantize_nvfp4(w)


def _quantize_nvfp4(w: torch.Tensor) -> dict[str, torch.Tensor]:
    out_features, in_features = w.shape
    groups = w.reshape(out_features, in_features // NVFP4_GROUP, NVFP4_GROUP)   # [O, G, 16]
    gscale = (w.abs().amax() / (FP8_MAX * E2M1_MAX)).clamp_min(1e-12).reshape(1)
    scale = (groups.abs().amax(dim=2) / E2M1_MAX / gscale).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)  # [O, G]
    denom = scale.float() * gscale                                              # [O, G]
    scaled = torch.where(denom[..., None] > 0, groups / denom[..., None].clamp_min(1e-30), torch.zeros_like(groups))
    magnitude_idx = (scaled.abs()[..., None] - E2M1_VALUES).abs().argmin(dim=-1)  # nearest e2m1 magnitude
    codes = (magnitude_idx | ((scaled < 0).long() << 3)).to(torch.uint8).reshape(out_features, in_features)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)                             # [O, in/2]
    return {"w": packed.contiguous(), "scale": scale.contiguous(), "gscale": gscale.float().contiguous()}


def dequantize(parts: dict[str, torch.Tensor], fmt: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if fmt == "bf16":
        return parts["w"].to(dtype)
    if fmt == "fp8":
        return (_fp8_to_float(parts["w"]) * parts["scale"].float()[:, None]).to(dtype)
    if fmt == "nvfp4":
        packed = parts["w"]
        codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1).long()  # [O, in]
        table = E2M1_VALUES.to(packed.device)
        values = table[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
        scale = _fp8_to_float(parts["scale"])                                     # [O, in/16]
        grouped = values.view(*scale.shape, NVFP4_GROUP) * scale[..., None]       # [O, in/16, 16]
        return (grouped.reshape(values.shape) * parts["gscale"].float()).to(dtype)
    raise SluiceError(f"Unknown quant format '{fmt}': choose one of {', '.join(FORMATS)}.")
