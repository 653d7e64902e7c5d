"""kernels.cpu_gemm (int8 codes through MKL's GEMM, the row scale after the sum) against its reference,
kernels.cpu_linear.int8_linear_ref, on OLMoE's expert shapes and on ragged ones."""
import pytest
import torch

from engine.format.quant import quantize
from engine.model.layers import Packed
from engine.model.model import swiglu_expert
from kernels import cpu_gemm
from kernels.cpu_linear import int8_linear_ref, packed_linear

RTOL = 1e-5     # float32 rounding, relative to the output's largest value


def _weight(out_features, in_features, seed=0):
    g = torch.Generator().manual_seed(seed)
    parts = quantize(torch.randn(out_features, in_features, generator=g) * in_features ** -0.5, "int8")
    return parts["w"], parts["scale"]


def _x(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _error(out, ref):
    return ((out - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("num_tokens", [1, 13, 16, 33, 256], ids=lambda t: f"{t}tok")   # padded to 8s, or not
@pytest.mark.parametrize("out_features,in_features", [(1024, 2048), (2048, 1024)], ids=["gate", "down"])
def test_olmoe_projections_match_the_reference(num_tokens, out_features, in_features):
    q, scale = _weight(out_features, in_features)
    x = _x(num_tokens, in_features)
    out = cpu_gemm.int8_gemm(x, q, scale, cpu_gemm.scratch())
    assert out.shape == (num_tokens, out_features) and out.is_contiguous()
    assert _error(out, int8_linear_ref(x, q, scale)) < RTOL


def test_ragged_tiles_and_leading_dimensions():
    q, scale = _weight(37, 160)                          # odd rows: tiles of 5 rows, the last of 2
    x = _x(2, 3, 160)                                    # 6 tokens, padded to 8
    tile = torch.empty(5 * 160 + 7)
    out = cpu_gemm.int8_gemm(x, q, scale, tile)
    assert out.shape == (2, 3, 37)
    assert _error(out, int8_linear_ref(x, q, scale)) < RTOL


def test_a_tile_smaller_than_a_row_is_refused():
    q, scale = _weight(4, 64)
    with pytest.raises(ValueError, match="cannot hold a row"):
        cpu_gemm.int8_gemm(_x(2, 64), q, scale, torch.empty(63))


def test_bfloat16_tokens_take_packed_linear():
    q, scale = _weight(40, 64)
    x = _x(3, 64).bfloat16()
    out = cpu_gemm.int8_linear(x, q, scale, cpu_gemm.scratch())
    assert torch.equal(out, packed_linear(x, {"w": q, "scale": scale}, "int8"))


def test_an_olmoe_expert_over_a_prompts_group_matches_the_reference():
    """The CPU's expert for a prompt's token group as CpuExperts runs it: each Packed projection with
    int8_linear attached, against the same expert over the reference's projections."""
    tile = cpu_gemm.scratch()
    parts = {"gate": _weight(1024, 2048, 1), "up": _weight(1024, 2048, 2), "down": _weight(2048, 1024, 3)}
    plain = {p: Packed({"w": q, "scale": s}, "int8") for p, (q, s) in parts.items()}
    attached = {p: Packed({"w": q, "scale": s}, "int8") for p, (q, s) in parts.items()}
    for packed in attached.values():
        packed.kernel = lambda x, q, s: cpu_gemm.int8_linear(x, q, s, tile)
    x = _x(45, 2048)                                    # more tokens than the fused kernel takes
    assert _error(swiglu_expert(x, attached), swiglu_expert(x, plain)) < RTOL
