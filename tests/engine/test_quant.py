"""Quant formats: the torch reference round-trips within each format's tolerance, and blocks pack losslessly."""
import pytest
import torch

from engine.errors import SluiceError
from engine.format.layout import block_layout
from engine.format.quant import E2M1_VALUES, FORMATS, dequantize, quantize

TOLERANCE = {"bf16": 0.005, "fp8": 0.04, "int8": 0.01, "nvfp4": 0.12, "mxfp4": 0.15}   # relative Frobenius error on Gaussian weights


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(48, 64), (7, 160), (1, 32)])   # odd rows, width = 5 mxfp4 groups, one row
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


def test_mxfp4_scales_are_powers_of_two_per_32_and_represent_the_grid_exactly():
    grid = torch.cat([E2M1_VALUES, -E2M1_VALUES.flip(0)])          # 16 values, amax 6
    row = torch.cat([grid, grid, grid * 2.0 ** -20, grid * 2.0 ** -20, torch.zeros(32)])[None, :]   # 3 groups of 32
    parts = quantize(row, "mxfp4")
    assert parts["w"].shape == (1, 48) and parts["scale"].shape == (1, 3) and parts["scale"].dtype == torch.uint8
    assert parts["scale"].tolist() == [[127, 107, 0]]              # 2^0, 2^-20, zero group: the smallest e8m0
    assert torch.equal(dequantize(parts, "mxfp4"), row)
    assert int(parts["w"][0, 0]) == (1 << 4) | 0                   # element 0 (0.0) low nibble, element 1 (0.5) high
    nothing_clips = torch.tensor([[7.0] + [0.0] * 31])            # 7 needs scale 2: 7/2 = 3.5 -> e2m1 4 (ties down: 3)
    assert dequantize(quantize(nothing_clips, "mxfp4"), "mxfp4")[0, 0].item() in (6.0, 8.0)


def test_mxfp4_dequantize_equals_transformers_on_hub_layout_blocks():
    """gpt-oss stores `*_blocks` [E, out, in/32, 16] and `*_scales` [E, out, in/32]; row e of our
    [out, in/2] / [out, in/32] parts is the same bytes, and must decode to what transformers decodes."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(3)
    blocks = torch.randint(0, 256, (2, 6, 4, 16), generator=g, dtype=torch.uint8)     # 2 experts, out 6, in 128
    scales = torch.randint(110, 135, (2, 6, 4), generator=g, dtype=torch.uint8)
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)          # [E, in, out]
    for e in range(2):
        ours = dequantize({"w": blocks[e].reshape(6, 64), "scale": scales[e]}, "mxfp4")
        assert torch.equal(ours, theirs[e].T)


def test_fp8_scale_is_per_output_row():
    w = torch.tensor([[1.0, -2.0], [100.0, 50.0]])
    parts = quantize(w, "fp8")
    assert torch.allclose(parts["scale"], torch.tensor([2.0, 100.0]) / 448)
    assert torch.allclose(dequantize(parts, "fp8"), w, rtol=0.07)


def test_int8_is_symmetric_per_row_with_bf16_scales_and_never_clips():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(64, 96, generator=g) * torch.logspace(-6, 3, 64)[:, None]      # rows across 9 decades
    w[5] = 0.0                                                                      # a zero row
    parts = quantize(w, "int8")
    assert parts["w"].dtype == torch.int8 and parts["scale"].dtype == torch.bfloat16 and parts["scale"].shape == (64,)
    nonzero = torch.arange(64) != 5
    assert (parts["w"][nonzero].abs().amax(dim=1) == 127).all()                   # amax -> exactly 127: nothing clips
    assert parts["w"].min() >= -127                                                 # symmetric: -128 is never used
    assert not parts["w"][5].any() and parts["scale"][5] > 0                        # zero row: zero codes, no 0 / 0
    d = dequantize(parts, "int8")
    assert torch.isfinite(d).all() and not d[5].any()
    assert ((d - w).abs() <= parts["scale"].float()[:, None] / 2 * 1.0001).all()    # within half a step per value
    assert torch.equal(d, parts["w"].float() * parts["scale"].float()[:, None])     # what every device computes with


def test_nvfp4_rejects_widths_not_divisible_by_16_and_unknown_formats():
    with pytest.raises(SluiceError, match="divisible by 16"):
        quantize(torch.randn(4, 24), "nvfp4")
    with pytest.raises(SluiceError, match="Unknown quant format"):
        quantize(torch.randn(4, 16), "int3")
    with pytest.raises(SluiceError, match="mxfp4 needs tensor widths divisible by 32"):
        quantize(torch.randn(4, 48), "mxfp4")


@pytest.mark.parametrize("fmt", FORMATS)
def test_block_pack_and_views_round_trip(fmt):
    layout = block_layout(intermediate=96, hidden=64, fmt=fmt)
    assert layout.block_bytes % 4096 == 0 and all(f.offset % 256 == 0 for f in layout.fields)
    weights = {"gate": torch.randn(96, 64), "up": torch.randn(96, 64), "down": torch.randn(64, 96)}
    parts = {f"{p}.{k}": v for p, w in weights.items() for k, v in quantize(w, fmt).items()}
    views = layout.views(layout.pack(parts))
    for name, tensor in parts.items():
        assert torch.equal(views[name].view(torch.uint8), tensor.view(torch.uint8)), name


@pytest.mark.parametrize("fmt", FORMATS)
def test_expert_biases_are_float32_fields_after_the_weights(fmt):
    layout = block_layout(intermediate=64, hidden=96, fmt=fmt, bias=True)
    assert layout.has_bias and not block_layout(intermediate=64, hidden=96, fmt=fmt).has_bias
    names = [f.name for f in layout.fields]
    assert names[-3:] == ["gate_bias.b", "up_bias.b", "down_bias.b"]
    assert [layout.field(n).shape for n in names[-3:]] == [(64,), (64,), (96,)]
    bias = torch.randn(96) * 0.1
    parts = {f"{p}.{k}": v for p, w in {"gate": torch.randn(64, 96), "up": torch.randn(64, 96),
                                        "down": torch.randn(96, 64)}.items() for k, v in quantize(w, fmt).items()}
    parts.update({"gate_bias.b": bias[:64], "up_bias.b": -bias[:64], "down_bias.b": bias})
    views = layout.views(layout.pack(parts))
    assert torch.equal(dequantize({"b": views["down_bias.b"]}, fmt), bias)      # exact in every format


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_int8_round_trip_is_quantize_then_dequantize_bit_for_bit(dtype):
    """The embedding row's numpy round trip (engine.format.file_table) gives torch's quantize / dequantize values:
    random rows of many magnitudes, a zero row, a row of one value, and rows whose w / scale land on .5 (ties
    round to even in both)."""
    from engine.format.quant import int8_round_trip
    from kernels.cpu_linear import dequantized
    gen = torch.Generator().manual_seed(5)
    rows = torch.randn(64, 512, generator=gen) * torch.logspace(-30, 30, 64)[:, None]
    ties = (torch.arange(-126, 126, dtype=torch.float32) + 0.5).repeat(3)[:512]
    ties[0] = 127.0                                          # amax 127: scale 1, every other value a tie
    rows = torch.cat([rows, torch.zeros(1, 512), torch.full((1, 512), -3.25), ties[None]]).to(dtype)
    parts = quantize(rows, "int8")
    expected = dequantized(parts["w"], parts["scale"], dtype)
    got = int8_round_trip(rows).to(dtype)
    assert torch.equal(got, expected)
