"""The Mamba-2 math (Nemotron-H's mixer layers) against transformers' own torch functions, float32, random inputs."""
import pytest
import torch

from engine.model import mamba2
from tests.families.graph_replay import assert_replays_like_eager

ref = pytest.importorskip("transformers.models.nemotron_h.modeling_nemotron_h")
HEADS, HEAD_DIM, GROUPS, STATE = 8, 16, 2, 16


def inputs(tokens, seed=0):
    """x [T, Hs, P], raw dt [T, Hs], dt_bias, A (negative), B, C [T, G, N], D and a start state [Hs, P, N]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, HEADS, HEAD_DIM, generator=g)
    dt, dt_bias = torch.randn(tokens, HEADS, generator=g), torch.randn(HEADS, generator=g)
    a = -torch.rand(HEADS, generator=g).mul(4).add(0.5)
    b, c = (torch.randn(tokens, GROUPS, STATE, generator=g) for _ in range(2))
    d, start = torch.randn(HEADS, generator=g), torch.randn(HEADS, HEAD_DIM, STATE, generator=g)
    return x, dt, dt_bias, a, b, c, d, start


@pytest.mark.parametrize("tokens,chunk", [(2, 16), (16, 16), (37, 16), (29, 8)])   # under a chunk, one, 3 (odd tail)
def test_chunked_scan_equals_the_reference(tokens, chunk):
    x, dt, dt_bias, a, b, c, d, start = inputs(tokens)
    expected, expected_state = ref.mamba2_chunk_scan(
        x[None], dt[None], a, b[None], c[None], chunk, D=d, dt_bias=dt_bias, initial_states=start[None].clone(),
        dt_softplus=True, dt_limit=(0.001, float("inf")), return_final_states=True)
    state = start.clone()
    out = mamba2.chunked_scan(x, mamba2.time_steps(dt, dt_bias, 0.001), a, b, c, d, state, chunk)
    torch.testing.assert_close(out, expected[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(state, expected_state[0], rtol=1e-6, atol=1e-6)


def test_recurrent_step_equals_the_reference_and_continues_a_prefill():
    x, dt, dt_bias, a, b, c, d, _ = inputs(20, seed=1)
    state = torch.zeros(HEADS, HEAD_DIM, STATE)
    mamba2.chunked_scan(x[:19], mamba2.time_steps(dt[:19], dt_bias, 0.001), a, b[:19], c[:19], d, state, 16)
    ref_state = state.clone()[None]
    expected = ref.mamba2_selective_state_update(
        ref_state, x[19:], dt[19:, :, None].expand(-1, -1, HEAD_DIM), a[:, None, None].expand(-1, HEAD_DIM, STATE),
        b[19:], c[19:], d[:, None].expand(-1, HEAD_DIM), dt_bias=dt_bias[:, None].expand(-1, HEAD_DIM),
        dt_softplus=True)
    out = mamba2.recurrent_step(x[19:], mamba2.time_steps(dt[19:], dt_bias), a, b[19:], c[19:], d, state)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(state, ref_state[0], rtol=1e-6, atol=1e-6)
    # and the chunked form over all 20 tokens ends in (nearly) the same state
    whole = torch.zeros(HEADS, HEAD_DIM, STATE)
    mamba2.chunked_scan(x, mamba2.time_steps(dt, dt_bias, 0.001), a, b, c, d, whole, 16)
    torch.testing.assert_close(whole, state, rtol=1e-4, atol=1e-4)


def test_segment_sums_add_the_steps_after_the_source_up_to_the_target():
    sums = mamba2.segment_sums(torch.tensor([1.0, 2.0, 4.0]))
    inf = float("-inf")
    assert sums.tolist() == [[0.0, inf, inf], [2.0, 0.0, inf], [6.0, 4.0, 0.0]]


def test_the_gated_norm_works_per_group_and_gates_before_it():
    g = torch.Generator().manual_seed(3)
    y, z, weight = torch.randn(5, 32, generator=g), torch.randn(5, 32, generator=g), torch.randn(32, generator=g)
    norm = ref.NemotronHRMSNormGated(32, group_size=16, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(weight)
    torch.testing.assert_close(mamba2.gated_group_rms_norm(y, z, weight, 2, 1e-5), norm(y, z), rtol=0, atol=0)


@pytest.mark.gpu
def test_the_decode_step_replays_in_a_cuda_graph():
    """conv + recurrent step captured once, replayed over new inputs written into the same buffers: equal to the
    eager steps (both states updated in place, no host sync inside)."""
    from engine.model import deltanet
    dev, g = torch.device("cuda"), torch.Generator(device="cuda").manual_seed(0)
    channels = HEADS * HEAD_DIM + 2 * GROUPS * STATE
    conv_w, conv_b = torch.randn(channels, 4, device=dev, generator=g), torch.randn(channels, device=dev, generator=g)
    a, d = -torch.rand(HEADS, device=dev, generator=g).add(0.5), torch.randn(HEADS, device=dev, generator=g)
    dt_bias = torch.randn(HEADS, device=dev, generator=g)
    xbc, dt = torch.zeros(1, channels, device=dev), torch.zeros(1, HEADS, device=dev)

    def step(conv_state, ssm):
        x, b, c = deltanet.causal_conv(xbc, conv_state, conv_w, conv_b).split(
            [HEADS * HEAD_DIM, GROUPS * STATE, GROUPS * STATE], dim=-1)
        return mamba2.recurrent_step(x.view(1, HEADS, HEAD_DIM), mamba2.time_steps(dt, dt_bias), a,
                                     b.view(1, GROUPS, STATE), c.view(1, GROUPS, STATE), d, ssm)

    def fresh():
        return torch.zeros(channels, 3, device=dev), torch.zeros(HEADS, HEAD_DIM, STATE, device=dev)

    def write_inputs():
        xbc.copy_(torch.randn(1, channels, device=dev, generator=g))
        dt.copy_(torch.randn(1, HEADS, device=dev, generator=g))
    assert_replays_like_eager(step, fresh, write_inputs)
