"""The fused CPU expert (kernels.cpu_moe) against the torch reference over the dequantised block: each
activation the families use, with and without expert biases, one token and a group of tokens, real
OLMoE shapes, and the weighted rows added on top of what y held."""
import pytest
import torch
import torch.nn.functional as F

from engine.format.layout import block_layout
from kernels import cpu_moe
from kernels.activation import SILU, clamped_silu, clamped_swiglu
from kernels.formats import dequantize_parts, random_bank

pytestmark = pytest.mark.skipif(not cpu_moe.available(), reason="numba is not installed")

CASES = [("silu", SILU, False), ("clamped_swiglu", clamped_swiglu(1.702, 7.0), True),
         ("clamped_silu", clamped_silu(2.0), False)]


def _block(intermediate, hidden, bias, seed=0):
    layout = block_layout(intermediate, hidden, "int8", bias=bias)
    offsets = {f.name: f.offset for f in layout.fields}
    block = random_bank(1, layout.block_bytes, "int8", offsets, intermediate, hidden,
                        generator=torch.Generator().manual_seed(seed))[0]
    return layout.parts(block)


def _reference(x, parts, activation):
    """The family's expert over float64 copies of the dequantised weights."""
    w = {p: (d["b"] if "b" in d else dequantize_parts(d, "int8")).double() for p, d in parts.items()}
    gate = F.linear(x.double(), w["gate"], w.get("gate_bias"))
    up = F.linear(x.double(), w["up"], w.get("up_bias"))
    return F.linear(activation(gate, up), w["down"], w.get("down_bias"))


@pytest.mark.parametrize("name,activation,bias", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("tokens", [[0], [0, 2, 3], [5, 0, 1, 2, 3, 4]], ids=["one", "three", "six"])
def test_matches_the_reference_and_adds_into_y(name, activation, bias, tokens):
    parts = _block(96, 64, bias)
    x = torch.randn(6, 64) * 2                       # large enough that the clamps act
    weight = torch.tensor([0.75, 0.5, 2.0, 1.0, -0.25, 3.0][:len(tokens)])    # (six: four a pass, then two)
    before = torch.randn(6, 64)
    y = before.clone()
    cpu_moe.expert_into(y, x, parts, torch.tensor(tokens), weight, activation)
    expected = before.double().clone()
    expected[tokens] += weight.double()[:, None] * _reference(x, parts, activation)[tokens]
    assert torch.allclose(y.double(), expected, rtol=1e-5, atol=1e-5)
    untouched = [t for t in range(6) if t not in tokens]
    assert torch.equal(y[untouched], before[untouched])


def test_olmoe_shapes_within_float32_rounding():
    parts = _block(1024, 2048, False, seed=1)
    x = torch.randn(1, 2048)
    y = torch.zeros(1, 2048)
    cpu_moe.expert_into(y, x, parts, torch.zeros(1, dtype=torch.long), torch.ones(1), SILU)
    ref = _reference(x, parts, SILU)
    assert float((y.double() - ref).abs().max() / ref.abs().max()) < 1e-5


def test_a_wrong_activation_is_visible():
    """The check is not blind: clamped_silu's clamp changes the answer where gate or up leave the limit."""
    parts = _block(96, 64, False)
    x = torch.randn(1, 64) * 4
    y = torch.zeros(1, 64)
    cpu_moe.expert_into(y, x, parts, torch.zeros(1, dtype=torch.long), torch.ones(1), SILU)
    clamped = _reference(x, parts, clamped_silu(0.05))
    assert not torch.allclose(y.double(), clamped, rtol=1e-3, atol=1e-4)
