"""moe_prefill (Triton grouped GEMM over the slot bank) against moe_prefill_ref (torch), and the pair
routing it reads. On the CPU these run in Triton's interpreter, so shapes are small; the interpreter
rounds float32 -> bf16 by truncation (the GPU rounds to nearest), hence its looser bf16 tolerance."""
import pytest
import torch

from kernels import selfcheck
from kernels.formats import make_offsets
from kernels.moe_decode import moe_decode_ref
from kernels.moe_prefill import PrefillConfig, max_blocks, moe_prefill, moe_prefill_bank, moe_prefill_ref
from kernels.pair_routing import route_pairs
from tests.kernels.cases import moe_case as _case

SMALL = PrefillConfig(block_m=16, block_n=16, block_k=16)    # the smallest tl.dot tiles: many blocks, masked tails
FMTS = ["int8", "fp8", "bf16", "nvfp4", "mxfp4"]
BF16_TOL = 1e-2 if torch.cuda.is_available() else 3e-2


def _skewed(slots, hot=1):
    """Every token's first choice is slot `hot` (more rows than a block); the others keep theirs."""
    slots = slots.clone()
    for t in range(slots.shape[0]):
        row = slots[t].tolist()
        if hot in row:
            row.remove(hot)
        slots[t] = torch.tensor([hot] + row[:slots.shape[1] - 1], dtype=torch.int32)
    return slots


