"""gpt-oss experts (biases, clamped SwiGLU) and DeepSeek-V4's (clamped silu) through the Triton MoE kernels
while they stream through 3 slots a bank: the prompt through the prefill kernel, every new token through the
decode kernel, tokens exactly transformers'. gpt-oss's clamp limit is lowered to 1 (DeepSeek-V4's test model
has 1.5) so that many gate and up values pass it. On a GPU the runner
picks the kernels (after their self-checks); on the CPU, where it picks kernels for CUDA only, they are put
in place by hand and run in Triton's interpreter (float32 compute both ways)."""
import functools

import pytest

from engine.format.repack import repack
from engine.tools.demo import build_hf_model, write_mxfp4_checkpoint
from tests.engine.reference import load_reference, reference_greedy
from tests.families.dsv4_checkpoint import build_dsv4
from tests.streaming.sized import engine_with_slots, token_ids

pytest.importorskip("triton")
from kernels.moe_decode import DecodeConfig, moe_decode  # noqa: E402
from kernels.moe_prefill import PrefillConfig, PrefillKernel  # noqa: E402

PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 1, 300]     # 10 tokens: the prefill kernel's (more than the decode kernel's 4)
NEW_TOKENS = 6
# Tiles as wide as the test models' experts (64): one interpreted program a pair and projection (the tails and
# the tile loops are the kernel tests' own, tests/kernels)
CPU_DECODE = DecodeConfig(block_i=64, block_h=64, block_k=64, split_down=True)
CPU_PREFILL = PrefillConfig(16, 64, 64)


class Counting:
    """A kernel of the engine's, counting its calls (route passes through for the prefill kernel)."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, 0

    def route(self, *args):
        return self.kernel.route(*args)

    def __call__(self, *args, **kw):
        self.calls += 1
        return self.kernel(*args, **kw)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(bf16 snapshot, the same with its experts stored as native mxfp4 `*_blocks` / `*_scales`)."""
    tmp = tmp_path_factory.mktemp("gpt_oss_kernels")
    hf = build_hf_model("gpt_oss", tmp / "hf", num_layers=2, with_tokenizer=False, seed=5, swiglu_limit=1.0)
    return hf, write_mxfp4_checkpoint(hf, tmp / "hf-mxfp4")


def _kernel_tokens(path, monkeypatch, activation_name="clamped_swiglu", wrap=None) -> list[int]:
    """Greedy tokens of the streaming engine with both MoE kernels, whose model declares `activation_name`;
    `wrap` replaces the decode kernel by a variant of it (a deliberately wrong one)."""
    eng = engine_with_slots(path, slots_per_bank=3, ram_blocks=4)
    try:
        experts, activation = eng.runner.experts.compute, eng.runner.model.expert_kernel
        assert activation is not None and activation.name == activation_name
        graphs = eng.runner.step.use_graphs     # one-token decode replays the kernel captured at load, not experts.kernel
        if eng.runner.is_cuda:
            assert experts.kernel is not None and experts.prefill_kernel is not None, "the runner kept the torch path"
            if wrap and graphs:
                pytest.skip("the decode kernel runs from CUDA graphs captured at load: a variant cannot be put in")
        else:
            experts.kernel = functools.partial(moe_decode, config=CPU_DECODE, activation=activation)
            experts.prefill_kernel = PrefillKernel(CPU_PREFILL, activation)
        experts.kernel = decode = Counting(wrap(experts.kernel) if wrap else experts.kernel)
        experts.prefill_kernel = prefill = Counting(experts.prefill_kernel)
        tokens = token_ids(eng, PROMPT, NEW_TOKENS)
        assert eng.telemetry()["ram_cache"]["evictions"] > 0                      # the experts really streamed
        assert prefill.calls >= 2 and (graphs or decode.calls >= 2 * (NEW_TOKENS - 1))   # both layers, every step
        return tokens
    finally:
        eng.close()


def test_bf16_experts_through_the_kernels_give_transformers_tokens(checkpoints, tmp_path, monkeypatch):
    hf, _ = checkpoints
    expected = reference_greedy(load_reference(hf), PROMPT, NEW_TOKENS)
    assert _kernel_tokens(repack(hf, tmp_path / "bf16", quant="bf16"), monkeypatch) == expected


def test_native_mxfp4_experts_through_the_kernels_give_transformers_tokens(checkpoints, tmp_path, monkeypatch):
    """The checkpoint's own mxfp4 bytes in the slots (gpt-oss-120b's format), transformers dequantizing them."""
    _, mxfp4 = checkpoints
    expected = reference_greedy(load_reference(mxfp4), PROMPT, NEW_TOKENS)
    assert _kernel_tokens(repack(mxfp4, tmp_path / "mxfp4", quant="mxfp4"), monkeypatch) == expected


def test_a_decode_kernel_without_the_down_bias_gives_other_tokens(checkpoints, tmp_path, monkeypatch):
    """The comparison above can fail: the same run with a decode kernel that skips the down bias differs."""
    hf, _ = checkpoints
    expected = reference_greedy(load_reference(hf), PROMPT, NEW_TOKENS)

    def without_down_bias(kernel):
        def wrong(x, bank, slots, weights, fmt, offsets, *rest, **kw):
            return kernel(x, bank, slots, weights, fmt, {k: v for k, v in offsets.items() if k != "down_bias.b"},
                          *rest, **kw)
        return wrong

    path = repack(hf, tmp_path / "bf16", quant="bf16")
    assert _kernel_tokens(path, monkeypatch, wrap=without_down_bias) != expected


def test_deepseek_v4_experts_through_the_kernels_give_transformers_tokens(tmp_path, monkeypatch):
    hf = build_dsv4(tmp_path / "hf", seed=2, with_tokenizer=False)
    expected = reference_greedy(load_reference(hf), PROMPT, NEW_TOKENS)
    assert _kernel_tokens(repack(hf, tmp_path / "bf16", quant="bf16"), monkeypatch, "clamped_silu") == expected
