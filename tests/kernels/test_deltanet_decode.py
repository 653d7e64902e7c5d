"""The DeltaNet decode kernel (kernels/deltanet_decode.py) against the models' torch path over several steps, and its
self-check (the kernel on the models' path: tests/engine/test_attach.py)."""
import pytest
import torch

from kernels import selfcheck
from kernels.deltanet_decode import deltanet_decode, deltanet_decode_ref
from kernels.selfcheck import select_deltanet_decode

TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}
# bf16's beta (sigmoid(b) in b's dtype) is rounded in the kernel: Triton's interpreter truncates where a GPU rounds
STATE_TOLERANCE = {torch.float32: TOLERANCE[torch.float32],
                   torch.bfloat16: TOLERANCE[torch.float32] if torch.cuda.is_available() else TOLERANCE[torch.bfloat16]}


def token(gen, heads, device, dtype, decay):
    """q, k, v, a, b, gate of one token and its layer's a_log, dt_bias; `decay`: the range of exp(g) as (low, high),
    the a that gives it with those a_log and dt_bias (g = -exp(a_log) * softplus(a + dt_bias))."""
    (num_k_heads, num_v_heads, k_dim, v_dim), (low, high) = heads, decay
    rand = lambda *shape: (2 * torch.randn(*shape, generator=gen)).to(device, dtype)     # noqa: E731
    rate = 0.5 + 1.5 * torch.rand(num_v_heads, generator=gen)                           # exp(a_log)
    dt_bias = torch.randn(num_v_heads, generator=gen)
    target = low + (high - low) * torch.rand(1, num_v_heads, generator=gen)             # exp(g)
    softplus = -target.log() / rate
    a = torch.where(softplus > 20, softplus, torch.expm1(softplus).clamp_min(1e-30).log()) - dt_bias
    return (rand(1, num_k_heads, k_dim), rand(1, num_k_heads, k_dim), rand(1, num_v_heads, v_dim), a.to(device, dtype),
            rand(1, num_v_heads), rand(1, num_v_heads, v_dim), rate.log().to(device, dtype), dt_bias.to(device, dtype))


@pytest.mark.parametrize("heads", [(2, 4, 16, 8),        # Hv = 2 Hk, Dk != Dv: the tiny test models'
                                   (3, 3, 24, 40),       # Hv = Hk, dims not powers of two (masked tails)
                                   (1, 2, 128, 128)])    # the real models' head dims: a full 128 x 128 tile
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation, gated", [("silu", True), ("sigmoid", True), ("silu", False)])
def test_steps_equal_the_torch_path_with_the_state_carried(device, heads, dtype, activation, gated):
    gen = torch.Generator().manual_seed(sum(heads))
    num_v_heads, k_dim, v_dim = heads[1:]
    state = (0.3 * torch.randn(num_v_heads, k_dim, v_dim, generator=gen)).to(device)
    expected_state = state.clone()
    weight = (1 + 0.2 * torch.randn(v_dim, generator=gen)).to(device, dtype)
    # nearly forgetting everything, nearly keeping everything, then anything in between
    for decay in [(1e-4, 1e-3), (0.999, 1.0), (1e-3, 1.0), (1e-3, 1.0)]:
        q, k, v, a, b, gate, a_log, dt_bias = token(gen, heads, device, dtype, decay)
        norm = (gate, weight, 1e-6, activation) if gated else ()
        out = deltanet_decode(q, k, v, a, b, a_log, dt_bias, state, *norm)
        expected = deltanet_decode_ref(q, k, v, a, b, a_log, dt_bias, expected_state, *norm)
        assert out.shape == v.shape and out.dtype == dtype
        torch.testing.assert_close(out.float(), expected.float(), **TOLERANCE[dtype])
        torch.testing.assert_close(state, expected_state, **STATE_TOLERANCE[dtype])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton's interpreter rounds bf16 by truncation")
@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_bf16_outputs_round_as_the_torch_path(device, activation):
    gen = torch.Generator().manual_seed(11)
    heads = (16, 32, 128, 128)                                     # Qwen3-Next's
    state = (0.3 * torch.randn(32, 128, 128, generator=gen)).to(device)
    expected_state, weight = state.clone(), (1 + 0.2 * torch.randn(128, generator=gen)).to(device, torch.bfloat16)
    for _ in range(3):
        q, k, v, a, b, gate, a_log, dt_bias = token(gen, heads, device, torch.bfloat16, (1e-3, 1.0))
        out = deltanet_decode(q, k, v, a, b, a_log, dt_bias, state, gate, weight, 1e-6, activation)
        expected = deltanet_decode_ref(q, k, v, a, b, a_log, dt_bias, expected_state, gate, weight, 1e-6, activation)
        assert (out != expected).float().mean() < 0.01          # a last-bit difference where the sums' order differs
        torch.testing.assert_close(out.float(), expected.float(), **TOLERANCE[torch.bfloat16])


def test_a_float32_weight_on_bf16_values_keeps_the_product_unrounded(device):
    """torch's bf16 normed o times a float32 weight stays float32 until the last rounding: the kernel rounds alike."""
    gen = torch.Generator().manual_seed(5)
    heads = (2, 4, 16, 8)
    state = torch.randn(4, 16, 8, generator=gen).to(device)
    expected_state, weight = state.clone(), (1 + 0.2 * torch.randn(8, generator=gen)).to(device)
    q, k, v, a, b, gate, a_log, dt_bias = token(gen, heads, device, torch.bfloat16, (0.5, 1.0))
    out = deltanet_decode(q, k, v, a, b, a_log, dt_bias, state, gate, weight)
    expected = deltanet_decode_ref(q, k, v, a, b, a_log, dt_bias, expected_state, gate, weight)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected.float(), **TOLERANCE[torch.bfloat16])


def test_selfcheck_passes_the_kernel_and_refuses_one_that_skips_the_decay(device, monkeypatch):
    monkeypatch.setattr(selfcheck, "_warnings", [])
    fn, verdict = select_deltanet_decode(2, 4, 16, 8, "sigmoid", torch.float32, torch.float32, device)
    assert verdict.ok and fn is deltanet_decode

    def no_decay(q, k, v, a, *rest):                     # softplus(-inf) = 0: g = 0, every decay 1
        return deltanet_decode(q, k, v, torch.full_like(a, float("-inf")), *rest)
    fn, verdict = select_deltanet_decode(2, 2, 16, 8, "sigmoid", torch.float32, torch.float32, device,   # own verdict
                                         kernel=no_decay)
    assert not verdict.ok and fn is None


def test_selfcheck_refuses_a_kernel_that_does_not_write_the_state_back(device, monkeypatch):
    monkeypatch.setattr(selfcheck, "_warnings", [])

    def forgetful(q, k, v, a, b, a_log, dt_bias, state, *rest):
        return deltanet_decode(q, k, v, a, b, a_log, dt_bias, state.clone(), *rest)
    fn, verdict = select_deltanet_decode(2, 4, 16, 8, "silu", torch.float32, torch.float32, device, kernel=forgetful)
    assert not verdict.ok and fn is None
