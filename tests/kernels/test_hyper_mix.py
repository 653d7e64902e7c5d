"""qwen4_exp's hyper-connection step kernels (kernels/hyper_mix.py) against their torch steps (kernels/hyper_ref.py)
and their self-check (the kernels on the model's path: tests/engine/test_attach.py)."""
import pytest
import torch

from kernels import selfcheck
from kernels.hyper_mix import gated_mean, inject, scaled_silu, stream_weights
from kernels.hyper_ref import HyperSteps, gated_mean_ref, inject_ref, scaled_silu_ref, stream_weights_ref
from kernels.selfcheck import select_hyper_steps

# (tokens, n, H, R)
SHAPES = [(1, 4, 2048, 32),     # a decode token, power-of-two dims
          (1, 3, 64, 8),        # the test model's (n = 3: 1 / n is not exact)
          (37, 3, 1100, 7),     # a prompt; H over one block, odd rank
          (5, 2, 97, 1)]        # prime H, rank 1
# float32: the kernels' order is torch's but for 1 / n and the mean's sum; bf16: the interpreter truncates where a
# GPU rounds to nearest, so a value may be one bf16 step off, an intermediate's (up to 16: 0.0625) where a sum cancels
TOLERANCE = {torch.float32: dict(rtol=1e-6, atol=1e-6), torch.bfloat16: dict(rtol=2e-2, atol=0.07)}


def _rows(g, device, dtype, *shape, spread=3.0):
    return (torch.randn(*shape, generator=g) * spread).to(device, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens, count, hidden, rank", SHAPES)
def test_each_step_matches_its_torch_step(device, dtype, tokens, count, hidden, rank):
    g = torch.Generator().manual_seed(tokens * 31 + hidden)
    d = _rows(g, device, dtype, tokens, rank)
    u, normed = _rows(g, device, dtype, tokens, count * hidden), _rows(g, device, dtype, tokens, count * hidden, spread=1)
    i = _rows(g, device, dtype, tokens, count)
    x, out = _rows(g, device, dtype, tokens, count * hidden), _rows(g, device, dtype, tokens, hidden)
    weights = 2 * torch.sigmoid(_rows(g, device, dtype, tokens, count))
    for ours, ref in [(scaled_silu(d, count), scaled_silu_ref(d, count)),
                      (gated_mean(u, normed, count), gated_mean_ref(u, normed, count)),
                      (stream_weights(i, count), stream_weights_ref(i, count)),
                      (inject(x, out, weights), inject_ref(x, out, weights))]:
        assert ours.dtype == ref.dtype == dtype and ours.shape == ref.shape
        torch.testing.assert_close(ours, ref, **TOLERANCE[dtype])


def test_a_decode_token_reads_its_own_streams(device):
    """One stream's gate open, the others shut: the mean is that stream's normed row over n; inject adds out
    to stream k by weight k alone."""
    count, hidden = 3, 64
    normed = torch.arange(count * hidden, dtype=torch.float32, device=device)[None] / 100
    u = torch.full((1, count * hidden), -80.0, device=device)
    u[0, hidden:2 * hidden] = 80.0                                  # stream 1's gate: sigmoid 1
    torch.testing.assert_close(gated_mean(u, normed, count), normed[:, hidden:2 * hidden] / count)
    x, out = torch.randn(1, count * hidden, device=device), torch.randn(1, hidden, device=device)
    weights = torch.tensor([[0.0, 1.0, 2.0]], device=device)
    expected = x + torch.cat([0 * out, out, 2 * out], dim=-1)
    torch.testing.assert_close(inject(x, out, weights), expected)


def test_selfcheck_passes_the_kernels_and_refuses_a_wrong_one(device, monkeypatch):
    monkeypatch.setattr(selfcheck, "_warnings", [])
    steps, verdict = select_hyper_steps(3, 64, 8, torch.float32, device)
    assert verdict.ok and steps.gated_mean is gated_mean and steps.inject is inject
    summed = HyperSteps(scaled_silu, lambda u, normed, n: gated_mean(u, normed, n) * n, stream_weights, inject)
    steps, verdict = select_hyper_steps(2, 64, 8, torch.float32, device, steps=summed)   # the sum, not the mean
    assert not verdict.ok and steps is None
    unscaled = HyperSteps(scaled_silu, gated_mean, lambda i, n: stream_weights(i, 1), inject)  # i / n forgotten
    steps, verdict = select_hyper_steps(4, 32, 4, torch.float32, device, steps=unscaled)
    assert not verdict.ok and steps is None
