"""Expert-block formats as the kernels see them: plain-torch views and dequantization of the bytes
in a slot, and random valid blocks for self-checks.

engine/format/quant.py takes its part layouts from here and adds the quantizers (kernels import no engine;
a test checks that engine/format/layout.py places the fields where the kernels read them); each format's
descriptor (group size, bytes a weight, the paths that take it) is in kernels/quant_formats.py. A block is a uint8 buffer; `offsets` maps field names ("gate.w", "gate.scale", "gate.gscale",
"up.*", "down.*") to byte offsets from the block start, each 256-byte aligned.
  bf16 : w bf16 [out, in]
  fp8  : w float8_e4m3fn [out, in], scale fp32 [out]               W = w * scale[:, None]
  int8 : w int8 [out, in] (symmetric, -127..127), scale bf16 [out]  W = w * scale[:, None]
         (bf16 scales, so that torch's CPU int8 matmul, which takes its scales in the activation
         dtype, computes with exactly the weights the GPU kernels compute with)
  nvfp4: w uint8 [out, in/2] (element 2j low nibble, 2j+1 high; bit3 sign, bits0-2 index into
         E2M1 = [0, .5, 1, 1.5, 2, 3, 4, 6]), scale e4m3 [out, in/16], gscale fp32 [1]
                                                                   W = e2m1 * scale * gscale
  mxfp4: w uint8 [out, in/2] (e2m1 pairs as nvfp4), scale uint8 [out, in/32] (e8m0: a power of two,
         biased by 127; the OCP MX layout gpt-oss checkpoints store as `*_blocks` / `*_scales`)
                                                                   W = e2m1 * 2^(scale - 127)
Families with expert biases (gpt-oss) add "gate_bias.b", "up_bias.b", "down_bias.b" (fp32 [I], [I],
[H]) after the weights, whatever the format: biases are few bytes and stay exact. Ungated experts
(Nemotron-H's down(act(up x))) have no gate fields: their blocks hold up and down alone (`gated=False`).
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping

import torch

from .quant_formats import FORMATS, QUANT_FORMATS, quant_format

FORMAT_IDS = {name: f.kernel_id for name, f in QUANT_FORMATS.items()}     # the kernels' FMT constexpr
NVFP4_GROUP = QUANT_FORMATS["nvfp4"].group_size
MXFP4_GROUP = QUANT_FORMATS["mxfp4"].group_size
E8M0_BIAS = 127
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def proj_shapes(intermediate: int, hidden: int, gated: bool = True) -> dict[str, tuple[int, int]]:
    """[out, in] of each projection (Hugging Face convention); no gate for ungated experts."""
    shapes = {"gate": (intermediate, hidden), "up": (intermediate, hidden), "down": (hidden, intermediate)}
    return shapes if gated else {proj: shape for proj, shape in shapes.items() if proj != "gate"}


def bias_shapes(intermediate: int, hidden: int, gated: bool = True) -> dict[str, tuple[int]]:
    """Length of each expert bias (gate and up add to [I] rows, down to [H])."""
    shapes = {"gate_bias": (intermediate,), "up_bias": (intermediate,), "down_bias": (hidden,)}
    return shapes if gated else {name: shape for name, shape in shapes.items() if name != "gate_bias"}


def is_gated(field_names: Iterable[str]) -> bool:
    """Whether a block with these fields ("gate.w", ..., or a field -> offset mapping) has a gate projection."""
    return any(name.startswith("gate.") for name in field_names)


def _fp4_parts(scale_dtype: torch.dtype, global_scale: bool):
    def parts(out_features: int, in_features: int, group: int):
        specs = [("w", torch.uint8, (out_features, in_features // 2)),
                 ("scale", scale_dtype, (out_features, in_features // group))]
        return specs + [("gscale", torch.float32, (1,))] if global_scale else specs
    return parts


# format -> (out, in, group size) -> [(part name, dtype, shape)] in storage order
_PARTS = {
    "bf16": lambda o, i, g: [("w", torch.bfloat16, (o, i))],
    "fp8": lambda o, i, g: [("w", torch.float8_e4m3fn, (o, i)), ("scale", torch.float32, (o,))],
    "int8": lambda o, i, g: [("w", torch.int8, (o, i)), ("scale", torch.bfloat16, (o,))],
    "nvfp4": _fp4_parts(torch.float8_e4m3fn, global_scale=True),
    "mxfp4": _fp4_parts(torch.uint8, global_scale=False),
}


def part_specs(fmt: str, out_features: int, in_features: int) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    spec = quant_format(fmt)
    problem = spec.width_problem(in_features)
    if problem:
        raise ValueError(problem)
    return _PARTS[fmt](out_features, in_features, spec.group_size)


def field_view(block: torch.Tensor, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """Zero-copy typed view of `shape` at byte `offset` of a uint8 block."""
    nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    return block[offset:offset + nbytes].view(dtype).view(shape)


def dequantize_block(block: torch.Tensor, fmt: str, offsets: Mapping[str, int], intermediate: int, hidden: int,
                     dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """{gate, up, down} -> dense [out, in] weights of one uint8 block (the kernels' specification; no gate in an
    ungated block), and {gate_bias, up_bias, down_bias} when the block has biases."""
    weights = {}
    for proj, (out_f, in_f) in proj_shapes(intermediate, hidden, is_gated(offsets)).items():
        parts = {name: field_view(block, offsets[f"{proj}.{name}"], dt, shape)
                 for name, dt, shape in part_specs(fmt, out_f, in_f)}
        weights[proj] = dequantize_parts(parts, fmt).to(dtype)
    for name, shape in bias_shapes(intermediate, hidden).items():
        if f"{name}.b" in offsets:
            weights[name] = field_view(block, offsets[f"{name}.b"], torch.float32, shape).to(dtype)
    return weights


def e2m1_decode(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [O, n/2] of e2m1 pairs (element 2j in the low nibble) -> float32 [O, n]."""
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1).long()   # [O, n]
    table = torch.tensor(E2M1_VALUES, device=packed.device)
    return table[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)


