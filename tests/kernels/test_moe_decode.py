"""moe_decode (Triton) against moe_decode_ref (torch) and against plain expert math on weights
quantized by engine/quant.py. On the CPU these run in Triton's interpreter, so shapes are small."""

import pytest
import torch

from engine.format.layout import block_layout
from engine.format.quant import dequantize, quantize
from kernels.moe_decode import DecodeConfig, default_config, moe_decode, moe_decode_ref
from tests.kernels.cases import moe_case as _case

SMALL = DecodeConfig(block_i=16, block_h=16, block_k=32)    # many loop trips and masked tails at small shapes
SMALL_SPLIT = DecodeConfig(block_i=16, block_h=16, block_k=32, split_down=True)   # down pass with atomic adds
FMTS = ["bf16", "fp8", "nvfp4", "mxfp4", "int8"]
# int8 runs fp8's code paths with its own loads: in the interpreter it is checked on the decode shapes
# and every config, not again on the tests of format-independent logic (routing, accumulation).
LOGIC_FMTS = ["bf16", "fp8", "nvfp4", "mxfp4"]
# Routing and accumulation (which pairs run, into which rows) do not depend on the fp4 flavour: mxfp4 shares
# nvfp4's tile code but for its group size and scale decode, which test_matches_reference checks on every shape.
ROUTING_FMTS = ["bf16", "fp8", "nvfp4"]
SHAPES = [
    (1, 1, 3, 37, 53),     # one token, one expert, prime dims (not multiples of any block)
    (1, 4, 7, 61, 47),     # decode: one token, several experts, hidden < block_k tail
    (3, 2, 5, 29, 97),     # small batch, prime dims
    (4, 5, 5, 19, 31),     # k = E: every token uses every expert
]


