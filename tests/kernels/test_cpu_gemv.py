"""The CPU's int8 dense kernel (kernels.cpu_gemv) against float64 products of the dequantised weights and against
the torch reference, at real shapes (OLMoE's attention and head, a row count no multiple of the kernel's tile) and
token counts on both of its paths: the numba rows up to MAX_TOKENS, a prompt's GEMM (kernels.cpu_gemm) past it;
weights the rows do not take go to the reference; its load-time check attaches it to a CPU model's int8 dense
weights and refuses a kernel that computes something else."""
import pytest
import torch

from engine.model.layers import Packed, linear
from engine.options import Options
from engine.runtime.attach import attach_kernels
from kernels import cpu_gemm, cpu_gemv
from kernels.cpu_linear import dequantized, int8_linear_ref

pytestmark = pytest.mark.skipif(not cpu_gemv.available(), reason="numba is not installed")

PROMPT = cpu_gemv.MAX_TOKENS + 1          # the fewest tokens that take the GEMM (padded to 16)


def _weight(out_features, in_features, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8, generator=g)
    return q, (torch.rand(out_features, generator=g) * 0.02 + 1e-3).to(torch.bfloat16)


@pytest.fixture(scope="module")
def tile():
    return cpu_gemm.scratch()


@pytest.mark.parametrize("shape", [(2048, 2048), (1024, 2048), (50304, 2048), (37, 100), (5, 16)])
@pytest.mark.parametrize("tokens", [1, 3, cpu_gemv.MAX_TOKENS, PROMPT, 64])
def test_both_paths_give_the_dequantised_products(shape, tokens, tile):
    q, scale = _weight(*shape)
    x = torch.randn(tokens, shape[1], generator=torch.Generator().manual_seed(1))
    exact = x.double() @ dequantized(q, scale, torch.float32).double().T
    got = cpu_gemv.int8_linear(x, q, scale, tile)
    assert got.dtype == torch.float32 and got.shape == (tokens, shape[0])
    # float32 sums of up to 2048 products (the GEMM's times the scale, one rounding more): the reference's own
    # error is of this order
    assert (got.double() - exact).abs().max() <= 2e-6 * exact.abs().max()
    ref = int8_linear_ref(x, q, scale)
    assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_leading_dims_and_what_it_leaves_to_the_reference(tile):
    q, scale = _weight(64, 32)
    x = torch.randn(2, 1, 32)
    assert torch.allclose(cpu_gemv.int8_linear(x, q, scale, tile), int8_linear_ref(x, q, scale), rtol=1e-5, atol=1e-6)
    prompt = torch.randn(2, PROMPT, 32)                          # a prompt's GEMM, its leading dims kept
    ref = int8_linear_ref(prompt, q, scale)
    got = cpu_gemv.int8_linear(prompt, q, scale, tile)
    assert got.shape == ref.shape and (got - ref).abs().max() <= 1e-5 * ref.abs().max()
    rows = q[::2]                                                # not contiguous: the reference
    assert torch.equal(cpu_gemv.int8_linear(x[0], rows, scale[::2], tile), int8_linear_ref(x[0], rows, scale[::2]))


def _packed(out_features, in_features):
    q, scale = _weight(out_features, in_features)
    return Packed({"w": q, "scale": scale}, "int8", torch.float32)


def test_attached_to_a_cpu_models_int8_dense_weights_after_its_check(monkeypatch):
    head, proj = _packed(300, 64), _packed(64, 64)
    warnings = []
    attach_kernels(None, {"lm_head": head, "o_proj": proj}, torch.device("cpu"), torch.float32, Options(),
                   warnings.append)
    # one kernel, and so one prompt tile, for the model's weights
    assert head.kernel.func is cpu_gemv.int8_linear and proj.kernel is head.kernel and not warnings
    for tokens in (1, PROMPT):
        x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(3))
        ref = int8_linear_ref(x, head.parts["w"], head.parts["scale"])
        assert (linear(x, head) - ref).abs().max() <= 1e-5 * ref.abs().max()     # its sums in another order
    plain = _packed(300, 64)                                      # the CPU's numba kernels off
    attach_kernels(None, {"lm_head": plain}, torch.device("cpu"), torch.float32, Options(cpu_kernel="torch"),
                   warnings.append)
    assert plain.kernel is None
    # a kernel that computes something else fails its check: warned about, not attached
    monkeypatch.setattr(cpu_gemv, "int8_linear", lambda x, q, s, tile: int8_linear_ref(x, q, s) * 1.01)
    broken = _packed(300, 64)
    attach_kernels(None, {"lm_head": broken}, torch.device("cpu"), torch.float32, Options(), warnings.append)
    assert broken.kernel is None
    assert warnings == ["int8 dense kernel disabled for (300, 64) on this CPU: its 1-token result differs from the "
                        "reference by 1.0e-02 of its largest value."]
