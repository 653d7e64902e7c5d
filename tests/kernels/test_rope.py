"""The rotary kernel (kernels/rope.py) against the models' torch path and its self-check (the kernel on the
models' path: tests/engine/test_attach.py)."""
import pytest
import torch

from engine.model.layers import rope_cos_sin
from kernels import selfcheck
from kernels.rope import rope_pair, rope_pair_ref
from kernels.selfcheck import select_rope


def _inputs(tokens, num_q, num_kv, head_dim, rotary, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, num_q, head_dim, generator=g).to(device, dtype)
    k = torch.randn(tokens, num_kv, head_dim, generator=g).to(device, dtype)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary, 2, dtype=torch.float32) / rotary))
    cos, sin = rope_cos_sin(torch.arange(5, 5 + tokens).to(device), inv_freq.to(device), 1.0, dtype)
    return q, k, cos, sin


# a decode token at OLMoE's heads, a prompt with grouped KV heads, partial rotary (GLM-4.5), a head dim not a power of 2
@pytest.mark.parametrize("shape", [(1, 16, 16, 128, 128), (37, 8, 2, 64, 64), (3, 4, 2, 128, 64), (2, 4, 4, 80, 80)])
def test_rotates_as_the_torch_path(device, shape):
    q, k, cos, sin = _inputs(*shape, torch.float32, device)
    out_q, out_k = rope_pair(q, k, cos, sin)
    ref_q, ref_k = rope_pair_ref(q, k, cos, sin)
    assert torch.equal(out_q, ref_q) and torch.equal(out_k, ref_k)      # the same roundings, no FMA
    assert torch.equal(q, _inputs(*shape, torch.float32, device)[0])    # its inputs are left as they were


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton's interpreter rounds bf16 on its own terms")
@pytest.mark.parametrize("shape", [(1, 16, 16, 128, 128), (37, 32, 4, 128, 128), (5, 4, 2, 128, 64)])
def test_bf16_rounds_as_the_torch_path(device, shape):
    q, k, cos, sin = _inputs(*shape, torch.bfloat16, device)
    out_q, out_k = rope_pair(q, k, cos, sin)
    ref_q, ref_k = rope_pair_ref(q, k, cos, sin)
    assert out_q.dtype == torch.bfloat16 and torch.equal(out_q, ref_q) and torch.equal(out_k, ref_k)


def test_selfcheck_passes_the_kernel_and_refuses_a_wrong_one(device, monkeypatch):
    monkeypatch.setattr(selfcheck, "_warnings", [])
    fn, verdict = select_rope(4, 2, 64, 64, torch.float32, device)
    assert verdict.ok and fn is rope_pair
    fn, verdict = select_rope(4, 2, 64, 32, torch.float32, device,          # sin's sign lost
                              kernel=lambda q, k, cos, sin: rope_pair(q, k, cos, -sin))
    assert not verdict.ok and fn is None