def _dims(fmt, intermediate, hidden):
    """nvfp4 / mxfp4 need multiples of their scale group (16 / 32): round the odd test sizes up."""
    group = {"nvfp4": 16, "mxfp4": 32}.get(fmt, 1)
    return -(-intermediate // group) * group, -(-hidden // group) * group


def _rel(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("config", [SMALL, SMALL_SPLIT], ids=["loop", "split"])
@pytest.mark.parametrize("fmt,num_tokens,top_k,num_slots,intermediate,hidden",
                         [(fmt, *shape) for fmt in LOGIC_FMTS for shape in SHAPES]
                         + [("int8", *shape) for shape in SHAPES[:2]])
def test_matches_reference(fmt, config, device, num_tokens, top_k, num_slots, intermediate, hidden):
    intermediate, hidden = _dims(fmt, intermediate, hidden)
    args = _case(fmt, device, num_tokens, top_k, num_slots, intermediate, hidden, seed=num_tokens * 100 + top_k)
    out = moe_decode(*args, config=config)
    ref = moe_decode_ref(*args)
    assert out.shape == ref.shape and out.dtype == ref.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert _rel(out, ref) < 1e-5


@pytest.mark.parametrize("fmt", ROUTING_FMTS)
def test_all_tokens_on_one_expert(fmt, device):
    intermediate, hidden = _dims(fmt, 13, 29)        # odd, one row block of SMALL: the routing is the point here
    x, bank, slots, weights, *rest = _case(fmt, device, 5, 2, 4, intermediate, hidden, seed=3)
    slots[:, 0] = 2                         # every token's first choice is slot 2, second choice varies
    slots[:, 1] = torch.tensor([0, 1, 3, 0, 1], dtype=torch.int32)
    for config in (SMALL, SMALL_SPLIT):
        out = moe_decode(x, bank, slots, weights, *rest, config=config)
        assert _rel(out, moe_decode_ref(x, bank, slots, weights, *rest)) < 1e-5


@pytest.mark.parametrize("fmt", FMTS)
def test_default_config_and_bf16_activations(fmt, device):
    """The shipped block sizes (block_k larger than these dims: all-masked tails) with bf16 x; fp32 out.
    (Small dims, 2 tokens x 2 experts: the shipped row blocks are narrow, each one an interpreted program.)"""
    intermediate, hidden = _dims(fmt, 24, 40)
    args = _case(fmt, device, 2, 2, 5, intermediate, hidden, seed=11, x_dtype=torch.bfloat16)
    out = moe_decode(*args, config=default_config(fmt))
    assert out.dtype == torch.float32
    assert _rel(out, moe_decode_ref(*args)) < 1e-5


@pytest.mark.parametrize("config", [SMALL, SMALL_SPLIT], ids=["loop", "split"])
def test_writes_into_given_buffers(device, config):
    """Graph-capture use: results land in `out` (poisoned first) and nothing else is allocated for them."""
    args = _case("fp8", device, 2, 2, 3, 37, 53, seed=5)
    out = torch.full((2, 53), float("nan"), device=device)
    h_buf = torch.full((4, 37), float("nan"), device=device)
    result = moe_decode(*args, config=config, out=out, h_buf=h_buf)
    assert result.data_ptr() == out.data_ptr() and torch.isfinite(out).all() and torch.isfinite(h_buf).all()
    assert _rel(out, moe_decode_ref(*args)) < 1e-5


@pytest.mark.parametrize("fmt", FMTS)
def test_reference_is_plain_expert_math_on_engine_quantized_weights(fmt, device):
    """The reference itself: sum_k w_k * down(silu(gate x) * up x) with engine.format.quant's dequantized weights."""
    intermediate, hidden, num_experts = 32, 64, 3
    layout = block_layout(intermediate, hidden, fmt)
    g = torch.Generator().manual_seed(9)
    experts, blocks = [], []
    for _ in range(num_experts):
        dense = {"gate": torch.randn(intermediate, hidden, generator=g) * 0.2,
                 "up": torch.randn(intermediate, hidden, generator=g) * 0.2,
                 "down": torch.randn(hidden, intermediate, generator=g) * 0.2}
        quantized = {p: quantize(w, fmt) for p, w in dense.items()}
        experts.append({p: dequantize(q, fmt) for p, q in quantized.items()})
        blocks.append(layout.pack({f"{p}.{n}": t for p, q in quantized.items() for n, t in q.items()}))
    bank = torch.stack(blocks).to(device)
    offsets = {f.name: f.offset for f in layout.fields}
    x = torch.randn(2, hidden, generator=g)
    slots = torch.tensor([[2, 0], [1, 2]], dtype=torch.int32)
    weights = torch.tensor([[0.7, 0.3], [0.4, 0.6]])
    expected = torch.zeros(2, hidden)
    for t in range(2):
        for k in range(2):
            e = experts[slots[t, k]]
            expected[t] += weights[t, k] * (e["down"] @ (torch.nn.functional.silu(e["gate"] @ x[t]) * (e["up"] @ x[t])))
    args = (x.to(device), bank, slots.to(device), weights.to(device), fmt, offsets, intermediate)
    torch.testing.assert_close(moe_decode_ref(*args).cpu(), expected, rtol=1e-5, atol=1e-5)
    for config in (SMALL, SMALL_SPLIT):
        torch.testing.assert_close(moe_decode(*args, config=config).cpu(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("intermediate,hidden", [(32, 2880), (2880, 32)])   # gpt-oss's width, down then gate/up
def test_fp4_at_gpt_oss_width(fmt, device, intermediate, hidden):
    """2880 = 90 mxfp4 / 180 nvfp4 groups: no power of two, so the last tile of each row is partly masked.
    (The interpreter: tall row blocks, few programs; a GPU: the format's own tiles, which compile in seconds
    where the tall ones took minutes.)"""
    args = _case(fmt, device, 1, 2, 3, intermediate, hidden, seed=7)
    tall = DecodeConfig(block_i=512, block_h=512, block_k=1024, split_down=True)
    out = moe_decode(*args, config=default_config(fmt) if device == "cuda" else tall)
    assert _rel(out, moe_decode_ref(*args)) < 1e-5


def test_fp4_tiles_refuse_a_reduction_tile_narrower_than_a_group(device):
    args = _case("mxfp4", device, 1, 2, 3, 32, 64, seed=0)
    with pytest.raises(ValueError, match="block_k"):
        moe_decode(*args, config=DecodeConfig(block_k=16))


@pytest.mark.parametrize("change,error", [
    (lambda a: {**a, "slots": a["slots"].long()}, TypeError),
    (lambda a: {**a, "weights": a["weights"].double()}, TypeError),
    (lambda a: {**a, "x": a["x"].T.contiguous().T}, ValueError),               # a non-contiguous [T, H] view
    (lambda a: {**a, "bank": a["bank"][:, :-16].contiguous()}, ValueError),    # blocks not a 4096-byte multiple
    (lambda a: {**a, "fmt": "int3"}, ValueError),
])
def test_launcher_refuses_bad_inputs(device, change, error):
    x, bank, slots, weights, fmt, offsets, intermediate = _case("fp8", device, 2, 2, 3, 37, 53, seed=1)
    args = change(dict(x=x, bank=bank, slots=slots, weights=weights, fmt=fmt, offsets=offsets, intermediate=intermediate))
    with pytest.raises(error):
        moe_decode(**args, config=SMALL)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("intermediate,hidden,top_k,num_tokens", [
    (768, 2048, 8, 1), (768, 2048, 8, 4),      # qwen3-30b-a3b experts
    (1024, 2048, 8, 1),                        # olmoe-1b-7b experts
    (2880, 2880, 4, 1),                        # gpt-oss-120b experts (2880 = 90 mxfp4 groups: no power of two)
])
def test_real_shapes_on_gpu(fmt, intermediate, hidden, top_k, num_tokens):
    for seed in range(3):                      # fresh random data each time
        args = _case(fmt, "cuda", num_tokens, top_k, 16, intermediate, hidden, seed=seed)
        for config in (None, DecodeConfig(8, 4, 1024, 4, split_down=True), DecodeConfig(8, 16, 512, 4)):
            out = moe_decode(*args, config=config)
            assert _rel(out, moe_decode_ref(*args)) < 1e-4


@pytest.mark.parametrize("fmt", ROUTING_FMTS)
@pytest.mark.parametrize("config", [SMALL, SMALL_SPLIT], ids=["loop", "split"])
def test_resident_first_then_late_experts_add_up_to_one_launch(fmt, config, device):
    """The streaming decode's split: a launch over the resident experts (the others' slots -1, no
    bytes read for them), then one over the late ones that adds into the same output."""
    intermediate, hidden = _dims(fmt, 13, 29)        # odd, one row block of SMALL: the split launches are the point
    x, bank, slots, weights, *rest = _case(fmt, device, 1, 5, 9, intermediate, hidden, seed=11)
    whole = moe_decode_ref(x, bank, slots, weights, *rest)
    late = torch.tensor([[False, True, False, True, True]], device=slots.device)
    early_slots, late_slots = slots.masked_fill(late, -1), slots.masked_fill(~late, -1)
    for fn in (moe_decode, moe_decode_ref):
        out = torch.full_like(whole, float("nan"))
        kw = {"config": config} if fn is moe_decode else {}
        fn(x, bank, early_slots, weights, *rest, out=out, **kw)
        assert _rel(out, moe_decode_ref(x, bank, slots, weights * ~late, *rest)) < 1e-5   # only the early ones
        fn(x, bank, late_slots, weights, *rest, out=out, accumulate=True, **kw)
        assert _rel(out, whole) < 1e-5, fn.__name__
    with pytest.raises(ValueError, match="out="):
        moe_decode(x, bank, slots, weights, *rest, config=config, accumulate=True)
