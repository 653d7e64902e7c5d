"""The RMS norm kernel (kernels/rms_norm.py) against the models' torch path and its self-check (the kernel on
the models' path: tests/engine/test_attach.py)."""
import pytest
import torch

from kernels import selfcheck
from kernels.rms_norm import grouped_norm_kernel, grouped_norm_ref, rms_norm_kernel, rms_norm_ref
from kernels.selfcheck import select_grouped_norm, select_rms_norm


@pytest.mark.parametrize("shape", [(1, 2048), (37, 96), (5, 4, 128), (3, 100)])   # hidden, heads x head_dim, odd
def test_normalises_as_the_torch_path(device, shape):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(*shape, generator=g) * 3).to(device)
    weight = (1 + 0.2 * torch.randn(shape[-1], generator=g)).to(device)
    out = rms_norm_kernel(x, weight, 1e-6)
    assert out.shape == x.shape and out.dtype == torch.float32
    assert torch.allclose(out, rms_norm_ref(x, weight, 1e-6), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton's interpreter rounds bf16 on its own terms")
def test_bf16_rows_round_as_the_torch_path(device):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(64, 2048, generator=g) * 3).to(device, torch.bfloat16)
    weight = (1 + 0.2 * torch.randn(2048, generator=g)).to(device, torch.bfloat16)
    out, ref = rms_norm_kernel(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6)
    assert out.dtype == torch.bfloat16
    assert (out != ref).float().mean() < 0.01                   # a last-bit difference where the sums' order differs
    assert torch.allclose(out.float(), ref.float(), rtol=1e-2)


def test_selfcheck_passes_the_kernel_and_refuses_a_wrong_one(device, monkeypatch):
    monkeypatch.setattr(selfcheck, "_warnings", [])
    fn, verdict = select_rms_norm(96, torch.float32, torch.float32, device)
    assert verdict.ok and fn is rms_norm_kernel
    fn, verdict = select_rms_norm(80, torch.float32, torch.float32, device,       # the weight forgotten
                                  kernel=lambda x, w, eps: rms_norm_kernel(x, torch.ones_like(w), eps))
    assert not verdict.ok and fn is None


@pytest.mark.parametrize("tokens, count, group", [(1, 4, 2560), (37, 3, 64), (2, 4, 100)])   # Flash-Next's, the tests'
def test_grouped_norm_normalises_each_stream_with_its_own_scale(device, tokens, count, group):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(tokens, count * group, generator=g) * 3).to(device)
    scale = (1 + 0.2 * torch.randn(count * group, generator=g)).to(device)
    out = grouped_norm_kernel(x, scale, group, 1e-6)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.allclose(out, grouped_norm_ref(x, scale, group, 1e-6), rtol=1e-5, atol=1e-6)
    streams = x.view(tokens, count, group)                        # each stream normed alone, by its own scale
    alone = streams / streams.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * scale.view(count, group)
    assert torch.allclose(out.view(tokens, count, group), alone, rtol=1e-4, atol=1e-5)


def test_grouped_norm_selfcheck_refuses_one_scale_row_for_every_stream(device, monkeypatch):
    monkeypatch.setattr(selfcheck, "_warnings", [])
    fn, verdict = select_grouped_norm(64, 3, torch.float32, device)
    assert verdict.ok and fn is grouped_norm_kernel
    fn, verdict = select_grouped_norm(64, 2, torch.float32, device,        # the first stream's scale everywhere
                                      kernel=lambda x, s, g, eps: grouped_norm_kernel(x, s[:g].repeat(2), g, eps))
    assert not verdict.ok and fn is None
