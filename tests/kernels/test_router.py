"""The softmax top-k router kernel (kernels/router.py) against its torch reference, and its self-check."""
import pytest
import torch

from kernels import selfcheck
from kernels.router import router_kernel, router_ref
from kernels.selfcheck import select_router


def _case(num_experts, hidden, tokens, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    weight = (torch.randn(num_experts, hidden, generator=g) * hidden ** -0.5).to(device, dtype)
    return torch.randn(tokens, hidden, generator=g).to(device, dtype), weight


@pytest.mark.parametrize("num_experts,hidden,top_k,renormalize", [
    (64, 96, 8, False),            # OLMoE's experts and k
    (60, 80, 4, True),             # Qwen2-MoE's 60: not a power of two; hidden not a tile multiple
    (128, 64, 8, True),            # Qwen3-MoE's
    (8, 40, 2, True),              # Mixtral's
])
def test_routes_as_the_reference(device, num_experts, hidden, top_k, renormalize):
    h, weight = _case(num_experts, hidden, 37, device, torch.float32)
    weights, ids = router_kernel(h, weight, top_k, renormalize)
    ref_weights, ref_ids = router_ref(h, weight, top_k, renormalize)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids, ref_ids)                                  # the same experts, best first
    assert torch.allclose(weights, ref_weights, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("tokens,hidden", [(1, 600), (3, 600), (1, 512), (4, 257)])
def test_a_decode_steps_split_sums_route_as_the_reference(device, tokens, hidden):
    """Up to SPLIT_MAX_TOKENS tokens the hidden axis is summed in SPLIT_COLS pieces by several programs (the
    last one short where the hidden size is not a multiple) and added by a second launch."""
    from kernels.router import SPLIT_COLS, SPLIT_MAX_TOKENS
    assert tokens <= SPLIT_MAX_TOKENS and hidden > SPLIT_COLS
    h, weight = _case(60, hidden, tokens, device, torch.float32, seed=tokens)
    weights, ids = router_kernel(h, weight, 4, True)
    ref_weights, ref_ids = router_ref(h, weight, 4, True)
    assert torch.equal(ids, ref_ids)
    assert torch.allclose(weights, ref_weights, rtol=1e-5, atol=1e-7)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton's interpreter rounds bf16 on its own terms")
def test_routes_bf16_as_the_reference_on_a_gpu(device):
    """bf16 logits often tie or differ in their last bit between two ways of summing (8 bits of mantissa),
    and torch.topk orders a tie its own way (run 55: 87% of rows had the reference's ids in its order);
    so the test asks what the choice is worth: the reference's probabilities of the experts the kernel
    chose are the reference's top k, row by row, up to a near-tie."""
    h, weight = _case(64, 2048, 512, device, torch.bfloat16)
    weights, ids = router_kernel(h, weight, 8, False)
    ref_weights, ref_ids = router_ref(h, weight, 8, False)
    given = torch.softmax(torch.nn.functional.linear(h, weight), dim=-1, dtype=torch.float32).gather(1, ids)
    same_set = (ids.sort(dim=1).values == ref_ids.sort(dim=1).values).all(dim=1).float().mean().item()
    worth = ((given - ref_weights).abs() / ref_weights).max().item()
    assert worth < 2e-2, f"relative worth {worth:.2e}; rows with the reference's experts {same_set:.3f}"
    assert torch.allclose(weights, ref_weights, rtol=2e-2, atol=1e-3)


def test_selfcheck_passes_the_kernel_and_refuses_a_wrong_one(device, monkeypatch):
    monkeypatch.setattr(selfcheck, "_warnings", [])
    fn, verdict = select_router(64, 96, 8, False, device, dtype=torch.float32)
    assert verdict.ok and fn is router_kernel

    def second_best(h, weight, top_k, renormalize):              # one rank off: the 2nd..(k+1)th experts
        weights, ids = router_ref(h, weight, top_k + 1, renormalize)
        return weights[:, 1:], ids[:, 1:]
    fn, verdict = select_router(64, 96, 8, True, device, dtype=torch.float32, kernel=second_best)
    assert not verdict.ok and fn is None and "exceeds" in verdict.reason
