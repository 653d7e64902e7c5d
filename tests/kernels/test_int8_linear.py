"""The int8 dense linear kernel (kernels/int8_linear.py) against its torch reference, and its self-check."""
import pytest
import torch

from engine.format.quant import quantize
from kernels.cpu_linear import dequantized, int8_linear_ref
from kernels.int8_linear import (MAX_KERNEL_TOKENS, GemmConfig, LinearConfig, int8_gemm_kernel, int8_linear_any,
                                 int8_linear_kernel)
from kernels import selfcheck
from kernels.selfcheck import select_int8_linear


def _weight(out_features, in_features, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    parts = quantize(torch.randn(out_features, in_features, generator=g) * in_features ** -0.5, "int8")
    return parts["w"].to(device), parts["scale"].to(device)


def _rel(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 1e-2), (torch.float32, 1e-5)], ids=["bf16", "fp32"])
@pytest.mark.parametrize("num_tokens,out_features,in_features,config", [
    (1, 96, 64, LinearConfig()),                                  # one decode token, K < BLOCK_K
    (3, 37, 1100, LinearConfig(block_n=16, block_k=256)),         # ragged rows and reduction tail
    (MAX_KERNEL_TOKENS, 40, 512, LinearConfig(block_n=4, block_k=128, num_warps=2)),
])
def test_kernel_matches_the_dequantized_weights(device, dtype, tol, num_tokens, out_features, in_features, config):
    q, scale = _weight(out_features, in_features, device)
    x = torch.randn(num_tokens, in_features, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    out = int8_linear_kernel(x, q, scale, config)
    assert out.shape == (num_tokens, out_features) and out.dtype == dtype
    exact = x.double() @ dequantized(q, scale, dtype).double().T      # the reference's own weights
    assert _rel(out, exact) < tol
    assert _rel(int8_linear_ref(x, q, scale), exact) < tol


@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="Triton's interpreter rounds bf16 on its own terms")), torch.float32,
    torch.float16])
def test_each_weight_element_is_the_references_bit_for_bit(device, dtype):
    """One-hot tokens read single weight elements: every code from -128 to 127 at scales of many exponents
    (ties between two representable values included) gives the reference's element exactly."""
    codes = torch.arange(-128, 128, dtype=torch.int8).repeat(8, 1)                        # [8, 256]
    # 1 + 2^-7 and its like times an odd code: ties between two bf16 values, which must go to the even one
    scale = torch.tensor([2.0 ** -e * (1 + i / 7) for i, e in enumerate(range(0, 12, 3))]
                         + [2.0 ** -e * (1 + k / 128) for e, k in ((0, 1), (5, 3), (9, 65), (14, 127))]).to(torch.bfloat16)
    q, scale = codes.roll(3, dims=0).to(device), scale.to(device)
    one_hot = torch.eye(256, dtype=dtype, device=device)
    out = torch.cat([int8_linear_kernel(one_hot[i:i + MAX_KERNEL_TOKENS], q, scale, LinearConfig(block_n=4, block_k=128))
                     for i in range(0, 256, MAX_KERNEL_TOKENS)])                           # [256 columns, 8 rows]
    assert torch.equal(out.T.cpu(), dequantized(q, scale, dtype).cpu())


def test_prompts_and_a_batch_dimension_take_the_reference(device):
    q, scale = _weight(24, 64, device)
    x = torch.randn(2, MAX_KERNEL_TOKENS, 64).to(device)               # 16 tokens: the reference's GEMM
    out = int8_linear_kernel(x, q, scale)
    assert out.shape == (2, MAX_KERNEL_TOKENS, 24)
    assert torch.equal(out, int8_linear_ref(x, q, scale))


