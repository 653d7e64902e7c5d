"""The grouped router kernel (kernels/router.py: grouped_router_kernel) against its torch reference
(softmax_topk.GroupedRouting.route, the engine's GroupedRouter path) for each family's routing, and its self-check."""
import dataclasses

import pytest
import torch

from kernels import selfcheck
from kernels.router import SPLIT_COLS, SPLIT_MAX_TOKENS, SPLIT_TILE, grouped_router_kernel
from kernels.selfcheck import select_grouped_router
from kernels.softmax_topk import GroupedRouting

# (routing, experts, has_bias): each family's variant at a small shape
V2_GREEDY = GroupedRouting(6, "softmax", renormalize=False, scaling=16.0)
V2_GROUPED = GroupedRouting(6, "softmax", 8, 3, "max", renormalize=False, scaling=2.5)
V3 = GroupedRouting(8, "sigmoid", 8, 4, "top2_sum", scaling=2.5)
MINIMAX = GroupedRouting(8, "sigmoid", renorm_eps=0.0)
ERNIE = GroupedRouting(6, "softmax", renorm_eps=0.0, renorm_min=0.9)        # a large min: the clamp acts
VARIANTS = {
    "v2_greedy": (V2_GREEDY, 64, False),
    "v2_group_limited": (V2_GROUPED, 160, False),              # DeepSeek-V2's 160: 20 a group, not a power of two
    "v3": (V3, 256, True),                                     # DeepSeek-V3's 256 in 8 groups keeping 4
    "kimi_k2": (GroupedRouting(8, "sigmoid", scaling=2.827), 384, True),    # 384 in one group: a block of 512
    "glm_air": (GroupedRouting(8, "sigmoid", scaling=1.0), 128, True),
    "glm_unnormalised": (dataclasses.replace(V3, renormalize=False), 64, True),
    "minimax": (MINIMAX, 32, True),
    "ernie": (ERNIE, 64, True),
}


def _case(num_experts, hidden, tokens, has_bias, device, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    weight = (torch.randn(num_experts, hidden, generator=g) * hidden ** -0.5).to(device, dtype)
    h = torch.randn(tokens, hidden, generator=g).to(device, dtype)
    bias = (0.3 * torch.randn(num_experts, generator=g)).to(device) if has_bias else None
    return h, weight, bias


def _assert_routes_as_the_reference(routing, h, weight, bias):
    weights, ids = grouped_router_kernel(h, weight, bias, routing)
    ref_weights, ref_ids = routing.route(h, weight, bias)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    order, ref_order = ids.argsort(dim=1), ref_ids.argsort(dim=1)            # the reference's ids are unsorted
    assert torch.equal(ids.gather(1, order), ref_ids.gather(1, ref_order))   # the same experts
    torch.testing.assert_close(weights.gather(1, order), ref_weights.gather(1, ref_order), rtol=1e-5, atol=1e-7)
    choice = routing.choice(routing.scores(h, weight), bias).gather(1, ids)
    assert (choice[:, :-1] >= choice[:, 1:]).all()                           # best first by the choice


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_prompt_routes_as_the_reference(device, variant):
    """More than SPLIT_MAX_TOKENS tokens: one program a token."""
    routing, num_experts, has_bias = VARIANTS[variant]
    _assert_routes_as_the_reference(routing, *_case(num_experts, 80, 37, has_bias, device))


@pytest.mark.parametrize("variant,tokens,hidden", [
    ("v3", 1, 600),                # one decode token: 3 splits, the last one short
    ("v2_group_limited", 3, 600),
    ("kimi_k2", 1, (SPLIT_TILE + 1) * SPLIT_COLS + 5),    # more splits than one tile of the pick's loads
    ("ernie", 4, 512),
])
def test_a_decode_steps_split_sums_route_as_the_reference(device, variant, tokens, hidden):
    assert tokens <= SPLIT_MAX_TOKENS and hidden > SPLIT_COLS
    routing, num_experts, has_bias = VARIANTS[variant]
    _assert_routes_as_the_reference(routing, *_case(num_experts, hidden, tokens, has_bias, device, seed=tokens))


def test_bf16_inputs_are_summed_in_float32(device):
    """h and the weight in bf16 (no float copy of the weight): the products are exact in float32 either way."""
    h, weight, bias = _case(256, 600, 2, True, device, dtype=torch.bfloat16, seed=4)
    _assert_routes_as_the_reference(V3, h, weight, bias)


def test_groups_limit_the_choice(device):
    """V3: the chosen experts lie in at most keep_groups groups, and these differ from the ungrouped choice."""
    h, weight, bias = _case(256, 80, 37, True, device)
    _, ids = grouped_router_kernel(h, weight, bias, V3)
    groups = ids // (256 // V3.num_groups)
    assert all(len(set(row.tolist())) <= V3.keep_groups for row in groups)
    _, ungrouped = grouped_router_kernel(h, weight, bias, dataclasses.replace(V3, num_groups=1, keep_groups=1))
    assert not torch.equal(ids, ungrouped)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the real shapes compile on a GPU")
@pytest.mark.parametrize("routing,num_experts,hidden", [
    (V3, 256, 7168),                                                        # DeepSeek-V3
    (GroupedRouting(8, "sigmoid", scaling=2.827), 384, 7168),                # Kimi-K2: a block of 512 experts
    (GroupedRouting(8, "sigmoid", scaling=1.0), 128, 4096),                  # GLM-4.5-Air
    (V2_GROUPED, 160, 5120),                                                # DeepSeek-V2
])
def test_the_real_shapes_pass_the_selfcheck_in_bf16_on_a_gpu(device, routing, num_experts, hidden):
    fn, verdict = select_grouped_router(num_experts, hidden, routing, routing.scoring == "sigmoid", device)
    assert verdict.ok and fn is grouped_router_kernel, verdict.reason


def test_selfcheck_passes_the_kernel_and_refuses_wrong_variants(device, monkeypatch):
    """(Verdicts are cached by shape and routing: each wrong kernel is checked at a hidden size of its own.)"""
    monkeypatch.setattr(selfcheck, "_warnings", [])
    fn, verdict = select_grouped_router(256, 96, V3, True, device, dtype=torch.float32)
    assert verdict.ok and fn is grouped_router_kernel

    def top2_as_max(h, weight, bias, routing):
        return grouped_router_kernel(h, weight, bias, dataclasses.replace(routing, group_score="max"))

    def without_bias(h, weight, bias, routing):
        return grouped_router_kernel(h, weight, None, routing)

    def unsorted(h, weight, bias, routing):
        return routing.route(h, weight, bias)

    def no_renorm(h, weight, bias, routing):
        return grouped_router_kernel(h, weight, bias, dataclasses.replace(routing, renormalize=False))
    for hidden, wrong in enumerate((top2_as_max, without_bias, unsorted, no_renorm), start=97):
        fn, verdict = select_grouped_router(256, hidden, V3, True, device, dtype=torch.float32, kernel=wrong)
        assert not verdict.ok and fn is None and "exceeds" in verdict.reason, wrong.__name__
