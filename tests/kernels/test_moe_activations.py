"""gpt-oss and DeepSeek-V4 experts in the MoE kernels: gpt-oss's gate/up/down biases and clamped SwiGLU,
DeepSeek-V4's clamped silu, in the decode kernel (two launches, split down) and the prefill kernel,
against their torch references, and the references against the engine's own experts (engine.model.gptoss,
engine.model.dsv4.moe). The clamp limits are small so that many gate and up values pass them. On the CPU
these run in Triton's interpreter, at small shapes."""
import pytest
import torch

from engine.model.dsv4.moe import clamped_swiglu as dsv4_expert
from engine.model.gptoss import clamped_swiglu_expert
from kernels import selfcheck
from kernels.activation import SILU, clamped_silu, clamped_swiglu
from kernels.formats import dequantize_block, make_offsets
from kernels.moe_decode import DecodeConfig, moe_decode, moe_decode_ref
from kernels.moe_prefill import PrefillConfig, moe_prefill_bank, moe_prefill_ref
from tests.kernels.cases import moe_case

ACT = clamped_swiglu(alpha=1.702, limit=0.4)       # gpt-oss's alpha; its limit is 7, too far for random weights
DSV4_ACT = clamped_silu(limit=0.3)                  # DeepSeek-V4's experts: no biases
CASES = {"gpt_oss": (ACT, True), "deepseek_v4": (DSV4_ACT, False)}     # activation, bias fields
I, H = 64, 64                                       # mxfp4: whole 32-value groups
DECODE_CONFIGS = {"loop": DecodeConfig(block_i=16, block_h=16, block_k=32),
                  "split": DecodeConfig(block_i=16, block_h=16, block_k=32, split_down=True)}
PREFILL = PrefillConfig(block_m=16, block_n=32, block_k=32)


def _case(fmt, device, num_tokens, top_k=2, num_slots=4, seed=0, x_dtype=torch.float32, bias=True):
    return moe_case(fmt, device, num_tokens, top_k, num_slots, I, H, seed, x_dtype, bias)