def test_reference_slabs_give_the_whole_weights_product(monkeypatch):
    q, scale = _weight(300, 64, "cpu")
    x = torch.randn(5, 64)
    whole = int8_linear_ref(x, q, scale)
    monkeypatch.setattr("kernels.cpu_linear.SLAB_BYTES", 64 * 4 * 16)   # 16 rows a slab: 19 slabs, the last of 12
    monkeypatch.setattr("kernels.cpu_linear.CPU_SLAB_BYTES", 64 * 4 * 16)
    assert torch.allclose(int8_linear_ref(x, q, scale), whole, rtol=1e-6, atol=1e-6)


def test_cpu_reference_is_the_dequantised_weights_product_bit_for_bit_without_a_whole_copy(monkeypatch):
    q, scale = _weight(300, 64, "cpu")
    x = torch.randn(5, 64)
    exact = torch.nn.functional.linear(x, dequantized(q, scale, torch.float32))   # what the token-exact tests hold
    monkeypatch.setattr("kernels.cpu_linear.CPU_SLAB_BYTES", 64 * 4 * 16)         # 16 rows a slab, one buffer
    monkeypatch.setattr("kernels.cpu_linear.dequantized", lambda *a: pytest.fail("a whole dequantised copy"))
    assert torch.equal(int8_linear_ref(x, q, scale), exact)


def test_selfcheck_passes_the_kernel_and_refuses_a_wrong_one(device, monkeypatch):
    monkeypatch.setattr(selfcheck, "_warnings", [])          # this test's warning stays out of the others'
    fn, verdict = select_int8_linear(48, 256, device, dtype=torch.float32)
    assert verdict.ok and fn is int8_linear_kernel

    def off_by_one_row(x, q, scale):
        return int8_linear_kernel(x, q.roll(1, dims=0), scale)
    fn, verdict = select_int8_linear(48, 320, device, dtype=torch.float32, kernel=off_by_one_row)   # uncached shape
    assert not verdict.ok and fn is None and "exceeds" in verdict.reason


@pytest.mark.parametrize("dtype,tol", [
    pytest.param(torch.bfloat16, 1e-2, marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="Triton's interpreter multiplies bf16 tiles wrong (its numpy has no bf16)")),
    (torch.float32, 1e-5)], ids=["bf16", "fp32"])
@pytest.mark.parametrize("num_tokens,out_features,in_features,config", [
    (70, 37, 100, GemmConfig()),                                   # ragged tokens, rows and reduction
    (130, 96, 256, GemmConfig(block_t=32, block_n=32, block_k=32, num_warps=2, num_stages=2)),
])
def test_prompt_gemm_matches_the_dequantized_weights(device, dtype, tol, num_tokens, out_features, in_features, config):
    q, scale = _weight(out_features, in_features, device)
    x = torch.randn(num_tokens, in_features, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    out = int8_gemm_kernel(x, q, scale, config)
    assert out.shape == (num_tokens, out_features) and out.dtype == dtype
    exact = x.double() @ dequantized(q, scale, dtype).double().T
    assert _rel(out, exact) < tol


def test_with_prompts_the_selfcheck_checks_the_gemm(device, monkeypatch):
    monkeypatch.setattr(selfcheck, "_warnings", [])
    fn, verdict = select_int8_linear(48, 256, device, dtype=torch.float32, prompts=True)
    assert verdict.ok and fn is int8_linear_any
    x = torch.randn(2, 40, 256).to(device)                                # a prompt: the GEMM, batch dims kept
    assert _rel(fn(x, *_weight(48, 256, device)), int8_linear_ref(x, *_weight(48, 256, device))) < 1e-5

    def gemm_off_by_one_row(x, q, scale):                                 # decode right, prompts wrong
        if x.numel() > MAX_KERNEL_TOKENS * x.shape[-1]:
            return int8_gemm_kernel(x, q.roll(1, dims=0), scale)
        return int8_linear_kernel(x, q, scale)
    fn, verdict = select_int8_linear(48, 320, device, dtype=torch.float32, kernel=gemm_off_by_one_row, prompts=True)
    assert not verdict.ok and fn is None
