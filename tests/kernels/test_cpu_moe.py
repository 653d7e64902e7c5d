"""The fused CPU experts (kernels.cpu_moe) against the torch reference over the dequantised block: each
activation the families use (relu2's blocks ungated: no gate fields), with and without expert biases, one token and a group of tokens, real
OLMoE shapes, the weighted rows added on top of what y held, and a layer's experts in one call (more
than one call's worth too) giving what one call an expert gives."""
import pytest
import torch
import torch.nn.functional as F

from engine.format.layout import block_layout
from kernels import cpu_moe
from kernels.activation import RELU2, SILU, clamped_silu, clamped_swiglu
from kernels.formats import dequantize_parts, random_bank

pytestmark = pytest.mark.skipif(not cpu_moe.available(), reason="numba is not installed")

CASES = [("silu", SILU, False), ("clamped_swiglu", clamped_swiglu(1.702, 7.0), True),
         ("clamped_silu", clamped_silu(2.0), False), ("relu2", RELU2, False)]


def _blocks(intermediate, hidden, bias, activation, count=1, seed=0):
    """A kernel for the layout and `count` random blocks with their parts (for the reference)."""
    layout = block_layout(intermediate, hidden, "int8", bias=bias, gated=activation.is_gated)
    offsets = {f.name: f.offset for f in layout.fields}
    bank = random_bank(count, layout.block_bytes, "int8", offsets, intermediate, hidden,
                       generator=torch.Generator().manual_seed(seed))
    kernel = cpu_moe.FusedExperts(offsets, intermediate, hidden, activation)
    return kernel, list(bank), [layout.parts(block) for block in bank]


def _block(intermediate, hidden, bias, activation, seed=0):
    kernel, blocks, parts = _blocks(intermediate, hidden, bias, activation, 1, seed)
    return kernel, blocks[0], parts[0]


def _reference(x, parts, activation):
    """The family's expert over float64 copies of the dequantised weights."""
    w = {p: (d["b"] if "b" in d else dequantize_parts(d, "int8")).double() for p, d in parts.items()}
    gate = F.linear(x.double(), w["gate"], w.get("gate_bias")) if "gate" in w else None
    up = F.linear(x.double(), w["up"], w.get("up_bias"))
    return F.linear(activation(gate, up), w["down"], w.get("down_bias"))


@pytest.mark.parametrize("name,activation,bias", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("tokens", [[0], [0, 2, 3], [5, 0, 1, 2, 3, 4]], ids=["one", "three", "six"])
def test_matches_the_reference_and_adds_into_y(name, activation, bias, tokens):
    kernel, block, parts = _block(96, 64, bias, activation)
    x = torch.randn(6, 64) * 2                       # large enough that the clamps act
    weight = torch.tensor([0.75, 0.5, 2.0, 1.0, -0.25, 3.0][:len(tokens)])    # (six: four a pass, then two)
    before = torch.randn(6, 64)
    y = before.clone()
    kernel.into(y, x, [block], [torch.tensor(tokens)], [weight])
    expected = before.double().clone()
    expected[tokens] += weight.double()[:, None] * _reference(x, parts, activation)[tokens]
    assert torch.allclose(y.double(), expected, rtol=1e-5, atol=1e-5)
    untouched = [t for t in range(6) if t not in tokens]
    assert torch.equal(y[untouched], before[untouched])


def test_olmoe_shapes_within_float32_rounding():
    kernel, block, parts = _block(1024, 2048, False, SILU, seed=1)
    x = torch.randn(1, 2048)
    y = torch.zeros(1, 2048)
    kernel.into(y, x, [block], [torch.zeros(1, dtype=torch.long)], [torch.ones(1)])
    ref = _reference(x, parts, SILU)
    assert float((y.double() - ref).abs().max() / ref.abs().max()) < 1e-5


def test_an_ungated_block_takes_an_ungated_activation_only():
    layout = block_layout(96, 64, "int8", gated=False)
    with pytest.raises(ValueError, match="ungated block takes no silu activation"):
        cpu_moe.FusedExperts({f.name: f.offset for f in layout.fields}, 96, 64, SILU)


def test_a_wrong_activation_is_visible():
    """The check is not blind: clamped_silu's clamp changes the answer where gate or up leave the limit."""
    kernel, block, parts = _block(96, 64, False, SILU)
    x = torch.randn(1, 64) * 4
    y = torch.zeros(1, 64)
    kernel.into(y, x, [block], [torch.zeros(1, dtype=torch.long)], [torch.ones(1)])
    clamped = _reference(x, parts, clamped_silu(0.05))
    assert not torch.allclose(y.double(), clamped, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name,activation,bias", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("count", [3, cpu_moe.MAX_BLOCKS + 3], ids=["one-call", "two-calls"])
def test_a_layers_experts_in_one_call_give_what_one_call_each_gives(name, activation, bias, count):
    """A decode step's experts (one token each) and a prompt's (groups sharing tokens) in one call: each
    output the sum of the experts' weighted references, and bit for bit what calls of one expert give in
    the same order (each output column adds the experts in order, whatever the threads)."""
    kernel, blocks, parts = _blocks(80, 48, bias, activation, count, seed=3)
    x = torch.randn(5, 48) * 2
    gen = torch.Generator().manual_seed(4)
    for tokens in ([torch.zeros(1, dtype=torch.long)] * count,
                   [torch.randperm(5, generator=gen)[:1 + e % 5] for e in range(count)]):
        weights = [torch.rand(len(t), generator=gen) for t in tokens]
        y = torch.randn(5, 48)
        one_by_one = y.clone()
        expected = y.double().clone()
        kernel.into(y, x, blocks, tokens, weights)
        for block, p, t, w in zip(blocks, parts, tokens, weights):
            kernel.into(one_by_one, x, [block], [t], [w])
            expected[t] += w.double()[:, None] * _reference(x, p, activation)[t]
        assert torch.equal(y, one_by_one)
        assert torch.allclose(y.double(), expected, rtol=1e-5, atol=1e-5)