def _dequantize_nvfp4(parts: Mapping[str, torch.Tensor]) -> torch.Tensor:
    scale = parts["scale"].float().repeat_interleave(NVFP4_GROUP, dim=1)                          # [O, in]
    return e2m1_decode(parts["w"]) * scale * parts["gscale"].float()


def _dequantize_mxfp4(parts: Mapping[str, torch.Tensor]) -> torch.Tensor:
    exponent = parts["scale"].int().repeat_interleave(MXFP4_GROUP, dim=1) - E8M0_BIAS              # [O, in]
    return torch.ldexp(e2m1_decode(parts["w"]), exponent)


def _dequantize_row_scaled(parts: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return parts["w"].float() * parts["scale"].float()[:, None]


_DEQUANTIZE = {"bf16": lambda parts: parts["w"].float(), "fp8": _dequantize_row_scaled,
               "int8": _dequantize_row_scaled, "nvfp4": _dequantize_nvfp4, "mxfp4": _dequantize_mxfp4}


def dequantize_parts(parts: Mapping[str, torch.Tensor], fmt: str) -> torch.Tensor:
    """float32 [out, in] weight of one projection from its parts ({"w", "scale", ...} of part_specs)."""
    return _DEQUANTIZE[quant_format(fmt).name](parts)


def random_bank(num_slots: int, block_bytes: int, fmt: str, offsets: Mapping[str, int], intermediate: int,
                hidden: int, device="cpu", generator: torch.Generator | None = None) -> torch.Tensor:
    """[num_slots, block_bytes] uint8 of random *valid* blocks (no NaN codes, positive scales) whose
    dequantized weights have magnitude ~ 1/sqrt(in), like trained weights (biases ~ 0.1 where the
    offsets have them; no gate where they have none)."""
    bank = torch.zeros(num_slots, block_bytes, dtype=torch.uint8)
    g = generator or torch.Generator().manual_seed(0)
    for s in range(num_slots):
        for proj, (out_f, in_f) in proj_shapes(intermediate, hidden, is_gated(offsets)).items():
            for name, dt, shape in part_specs(fmt, out_f, in_f):
                part = _random_part(name, dt, shape, in_f ** -0.5, g)
                off = offsets[f"{proj}.{name}"]
                bank[s, off:off + part.numel() * part.element_size()] = part.contiguous().view(-1).view(torch.uint8)
        for name, shape in bias_shapes(intermediate, hidden).items():
            if f"{name}.b" in offsets:
                off = offsets[f"{name}.b"]
                bias = (0.1 * torch.randn(shape, generator=g)).view(torch.uint8)
                bank[s, off:off + bias.numel()] = bias
    return bank.to(device)


def _random_part(name: str, dt: torch.dtype, shape: tuple[int, ...], std: float, g: torch.Generator) -> torch.Tensor:
    """One valid random part of a projection whose weights should have magnitude ~ std."""
    if dt == torch.uint8 and name == "scale":              # mxfp4 e8m0: 2^-2 .. 2^1 times ~std/3
        center = E8M0_BIAS + round(math.log2(std / 3))
        return torch.randint(center - 2, center + 2, shape, generator=g).to(torch.uint8)
    if dt == torch.uint8:                                 # packed e2m1: every byte is valid
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    if name == "w" and dt == torch.int8:                  # int8 weights: every value but -128
        return torch.randint(-127, 128, shape, generator=g, dtype=torch.int8)
    if name == "w":                                       # bf16 / fp8 weights
        return (torch.randn(shape, generator=g) * (std if dt == torch.bfloat16 else 64.0)).clamp(-448, 448).to(dt)
    if name == "scale" and dt == torch.float32:           # fp8 row scales
        return torch.rand(shape, generator=g) * std / 32 + std / 128
    if name == "scale" and dt == torch.bfloat16:          # int8 row scales (uniform codes: std ~ 73 scale)
        return (torch.rand(shape, generator=g) * std / 64 + std / 128).to(dt)
    if name == "scale":                                   # nvfp4 e4m3 group scales in [1, 8)
        return (1 + 7 * torch.rand(shape, generator=g)).to(dt)
    return torch.full(shape, std / 12)                    # nvfp4 global scale


def block_fields(fmt: str, intermediate: int, hidden: int, bias: bool = False, field_align: int = 256,
                 gated: bool = True) -> list[tuple[str, torch.dtype, tuple[int, ...], int]]:
    """(name, dtype, shape, byte offset) of every field of one block, in storage order: gate (unless the
    experts are ungated), up, down (each part of the format), then the biases when the family has them."""
    specs = [(f"{proj}.{name}", dt, shape) for proj, (out_f, in_f) in proj_shapes(intermediate, hidden, gated).items()
             for name, dt, shape in part_specs(fmt, out_f, in_f)]
    if bias:
        specs += [(f"{name}.b", torch.float32, shape)
                  for name, shape in bias_shapes(intermediate, hidden, gated).items()]
    fields, offset = [], 0
    for name, dt, shape in specs:
        offset = -(-offset // field_align) * field_align
        fields.append((name, dt, tuple(shape), offset))
        offset += torch.Size(shape).numel() * torch.empty((), dtype=dt).element_size()
    return fields


def make_offsets(fmt: str, intermediate: int, hidden: int, field_align: int = 256, block_align: int = 4096,
                 bias: bool = False, gated: bool = True) -> tuple[dict[str, int], int]:
    """Field offsets and block size of the engine's layout (see block_fields)."""
    fields = block_fields(fmt, intermediate, hidden, bias, field_align, gated)
    name, dt, shape, offset = fields[-1]
    end = offset + torch.Size(shape).numel() * torch.empty((), dtype=dt).element_size()
    return {f[0]: f[3] for f in fields}, -(-end // block_align) * block_align
