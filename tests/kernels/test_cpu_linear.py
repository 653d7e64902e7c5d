"""packed_linear (kernels/cpu_linear.py) against x @ W.T with each format's dequantized weights."""
import pytest
import torch

from engine.format.quant import FORMATS, quantize
from kernels.cpu_linear import INT8PACK_MAX_TOKENS, packed_linear
from kernels.formats import dequantize_parts

TOLERANCE = {torch.bfloat16: 1e-2, torch.float32: 1e-5}      # relative Frobenius error


def _parts(fmt, out_features, in_features, seed):
    g = torch.Generator().manual_seed(seed)
    return quantize(torch.randn(out_features, in_features, generator=g) * in_features ** -0.5, fmt)


def _rel(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("num_tokens,out_features,in_features", [
    (1, 96, 64),       # one token (decode)
    (7, 37, 160),      # odd T, odd out rows, 5 mxfp4 groups
    (64, 48, 32),      # a prefill batch
])
def test_matches_dequantized_reference(fmt, dtype, num_tokens, out_features, in_features):
    parts = _parts(fmt, out_features, in_features, seed=num_tokens)
    x = torch.randn(num_tokens, in_features, generator=torch.Generator().manual_seed(5)).to(dtype)
    out = packed_linear(x, parts, fmt)
    assert out.shape == (num_tokens, out_features) and out.dtype == dtype
    ref = x.double() @ dequantize_parts(parts, fmt).double().T
    assert _rel(out, ref) < TOLERANCE[dtype]


def test_int8_bf16_decode_runs_torchs_int8_matmul_and_float32_is_exact():
    parts = _parts("int8", 40, 64, seed=3)
    x = torch.randn(INT8PACK_MAX_TOKENS, 64, generator=torch.Generator().manual_seed(4))
    fast = torch.ops.aten._weight_int8pack_mm(x.bfloat16(), parts["w"], parts["scale"])
    assert torch.equal(packed_linear(x.bfloat16(), parts, "int8"), fast)
    exact = torch.nn.functional.linear(x, parts["w"].float() * parts["scale"].float()[:, None])
    assert torch.equal(packed_linear(x, parts, "int8"), exact)


@pytest.mark.parametrize("in_features", [40, 7])      # not multiples of 16: torch's int8 kernel would return NaN
def test_int8_bf16_widths_the_int8_matmul_cannot_take(in_features):
    parts = _parts("int8", 9, in_features, seed=in_features)
    x = torch.randn(3, in_features, generator=torch.Generator().manual_seed(6)).bfloat16()
    out = packed_linear(x, parts, "int8")
    assert torch.isfinite(out).all() and out.dtype == torch.bfloat16
    assert _rel(out, x.double() @ dequantize_parts(parts, "int8").double().T) < 1e-2


def test_leading_dimensions_and_no_tokens():
    parts = _parts("int8", 24, 32, seed=8)
    x = torch.randn(2, 3, 32).bfloat16()
    assert torch.equal(packed_linear(x, parts, "int8"), packed_linear(x.reshape(6, 32), parts, "int8").reshape(2, 3, 24))
    assert packed_linear(torch.zeros(0, 32, dtype=torch.bfloat16), parts, "int8").shape == (0, 24)