def _rel(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _without(offsets, field):
    return {name: off for name, off in offsets.items() if name != field}


def test_reference_is_the_engines_gpt_oss_expert_and_hits_the_clamp(device):
    """moe_decode_ref with biases and the clamped activation == the routed sum of engine.model.gptoss's expert
    on the same dequantized weights; and the test data does pass the clamp on both sides."""
    x, bank, slots, weights, fmt, offsets, _ = _case("mxfp4", device, 3)
    expected = torch.zeros(x.shape, device=device)
    clamped = 0
    for t in range(x.shape[0]):
        for k in range(slots.shape[1]):
            w = dequantize_block(bank[slots[t, k]], fmt, offsets, I, H)
            expected[t] += weights[t, k] * clamped_swiglu_expert(x[t:t + 1], w, ACT.alpha, ACT.limit)[0]
            gate, up = x[t] @ w["gate"].T + w["gate_bias"], x[t] @ w["up"].T + w["up_bias"]
            clamped += int((gate > ACT.limit).sum() + (up.abs() > ACT.limit).sum())
    assert clamped > I                   # of 2 * I * T * K = 768 values
    torch.testing.assert_close(moe_decode_ref(x, bank, slots, weights, fmt, offsets, I, activation=ACT), expected,
                               rtol=1e-5, atol=1e-6)


def test_reference_is_deepseek_v4s_expert(device):
    x, bank, slots, weights, fmt, offsets, _ = _case("mxfp4", device, 2, seed=5, bias=False)
    expected = torch.zeros(x.shape, device=device)
    for t in range(x.shape[0]):
        for k in range(slots.shape[1]):
            w = dequantize_block(bank[slots[t, k]], fmt, offsets, I, H)
            expected[t] += weights[t, k] * dsv4_expert(x[t:t + 1], w["gate"], w["up"], w["down"], DSV4_ACT.limit)[0]
    torch.testing.assert_close(moe_decode_ref(x, bank, slots, weights, fmt, offsets, I, activation=DSV4_ACT),
                               expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("config", DECODE_CONFIGS.values(), ids=DECODE_CONFIGS.keys())
@pytest.mark.parametrize("family,fmt", [("gpt_oss", "bf16"), ("gpt_oss", "mxfp4"), ("gpt_oss", "fp8"),
                                        ("deepseek_v4", "mxfp4")])
def test_decode_kernels_match_reference(family, fmt, config, device):
    act, bias = CASES[family]
    args = _case(fmt, device, 3, seed=1, bias=bias)
    out = moe_decode(*args, config=config, activation=act)
    assert _rel(out, moe_decode_ref(*args, activation=act)) < 1e-5


def test_decode_skipped_pairs_and_accumulate(device):
    """A skipped (token, choice) adds nothing, not even its down bias; two launches add up to one."""
    x, bank, slots, weights, *rest = _case("bf16", device, 1, top_k=3, seed=2)
    first, second = slots.clone(), slots.clone()
    first[0, 2] = -1
    second[0, :2] = -1
    for config in DECODE_CONFIGS.values():
        out = moe_decode(x, bank, first, weights, *rest, config=config, activation=ACT)
        assert _rel(out, moe_decode_ref(x, bank, first, weights, *rest, activation=ACT)) < 1e-5
        moe_decode(x, bank, second, weights, *rest, config=config, activation=ACT, out=out, accumulate=True)
        assert _rel(out, moe_decode_ref(x, bank, slots, weights, *rest, activation=ACT)) < 1e-5


@pytest.mark.parametrize("family,fmt,x_dtype", [("gpt_oss", "bf16", torch.float32), ("gpt_oss", "mxfp4", torch.float32),
                                                ("gpt_oss", "bf16", torch.bfloat16), ("gpt_oss", "mxfp4", torch.bfloat16),
                                                ("deepseek_v4", "mxfp4", torch.float32)],
                         ids=["gpt_oss-bf16-fp32", "gpt_oss-mxfp4-fp32", "gpt_oss-bf16-bf16", "gpt_oss-mxfp4-bf16",
                              "deepseek_v4-mxfp4-fp32"])
def test_prefill_kernel_matches_reference(family, fmt, x_dtype, device):
    """20 tokens x 2 choices over 4 experts: blocks of 16 rows with padded tails (whose h is act(biases))."""
    act, bias = CASES[family]
    args = _case(fmt, device, 20, seed=3, x_dtype=x_dtype, bias=bias)
    out = moe_prefill_bank(*args, config=PREFILL, activation=act)
    tol = 1e-5 if x_dtype == torch.float32 else (1e-2 if torch.cuda.is_available() else 3e-2)
    assert _rel(out, moe_prefill_ref(*args, activation=act)) < tol


@pytest.mark.parametrize("wrong", ["no down bias", "no gate bias", "silu"])
def test_a_wrong_kernel_misses_the_tolerance(wrong, device):
    """The kernels computing without one bias or with plain silu are far off: the comparisons above catch it."""
    x, bank, slots, weights, fmt, offsets, _ = _case("mxfp4", device, 20, seed=4)
    ref_decode = moe_decode_ref(x[:2], bank, slots[:2], weights[:2], fmt, offsets, I, activation=ACT)
    ref_prefill = moe_prefill_ref(x, bank, slots, weights, fmt, offsets, I, activation=ACT)
    act = SILU if wrong == "silu" else ACT
    kernel_offsets = {"no down bias": _without(offsets, "down_bias.b"),
                      "no gate bias": _without(offsets, "gate_bias.b")}.get(wrong, offsets)
    decode = moe_decode(x[:2], bank, slots[:2], weights[:2], fmt, kernel_offsets, I,
                        config=DECODE_CONFIGS["split"], activation=act)
    prefill = moe_prefill_bank(x, bank, slots, weights, fmt, kernel_offsets, I, config=PREFILL, activation=act)
    assert _rel(decode, ref_decode) > 1e-2 and _rel(prefill, ref_prefill) > 1e-2


def test_selfchecks_pass_the_kernel_and_refuse_a_missing_down_bias(device, monkeypatch, tmp_path):
    """The runner's checks with gpt-oss's activation and bias fields: the decode kernel passes, kernels that
    drop the down bias are refused (decode: the reference is used instead). The prefill kernel's pass is
    test_prefill_kernel_matches_reference's (its check's 128-token prompts are slow to interpret)."""
    monkeypatch.setattr(selfcheck, "_warnings", [])
    offsets, block_bytes = make_offsets("mxfp4", I, H, bias=True)

    def decode(*args, **kw):
        return moe_decode(*args, config=DECODE_CONFIGS["split"], **kw)

    def prefill(*args, **kw):
        return moe_prefill_bank(*args, config=PREFILL, **kw)

    def dropping_down_bias(kernel):
        return lambda x, bank, slots, weights, fmt, offs, inter, **kw: kernel(
            x, bank, slots, weights, fmt, _without(offs, "down_bias.b"), inter, **kw)

    def select(kernel):
        return selfcheck.select_moe_decode("mxfp4", offsets, block_bytes, I, H, 2, device, kernel=kernel,
                                           dtype=torch.float32, activation=ACT)

    def check_prefill(kernel):
        return selfcheck.check_moe_prefill("mxfp4", offsets, block_bytes, I, H, 2, device, dtype=torch.float32,
                                           kernel=kernel, config=PREFILL, activation=ACT)

    fn, verdict = select(decode)
    assert verdict.ok and fn is decode
    monkeypatch.setenv("SLUICE_DATA_DIR", str(tmp_path / "fresh"))              # not the pass cached above
    with pytest.warns(RuntimeWarning, match="reference path"):
        fn, verdict = select(dropping_down_bias(decode))
    assert not verdict.ok and fn is moe_decode_ref
    with pytest.warns(RuntimeWarning, match="moe_prefill"):
        assert not check_prefill(dropping_down_bias(prefill)).ok


# ---------------------------------------------------------------- gpt-oss-120b's expert shapes, on a GPU

GPT_OSS_120B = (2880, 2880, 4)          # I, H, K
GPT_OSS_ACT = clamped_swiglu(alpha=1.702, limit=7.0)


def _real_case(fmt, num_tokens, x_dtype, seed):
    intermediate, hidden, top_k = GPT_OSS_120B
    x, *rest = moe_case(fmt, "cuda", num_tokens, top_k, 16, intermediate, hidden, seed, x_dtype, bias=True)
    return 4 * x, *rest                                  # x4: some values pass the clamp


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", ["mxfp4", "bf16"])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_real_shapes_on_gpu(fmt, x_dtype):
    """Decode (shipped config and split) and prefill (shipped config, 512 tokens) at gpt-oss-120b's
    expert shapes with biases and its clamped SwiGLU; the self-checks the runner runs pass."""
    from kernels.moe_decode import default_config
    tol = 1e-5 if x_dtype == torch.float32 else 1e-2
    for num_tokens in (1, 4):
        args = _real_case(fmt, num_tokens, x_dtype, seed=num_tokens)
        ref = moe_decode_ref(*args, activation=GPT_OSS_ACT)
        for config in (default_config(fmt), DecodeConfig(block_i=16, block_h=32, block_k=512, split_down=True)):
            assert _rel(moe_decode(*args, config=config, activation=GPT_OSS_ACT), ref) < tol, (num_tokens, config)
    args = _real_case(fmt, 512, x_dtype, seed=7)
    assert _rel(moe_prefill_bank(*args, activation=GPT_OSS_ACT), moe_prefill_ref(*args, activation=GPT_OSS_ACT)) < tol
    offsets, block_bytes = make_offsets(fmt, GPT_OSS_120B[0], GPT_OSS_120B[1], bias=True)
    shape = (fmt, offsets, block_bytes, *GPT_OSS_120B)
    assert selfcheck.select_moe_decode(*shape, "cuda", dtype=x_dtype, activation=GPT_OSS_ACT)[1].ok
    assert selfcheck.check_moe_prefill(*shape, "cuda", dtype=x_dtype, activation=GPT_OSS_ACT).ok
