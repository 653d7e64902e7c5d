"""The one runtime on whatever device there is, for the hybrids: greedy tokens equal transformers' with
experts streaming (3 slots a bank, 4 RAM blocks). On the CPU torch math; on a GPU (float32) the decode
step (DeltaNet states updated in place) runs as CUDA graphs with the Triton expert kernels."""
import pytest
import torch

from engine.format.repack import repack
from engine.model import deltanet
from kernels.deltanet_ref import decay_and_beta, recurrent_delta_step
from tests.engine.reference import load_reference, reference_greedy
from tests.families.graph_replay import assert_replays_like_eager
from tests.families.hybrid_models import build_hybrid
from tests.families.test_qwen3_next import NEW_TOKENS, PROMPT_IDS
from tests.streaming.sized import engine_with_slots, token_ids


@pytest.fixture(scope="module", params=["qwen3_next", "qwen3_5_moe"])
def family_model(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    hf = build_hybrid(request.param, tmp / "hf", seed=2)
    repack(hf, tmp / "sluice", quant="bf16")
    return tmp / "sluice", reference_greedy(load_reference(hf), PROMPT_IDS, NEW_TOKENS)


def test_greedy_tokens_equal_transformers_while_streaming(family_model):
    path, expected = family_model
    eng = engine_with_slots(path, 3, 4, max_context=len(PROMPT_IDS) + NEW_TOKENS)
    try:
        assert token_ids(eng, PROMPT_IDS, NEW_TOKENS) == expected
        assert token_ids(eng, PROMPT_IDS, NEW_TOKENS) == expected        # DeltaNet states start fresh each time
        snap = eng.telemetry()
        if torch.cuda.is_available():
            assert eng.runner.step.use_graphs and eng.runner.experts.compute.kernel is not None
    finally:
        eng.close()
    assert snap["ram_cache"]["misses"] > 0 and snap["disk"]["bytes_read"] > 0


@pytest.mark.gpu
def test_deltanet_decode_step_replays_in_a_cuda_graph():
    """conv + recurrent step captured once, replayed over new inputs written into the same buffers:
    equal to the eager steps (the state is updated in place, no host sync inside)."""
    dev, g = torch.device("cuda"), torch.Generator(device="cuda").manual_seed(0)
    conv_w = torch.randn(96, 4, device=dev, generator=g)
    x = torch.zeros(1, 96, device=dev)
    a_b = torch.zeros(2, 1, 4, device=dev)
    a_log, dt_bias = torch.rand(4, device=dev, generator=g).log(), torch.randn(4, device=dev, generator=g)

    def step(conv_state, state):
        qkv = deltanet.causal_conv(x, conv_state, conv_w)
        q, k, v = qkv[:, :32].view(1, 2, 16), qkv[:, 32:64].view(1, 2, 16), qkv[:, 64:].view(1, 4, 8)
        decay, beta = decay_and_beta(a_b[0], a_b[1], a_log, dt_bias)
        return recurrent_delta_step(q, k, v, decay, beta, state)

    def fresh():
        return torch.zeros(96, 3, device=dev), torch.zeros(4, 16, 8, device=dev)

    def write_inputs():
        x.copy_(torch.randn(1, 96, device=dev, generator=g))
        a_b.copy_(torch.randn(2, 1, 4, device=dev, generator=g))
    assert_replays_like_eager(step, fresh, write_inputs)
