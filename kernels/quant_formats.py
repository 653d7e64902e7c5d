"""The quant formats of expert blocks, one descriptor each: what a format is and which code paths take it.

Torch-free, so that the command line can list the formats without importing torch. The byte layout of
each format (its parts, dtypes and shapes) and its dequantisation are in kernels/formats.py; the
quantisers in engine/format/quant.py.

    fmt = quant_format("nvfp4")
    fmt.kernel_id, fmt.group_size, fmt.weight_bytes      # 2, 16, 0.5625
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QuantFormat:
    name: str                # what users choose and sluice.json stores
    kernel_id: int           # the Triton kernels' FMT constexpr
    group_size: int          # input values sharing one scale; 0: one scale per output row (fp8, int8) or none (bf16)
    weight_bytes: float      # bytes a weight takes, its group scales included (row and global scales left out)
    accuracy: str            # "exact" | "near exact" | "smallest": a chooser's one-word summary
    decode_kernel: bool      # kernels.moe_decode computes it from a slot
    prefill_kernel: bool     # kernels.moe_prefill computes it from a bank
    cpu_kernel: bool         # kernels.cpu_linear multiplies the stored form in bf16, with no float copy (CPU share)
    cpu_in_place: bool       # the CPU device computes RAM-resident blocks where they sit (float32 activations)
    cpu_fused: bool          # kernels.cpu_moe's fused expert kernel takes it
    dense: bool              # the dense weights may be kept in it (engine.model.dense_quant)
    torch_reference: bool = True   # kernels.formats.dequantize_parts reads it: every format has one

    @property
    def is_fp4(self) -> bool:
        """Packed e2m1 pairs with a scale per group (the kernels' fp4 tiles)."""
        return self.group_size > 0

    def width_problem(self, in_features: int) -> str | None:
        """Why a weight `in_features` wide cannot be stored in this format, or None."""
        if self.group_size and in_features % self.group_size:
            return f"{self.name} needs tensor widths divisible by {self.group_size} (this model has {in_features})"
        return None


_PATHS = dict(decode_kernel=True, prefill_kernel=True)
# In the order a chooser lists them: the largest and exact first.
QUANT_FORMATS: dict[str, QuantFormat] = {f.name: f for f in (
    QuantFormat("bf16", 0, 0, 2.0, "exact", **_PATHS, cpu_kernel=True, cpu_in_place=False, cpu_fused=False, dense=False),
    QuantFormat("fp8", 1, 0, 1.0, "near exact", **_PATHS, cpu_kernel=False, cpu_in_place=False, cpu_fused=False,
                dense=False),
    QuantFormat("int8", 4, 0, 1.0, "near exact", **_PATHS, cpu_kernel=True, cpu_in_place=True, cpu_fused=True,
                dense=True),
    QuantFormat("nvfp4", 2, 16, 9 / 16, "smallest", **_PATHS, cpu_kernel=False, cpu_in_place=False, cpu_fused=False,
                dense=False),
    QuantFormat("mxfp4", 3, 32, 17 / 32, "smallest", **_PATHS, cpu_kernel=False, cpu_in_place=False, cpu_fused=False,
                dense=False),
)}
FORMATS = tuple(QUANT_FORMATS)
DENSE_FORMATS = tuple(name for name, f in QUANT_FORMATS.items() if f.dense)


def quant_format(name: str) -> QuantFormat:
    """The descriptor of `name`; ValueError for an unknown one (engine.format.quant words it for users)."""
    try:
        return QUANT_FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown expert format {name!r}: one of {', '.join(FORMATS)}") from None
