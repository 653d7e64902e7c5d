"""The router kernel (kernels/router.py) against its torch references (softmax top-k; gpt-oss's top-k softmax of
biased logits), and its self-check."""
import pytest
import torch

from kernels import selfcheck
from kernels.router import router_kernel, router_ref, topk_softmax_ref
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


@pytest.mark.parametrize("num_experts,hidden,tokens", [
    (128, 96, 1),                  # gpt-oss-120b's 128 experts, one token (the split sums)
    (32, 600, 3),                  # gpt-oss-20b's 32, a decode step's few tokens over split sums
    (128, 80, 37),                 # a prompt: one program a token
])
def test_routes_top_k_first_as_gpt_oss(device, num_experts, hidden, tokens):
    """gpt-oss: the top 4 of the biased logits, then a softmax over those 4 only; best first (the decode
    step's next-layer guesses rely on it: no sort follows)."""
    h, weight = _case(num_experts, hidden, tokens, device, torch.float32, seed=tokens)
    bias = torch.randn(num_experts, generator=torch.Generator().manual_seed(9)).to(device) * 3
    weights, ids = router_kernel(h, weight, 4, False, bias=bias, topk_first=True)
    ref_weights, ref_ids = topk_softmax_ref(h, weight, bias, 4)
    assert torch.equal(ids, ref_ids)
    assert torch.allclose(weights, ref_weights, rtol=1e-5, atol=1e-7)
    assert (weights[:, :-1] >= weights[:, 1:]).all()
    without_bias, _ = router_kernel(h, weight, 4, False, bias=None, topk_first=True)
    assert not torch.equal(without_bias, weights)                      # the bias takes part in the choice


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton's interpreter rounds bf16 on its own terms")
def test_routes_top_k_first_bf16_as_gpt_oss_on_a_gpu(device):
    """gpt-oss's shapes in bf16: the kernel's choice is worth the reference's, up to a near-tie of the logits."""
    h, weight = _case(128, 2880, 512, device, torch.bfloat16)
    bias = torch.randn(128, generator=torch.Generator().manual_seed(9)).to(device, torch.bfloat16)
    weights, ids = router_kernel(h, weight, 4, False, bias=bias, topk_first=True)
    ref_weights, _ = topk_softmax_ref(h, weight, bias, 4)
    logits = torch.nn.functional.linear(h, weight, bias).float()
    given = torch.softmax(logits.gather(1, ids), dim=-1)
    expected = torch.softmax(logits.topk(4, dim=-1).values, dim=-1)
    assert ((given - expected).abs() / expected).max().item() < 2e-2
    assert torch.allclose(weights, ref_weights.float(), rtol=2e-2, atol=1e-3)


def test_selfcheck_passes_the_kernel_and_refuses_a_wrong_one(device, monkeypatch):
    monkeypatch.setattr(selfcheck, "_warnings", [])
    fn, verdict = select_router(64, 96, 8, False, device, dtype=torch.float32)
    assert verdict.ok and fn is router_kernel

    def second_best(h, weight, top_k, renormalize):              # one rank off: the 2nd..(k+1)th experts
        weights, ids = router_ref(h, weight, top_k + 1, renormalize)
        return weights[:, 1:], ids[:, 1:]
    fn, verdict = select_router(64, 96, 8, True, device, dtype=torch.float32, kernel=second_best)
    assert not verdict.ok and fn is None and "exceeds" in verdict.reason


def test_selfcheck_of_top_k_first_refuses_a_kernel_without_the_bias(device, monkeypatch):
    """(Verdicts are cached by shape: the wrong kernel is checked at a shape of its own.)"""
    monkeypatch.setattr(selfcheck, "_warnings", [])
    fn, verdict = select_router(128, 96, 4, False, device, dtype=torch.float32, topk_first=True)
    assert verdict.ok and fn is router_kernel

    def no_bias(h, weight, top_k, renormalize, bias=None, topk_first=False):
        return router_kernel(h, weight, top_k, renormalize, bias=None, topk_first=topk_first)
    fn, verdict = select_router(128, 80, 4, False, device, dtype=torch.float32, kernel=no_bias, topk_first=True)
    assert not verdict.ok and fn is None
