"""kernels/formats.py must read blocks exactly as engine/quant.py + engine/layout.py write them."""
import pytest
import torch

from engine.format.layout import block_layout
from engine.format.quant import dequantize, quantize
from kernels.formats import dequantize_block, make_offsets, random_bank


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "nvfp4"])
@pytest.mark.parametrize("intermediate,hidden", [(48, 80), (32, 2048)])   # small odd multiple of 16; real hidden
def test_offsets_and_dequant_match_engine(fmt, intermediate, hidden):
    layout = block_layout(intermediate, hidden, fmt)
    offsets, block_bytes = make_offsets(fmt, intermediate, hidden)
    assert offsets == {f.name: f.offset for f in layout.fields}
    assert block_bytes == layout.block_bytes

    g = torch.Generator().manual_seed(7)
    dense = {"gate": torch.randn(intermediate, hidden, generator=g), "up": torch.randn(intermediate, hidden, generator=g),
             "down": torch.randn(hidden, intermediate, generator=g)}
    parts = {}
    for proj, w in dense.items():
        for name, t in quantize(w, fmt).items():
            parts[f"{proj}.{name}"] = t
    block = layout.pack(parts)
    ours = dequantize_block(block, fmt, offsets, intermediate, hidden)
    for proj in dense:
        theirs = dequantize({k.split(".")[1]: v for k, v in parts.items() if k.startswith(proj + ".")}, fmt)
        torch.testing.assert_close(ours[proj], theirs, rtol=1e-6, atol=1e-6)   # same math; op order may differ by torch version


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "nvfp4"])
def test_random_bank_is_finite_and_not_zero(fmt):
    offsets, block_bytes = make_offsets(fmt, 48, 80)
    bank = random_bank(3, block_bytes, fmt, offsets, 48, 80)
    for slot in range(3):
        for w in dequantize_block(bank[slot], fmt, offsets, 48, 80).values():
            assert torch.isfinite(w).all() and w.abs().mean() > 1e-3