def _rel(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


# fmt -> (T, K, slots, I, H), config: T * K pairs over the slots, uneven counts; I and H not multiples of the
# tiles (the fp4 formats: a tail of one scale group, 16 values nvfp4, 32 mxfp4, in every tiled dimension)
SHAPE = (20, 3, 6, 40, 56)
CASES = {fmt: (SHAPE, SMALL) for fmt in ("int8", "fp8", "bf16")} | {
    "nvfp4": ((20, 3, 6, 48, 80), PrefillConfig(block_m=16, block_n=32, block_k=32)),
    "mxfp4": ((20, 3, 6, 96, 160), PrefillConfig(block_m=16, block_n=64, block_k=64)),
}


@pytest.mark.parametrize("fmt", FMTS)
def test_matches_reference(fmt, device):
    """Uneven experts, one with more rows than a block (the hot slot: 20 > 16), padded tails."""
    shape, config = CASES[fmt]
    x, bank, slots, weights, *rest = _case(fmt, device, *shape, seed=1)
    slots = _skewed(slots)
    out = moe_prefill_bank(x, bank, slots, weights, *rest, config=config)
    ref = moe_prefill_ref(x, bank, slots, weights, *rest)
    assert out.shape == ref.shape and out.dtype == torch.float32 and torch.isfinite(out).all()
    assert _rel(out, ref) < 1e-5


@pytest.mark.parametrize("fmt", ["int8", "nvfp4"])
def test_bf16_activations(fmt, device):
    """bf16 x (the engine's compute dtype): bf16 weight tiles and h, fp32 accumulation and out."""
    x, bank, slots, weights, *rest = _case(fmt, device, 12, 2, 5, 48, 64, seed=2, x_dtype=torch.bfloat16)
    out = moe_prefill_bank(x, bank, slots, weights, *rest, config=PrefillConfig(block_m=16, block_n=16, block_k=32))
    assert out.dtype == torch.float32
    assert _rel(out, moe_prefill_ref(x, bank, slots, weights, *rest)) < BF16_TOL


def test_reference_is_the_decode_specification_in_float32(device):
    """In float32 the prefill reference is moe_decode_ref's sum_k w_k * down(silu(gate x) * up x)."""
    args = _case("int8", device, 6, 2, 4, 24, 40, seed=3)
    torch.testing.assert_close(moe_prefill_ref(*args), moe_decode_ref(*args), rtol=1e-6, atol=1e-6)


def _expert_case(device, fmt="int8"):
    """Experts 10..15 in bank slots 4, 0, 5, 2, 1, 3 (an expert id is not its slot): expert 11 is every
    token's first choice (20 rows: more than a block), expert 15 gets no pair. Returns the case, the
    routed ids and the group order (two resident experts, then two batches)."""
    x, bank, _, weights, *rest = _case(fmt, device, 20, 3, 6, *CASES[fmt][0][3:], seed=4)
    g = torch.Generator().manual_seed(4)
    others = torch.stack([torch.tensor([1, 2, 4, 5])[torch.randperm(4, generator=g)[:2]] for _ in range(20)])
    slots = torch.cat([torch.zeros(20, 1, dtype=torch.int64), others], dim=1).int().to(device)
    slot_of = {10: 4, 11: 0, 12: 5, 13: 2, 14: 1, 15: 3}
    expert_of = {s: e for e, s in slot_of.items()}
    routed = [expert_of[s] for s in slots.flatten().tolist()]
    order = [13, 11, 15, 10, 14, 12]                  # resident 13, 11; batch 15 (empty), 10; batch 14, 12
    return (x, bank, slots, weights, *rest), routed, order, slot_of


def test_routing_groups_pairs_by_expert_in_the_given_order(device):
    (x, bank, slots, *_), routed, order, slot_of = _expert_case(device)
    routing = route_pairs(routed, torch.tensor(routed, device=device), order, top_k=3, block_m=16)
    rows = routing.rows.tolist()
    start = 0
    for g, expert in enumerate(order):
        pairs = [p for p, e in enumerate(routed) if e == expert]
        end = routing.block_ends[g] * 16
        assert rows[start:end] == pairs + [-1] * (end - start - len(pairs)), expert   # routing order, then padding
        start = end
    assert start == len(rows) and routing.block_ends[2] == routing.block_ends[1]      # expert 15: no blocks
    assert routing.blocks(*routing.run([15, 10])) == (routing.block_ends[1], routing.block_ends[3])
    with pytest.raises(ValueError, match="contiguous"):
        routing.run([13, 15])                          # groups 0 and 2
    with pytest.raises(ValueError, match="not in"):
        routing.run([99])
    with pytest.raises(ValueError, match="exactly once"):
        route_pairs(routed, torch.tensor(routed, device=device), order[1:], top_k=3, block_m=16)


@pytest.mark.parametrize("fmt", ["int8", "mxfp4"])
def test_batches_add_up_to_the_whole_layer(fmt, device):
    """The engine's calls: the resident experts, then each batch (one of them an expert with no pair),
    each `slot_of` in its own order, all adding into one `out`."""
    args, routed, order, slot_of = _expert_case(device, fmt)
    x, bank, slots, weights, *rest = args
    config = CASES[fmt][1]
    routing = route_pairs(routed, torch.tensor(routed, device=device), order, top_k=3, block_m=16)
    out = torch.zeros(x.shape, device=device)
    resident = {11: 0, 13: 2}
    moe_prefill(x, bank, routing, resident, weights, *rest, out=out, config=config)
    only_resident = weights * torch.isin(slots, torch.tensor([0, 2], dtype=torch.int32, device=device))
    assert _rel(out, moe_prefill_ref(x, bank, slots, only_resident, *rest)) < 1e-5
    for batch in ({10: 4, 15: 3}, {12: 5, 14: 1}):
        moe_prefill(x, bank, routing, batch, weights, *rest, out=out, config=config)
    assert _rel(out, moe_prefill_ref(*args)) < 1e-5


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_a_small_workspace_cuts_the_launches_into_chunks(fmt, device):
    x, bank, slots, weights, *rest = _case(fmt, device, 16, 2, 4, 32, 48, seed=5)
    routed = slots.flatten().tolist()
    routing = route_pairs(routed, slots.flatten(), sorted(set(routed)), top_k=2, block_m=16)
    workspace = 2 * 16 * 32 * 4 + 32 * 48 + routing.rows.numel() * 4       # two blocks of h beside the routing
    assert max_blocks(workspace, routing, 32, x.dtype) == 2 < routing.block_ends[-1]
    out = torch.zeros(x.shape, device=device)
    moe_prefill(x, bank, routing, {s: s for s in set(routed)}, weights, *rest, out=out, config=SMALL,
                workspace_bytes=workspace)
    assert _rel(out, moe_prefill_ref(x, bank, slots, weights, *rest)) < 1e-5


@pytest.mark.parametrize("change,error,match", [
    (lambda a: {**a, "fmt": "fp4"}, ValueError, "prefill kernel takes"),
    (lambda a: {**a, "fmt": "mxfp4", "config": PrefillConfig(block_m=16, block_k=16)}, ValueError, "32-value scale groups"),
    (lambda a: {**a, "weights": a["weights"].bfloat16()}, TypeError, "weights"),
    (lambda a: {**a, "out": a["out"].bfloat16()}, TypeError, "out"),
    (lambda a: {**a, "x": a["x"].T.contiguous().T}, ValueError, "contiguous"),
    (lambda a: {**a, "config": PrefillConfig(block_m=32)}, ValueError, "block_m"),
    (lambda a: {**a, "slot_of": {0: 0, 2: 2}}, ValueError, "contiguous run"),
])
def test_launcher_refuses_bad_inputs(device, change, error, match):
    x, bank, slots, weights, fmt, offsets, intermediate = _case("int8", device, 4, 2, 3, 32, 48, seed=6)
    routed = slots.flatten().tolist()
    routing = route_pairs(routed, slots.flatten(), [0, 1, 2], top_k=2, block_m=16)
    args = dict(x=x, bank=bank, routing=routing, slot_of={0: 0, 1: 1}, weights=weights, fmt=fmt, offsets=offsets,
                intermediate=intermediate, out=torch.zeros(x.shape, device=device), config=SMALL)
    with pytest.raises(error, match=match):
        moe_prefill(**change(args))


def _check(device, kernel, fmt="int8"):
    offsets, block_bytes = make_offsets(fmt, 32, 64)
    return selfcheck.check_moe_prefill(fmt, offsets, block_bytes, 32, 64, 2, device, dtype=torch.float32,
                                       kernel=kernel)


def _fp4_tiles(*args, **kw):
    return moe_prefill_bank(*args, config=PrefillConfig(block_m=16, block_n=32, block_k=64), **kw)


def _small(*args, **kw):
    return moe_prefill_bank(*args, config=SMALL, **kw)


@pytest.mark.parametrize("fmt", ["int8", "mxfp4"])
def test_selfcheck_passes_the_kernel(fmt, device):
    assert _check(device, _fp4_tiles, fmt).ok


def test_selfcheck_refuses_a_wrong_kernel(device, monkeypatch):
    monkeypatch.setattr(selfcheck, "_warnings", [])       # this process's warnings: other tests count theirs
    with pytest.warns(RuntimeWarning, match="moe_prefill"):
        verdict = _check(device, lambda *args, **kw: _small(*args, **kw) * 1.05)
    assert not verdict.ok and "exceeds" in verdict.reason


# ---------------------------------------------------------------- real shapes, on a GPU

REAL = [(1024, 2048, 8), (768, 2048, 8), (2880, 2880, 4)]      # olmoe-1b-7b, qwen3-30b-a3b, gpt-oss-120b experts: I, H, K


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("intermediate,hidden,top_k", REAL)
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_real_shapes_on_gpu(fmt, intermediate, hidden, top_k, x_dtype):
    """A 512-token prefill over 64 resident experts, and a skewed one; float32 must be IEEE-exact (no TF32)."""
    tol = 1e-5 if x_dtype == torch.float32 else BF16_TOL
    for seed, num_tokens in enumerate((512, 5, 333)):
        x, bank, slots, weights, *rest = _case(fmt, "cuda", num_tokens, top_k, 64, intermediate, hidden, seed=seed,
                                               x_dtype=x_dtype)
        if seed == 2:
            slots = _skewed(slots, hot=7)
        ref = moe_prefill_ref(x, bank, slots, weights, *rest)
        for config in (None, PrefillConfig(32, 64, 64), PrefillConfig(64, 128, 64, num_warps=8),
                       PrefillConfig(128, 64, 128, num_warps=8, num_stages=2)):
            out = moe_prefill_bank(x, bank, slots, weights, *rest, config=config)
            assert _rel(out, ref) < tol, (num_tokens, config)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", ["int8", "nvfp4", "mxfp4"])
def test_selfcheck_on_gpu_real_shapes(fmt):
    offsets, block_bytes = make_offsets(fmt, 1024, 2048)
    for dtype in (torch.bfloat16, torch.float32):
        verdict = selfcheck.check_moe_prefill(fmt, offsets, block_bytes, 1024, 2048, 8, "cuda", dtype=dtype)
        assert verdict.ok, verdict.reason
