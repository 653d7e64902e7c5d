"""kernels/formats.py must read blocks exactly as engine/quant.py + engine/layout.py write them."""
import pytest
import torch

from engine.format.layout import block_layout
from engine.format.quant import dequantize, quantize
from kernels.formats import dequantize_block, make_offsets, random_bank


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "nvfp4", "mxfp4", "int8"])
@pytest.mark.parametrize("intermediate,hidden", [(96, 160), (32, 2048)])   # small odd multiples of 32; real hidden
@pytest.mark.parametrize("bias", [False, True], ids=["plain", "biases"])
def test_offsets_and_dequant_match_engine(fmt, intermediate, hidden, bias):
    layout = block_layout(intermediate, hidden, fmt, bias=bias)
    offsets, block_bytes = make_offsets(fmt, intermediate, hidden, bias=bias)
    assert offsets == {f.name: f.offset for f in layout.fields}
    assert block_bytes == layout.block_bytes

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
    block = layout.pack(parts)
    ours = dequantize_block(block, fmt, offsets, intermediate, hidden)
    assert set(ours) == set(dense)
    for proj in dense:
        theirs = dequantize({k.split(".")[1]: v for k, v in parts.items() if k.split(".")[0] == proj}, fmt)
        torch.testing.assert_close(ours[proj], theirs, rtol=1e-6, atol=1e-6)   # same math; op order may differ by torch version


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
