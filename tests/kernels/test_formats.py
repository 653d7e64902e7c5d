"""kernels/formats.py must read blocks exactly as engine/quant.py + engine/layout.py write them."""
import pytest
import torch

from engine.format.layout import block_layout
from engine.format.quant import dequantize, quantize
from kernels.formats import dequantize_block, make_offsets, random_bank


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "nvfp4", "mxfp4", "int8"])
@pytest.mark.parametrize("intermediate,hidden", [(96, 160), (32, 2048)])   # small odd multiples of 32; real hidden
@pytest.mark.parametrize("bias", [False, True], ids=["plain", "biases"])
@pytest.mark.parametrize("gated", [True, False], ids=["gated", "ungated"])
def test_offsets_and_dequant_match_engine(fmt, intermediate, hidden, bias, gated):
    layout = block_layout(intermediate, hidden, fmt, bias=bias, gated=gated)
    offsets, block_bytes = make_offsets(fmt, intermediate, hidden, bias=bias, gated=gated)
    assert offsets == {f.name: f.offset for f in layout.fields}
    assert block_bytes == layout.block_bytes and layout.is_gated == gated

    g = torch.Generator().manual_seed(7)
    dense = {"gate": torch.randn(intermediate, hidden, generator=g), "up": torch.randn(intermediate, hidden, generator=g),
             "down": torch.randn(hidden, intermediate, generator=g)}
    parts = {}
    for proj, w in dense.items():
        for name, t in quantize(w, fmt).items():
            parts[f"{proj}.{name}"] = t
    if bias:
        for name, n in (("gate_bias", intermediate), ("up_bias", intermediate), ("down_bias", hidden)):
            dense[name] = parts[f"{name}.b"] = torch.randn(n, generator=g)
    if not gated:                                    # no gate field, nor its bias: the block holds the rest alone
        dense = {name: w for name, w in dense.items() if not name.startswith("gate")}
        parts = {name: t for name, t in parts.items() if not name.startswith("gate")}
    block = layout.pack(parts)
    ours = dequantize_block(block, fmt, offsets, intermediate, hidden)
    assert set(ours) == set(dense)
    for proj in dense:
        theirs = dequantize({k.split(".")[1]: v for k, v in parts.items() if k.split(".")[0] == proj}, fmt)
        torch.testing.assert_close(ours[proj], theirs, rtol=1e-6, atol=1e-6)   # same math; op order may differ by torch version


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "nvfp4", "mxfp4", "int8"])
def test_an_ungated_block_moves_two_projections_not_three(fmt):
    """Nemotron-H's experts: up and down alone, a third fewer bytes a block than a gated expert of their sizes."""
    gated, ungated = block_layout(1856, 2688, fmt), block_layout(1856, 2688, fmt, gated=False)
    assert [f.name.split(".")[0] for f in ungated.fields if f.name.endswith(".w")] == ["up", "down"]
    weight_bytes = lambda layout: sum(f.nbytes for f in layout.fields if f.name.endswith(".w"))     # noqa: E731
    assert weight_bytes(ungated) * 3 == weight_bytes(gated) * 2
    assert ungated.block_bytes < 0.7 * gated.block_bytes


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "nvfp4", "mxfp4", "int8"])
@pytest.mark.parametrize("bias", [False, True], ids=["plain", "biases"])
def test_random_bank_is_finite_and_not_zero(fmt, bias):
    offsets, block_bytes = make_offsets(fmt, 64, 96, bias=bias)
    bank = random_bank(3, block_bytes, fmt, offsets, 64, 96)
    for slot in range(3):
        decoded = dequantize_block(bank[slot], fmt, offsets, 64, 96)
        assert len(decoded) == (6 if bias else 3)
        for name, w in decoded.items():
            assert torch.isfinite(w).all() and w.abs().mean() > 1e-3
            if name in ("gate", "up", "down"):       # like trained weights: magnitude ~ 1/sqrt(in)
                assert 0.2 < w.std().item() * w.shape[1] ** 0.5 < 5
