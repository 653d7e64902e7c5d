"""Quant formats: the torch reference round-trips within each format's tolerance, and blocks pack losslessly."""
import pytest
import torch

from engine.errors import SluiceError
from engine.format.layout import block_layout
from engine.format.quant import E2M1_VALUES, FORMATS, dequantize, quantize

TOLERANCE = {"bf16": 0.005, "fp8": 0.04, "nvfp4": 0.12}   # relative Frobenius error on Gaussian weights


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(48, 64), (7, 160), (1, 16)])   # odd rows, width = 10 nvfp4 groups, one row
def test_round_trip_error_within_format_tolerance(fmt, shape):
    w = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 0.3
    d = dequantize(quantize(w, fmt), fmt)
    assert d.shape == w.shape and torch.isfinite(d).all()
    assert (d - w).norm() / w.norm() < TOLERANCE[fmt]
    assert torch.equal(dequantize(quantize(d, fmt), fmt), d)     # dequantized weights are a fixed point


def test_nvfp4_represents_e2m1_grid_exactly_and_packs_two_per_byte():
    row = torch.cat([E2M1_VALUES, -E2M1_VALUES.flip(0)])          # 16 values, one group, amax 6
    parts = quantize(row[None, :], "nvfp4")
    assert parts["w"].shape == (1, 8) and parts["w"].dtype == torch.uint8
    torch.testing.assert_close(dequantize(parts, "nvfp4"), row[None, :], rtol=1e-6, atol=0)
    assert int(parts["w"][0, 0]) == (1 << 4) | 0                   # element 0 (0.0) low nibble, element 1 (0.5) high


def test_fp8_scale_is_per_output_row():
    w = torch.tensor([[1.0, -2.0], [100.0, 50.0]])
    parts = quantize(w, "fp8")
    assert torch.allclose(parts["scale"], torch.tensor([2.0, 100.0]) / 448)
    assert torch.allclose(dequantize(parts, "fp8"), w, rtol=0.07)


def test_nvfp4_rejects_widths_not_divisible_by_16_and_unknown_formats():
    with pytest.raises(SluiceError, match="divisible by 16"):
        quantize(torch.randn(4, 24), "nvfp4")
    with pytest.raises(SluiceError, match="Unknown quant format"):
        quantize(torch.randn(4, 16), "int3")


@pytest.mark.parametrize("fmt", FORMATS)
def test_block_pack_and_views_round_trip(fmt):
    layout = block_layout(intermediate=48, hidden=64, fmt=fmt)
    assert layout.block_bytes % 4096 == 0 and all(f.offset % 256 == 0 for f in layout.fields)
    weights = {"gate": torch.randn(48, 64), "up": torch.randn(48, 64), "down": torch.randn(64, 48)}
    parts = {f"{p}.{k}": v for p, w in weights.items() for k, v in quantize(w, fmt).items()}
    views = layout.views(layout.pack(parts))
    for name, tensor in parts.items():
        assert torch.equal(views[name].view(torch.uint8), tensor.view(torch.uint8)), name
