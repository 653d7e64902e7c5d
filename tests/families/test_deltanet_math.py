"""The DeltaNet math against transformers' own torch functions (qwen3_next), float32, random inputs."""
import pytest
import torch

from engine.model import deltanet
from kernels.deltanet_ref import decay_and_beta, gated_rms_norm, recurrent_delta_step

ref = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def inputs(tokens, k_heads=2, v_heads=4, dk=16, dv=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, k_heads, dk, generator=g)
    k = torch.randn(tokens, k_heads, dk, generator=g)
    v = torch.randn(tokens, v_heads, dv, generator=g)
    a, b = torch.randn(tokens, v_heads, generator=g), torch.randn(tokens, v_heads, generator=g)
    a_log, dt_bias = torch.rand(v_heads, generator=g).mul(3).log(), torch.randn(v_heads, generator=g)
    decay, beta = decay_and_beta(a, b, a_log, dt_bias)
    return q, k, v, decay, beta


@pytest.mark.parametrize("tokens", [1, 5, 64, 150])   # one token, under a chunk, one chunk exactly, 3 chunks (odd tail)
def test_chunked_form_equals_the_reference(tokens):
    q, k, v, g, beta = inputs(tokens)
    start = torch.randn(4, 16, 8)
    expected, expected_state = ref.torch_chunk_gated_delta_rule(
        q[None], k[None], v[None], g=g[None], beta=beta[None], initial_state=start[None].clone(),
        output_final_state=True, use_qk_l2norm_in_kernel=True)
    state = start.clone()
    out = deltanet.chunked_delta_rule(q, k, v, g, beta, state)
    torch.testing.assert_close(out, expected[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, expected_state[0], rtol=1e-5, atol=1e-5)


def test_recurrent_step_equals_the_reference_and_continues_a_prefill():
    q, k, v, g, beta = inputs(70, seed=1)
    state = torch.zeros(4, 16, 8)
    deltanet.chunked_delta_rule(q[:69], k[:69], v[:69], g[:69], beta[:69], state)
    ref_state = state.clone()[None]
    expected, expected_state = ref.torch_recurrent_gated_delta_rule(
        q[None, 69:], k[None, 69:], v[None, 69:], g=g[None, 69:], beta=beta[None, 69:], initial_state=ref_state,
        output_final_state=True, use_qk_l2norm_in_kernel=True)
    out = recurrent_delta_step(q[69:], k[69:], v[69:], g[69:], beta[69:], state)
    torch.testing.assert_close(out, expected[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(state, expected_state[0], rtol=1e-6, atol=1e-6)
    # and the chunked form over all 70 tokens ends in (nearly) the same state
    whole = torch.zeros(4, 16, 8)
    deltanet.chunked_delta_rule(q, k, v, g, beta, whole)
    torch.testing.assert_close(whole, state, rtol=1e-4, atol=1e-4)


def test_causal_conv_prefill_then_steps_equal_the_reference():
    channels, kernel, tokens = 12, 4, 9
    x = torch.randn(tokens, channels)
    weight = torch.randn(channels, kernel)
    expected = ref.causal_conv1d_fn(x.T[None], weight, None, activation="silu")[0].T      # whole sequence
    state = torch.zeros(channels, kernel - 1)
    prefix = deltanet.causal_conv(x[:2], state, weight)                # shorter than the kernel
    steps = [deltanet.causal_conv(x[i:i + 1], state, weight) for i in range(2, tokens)]
    torch.testing.assert_close(torch.cat([prefix, *steps]), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(state, x[-(kernel - 1):].T)


def test_gated_rms_norm_equals_the_reference():
    norm = ref.Qwen3NextRMSNormGated(8, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(8))
    x, z = torch.randn(6, 8), torch.randn(6, 8)
    torch.testing.assert_close(gated_rms_norm(x, z, norm.weight.detach(), 1e-6), norm(x, z).detach())
