"""DeepSeek-V4 pieces against transformers' own modules (float32, random weights and inputs)."""
import pytest
import torch

from engine.errors import SluiceError
from engine.model.dsv4.attention import attention
from engine.model.dsv4.compressor import compress, indexer_visible
from engine.model.dsv4.config import read_dsv4_config
from engine.model.dsv4.hyper import HyperWeights, hyper_collapse, hyper_expand, hyper_head
from engine.model.dsv4.layer import Dsv4Layer, attention_weights, rope_for
from engine.model.dsv4.moe import clamped_swiglu, route_hash, route_topk
from engine.model.dsv4.rope import apply_tail_rope, rope_cos_sin
from engine.model.dsv4.state import layer_buffers
from engine.model.rotary import rope_frequencies
from tests.families.dsv4_checkpoint import CSA, HCA, SLIDING, tiny_config, tiny_model
from tests.families.dsv4_runner import PieceModel, layer_states, layer_weights, routed_experts, step_at

TIGHT = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return tiny_model(seed=1)


@pytest.fixture(scope="module")
def cfg(model):
    return read_dsv4_config(model.config)


@pytest.fixture(scope="module")
def trace(model):
    """The reference run (prefill of 13 tokens, then 14 decode steps with its cache), recording each layer's
    and each attention's / MoE block's inputs and outputs per call."""
    from transformers import DynamicCache
    calls = {"layer": {}, "attn": {}, "mlp": {}}

    def recorder(kind, index):
        def hook(module, args, kwargs, output):
            calls[kind].setdefault(index, []).append(
                (args[0][0].detach().clone(), kwargs.get("position_ids"), kwargs.get("input_ids"),
                 (output[0] if isinstance(output, tuple) else output)[0].detach().clone()))
        return hook

    handles = []
    for i, layer in enumerate(model.model.layers):
        handles += [layer.register_forward_hook(recorder("layer", i), with_kwargs=True),
                    layer.self_attn.register_forward_hook(recorder("attn", i), with_kwargs=True),
                    layer.mlp.register_forward_hook(recorder("mlp", i), with_kwargs=True)]
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, model.config.vocab_size, (1, 13), generator=gen)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        for _ in range(15):
            ids = model(ids, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)     # the next step's input
    for h in handles:
        h.remove()
    return calls


def test_tiny_model_has_every_layer_kind(model):
    assert set(model.config.layer_types) == {SLIDING, CSA, HCA}
    assert set(model.config.mlp_layer_types) == {"hash_moe", "moe"}
    assert model.config.rope_parameters["compress"]["rope_type"] == "yarn"


@pytest.mark.parametrize("label", ["main", "compress"])
def test_rope_matches_reference(model, label):
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding, apply_rotary_pos_emb
    rotary = DeepseekV4RotaryEmbedding(model.config)
    positions = torch.tensor([0, 1, 5, 17, 130])                     # past original_max_position_embeddings
    x = torch.randn(1, 4, 5, 32)                                       # [B, heads, T, D]
    cos_ref, sin_ref = rotary(x, positions[None], layer_type=label)
    cos, sin = rope_cos_sin(positions, *rope_frequencies(model.config, label), torch.float32)
    torch.testing.assert_close(cos, cos_ref[0], rtol=0, atol=0)
    torch.testing.assert_close(sin, sin_ref[0], rtol=0, atol=0)
    expected = apply_rotary_pos_emb(x, cos_ref, sin_ref)[0].transpose(0, 1)
    torch.testing.assert_close(apply_tail_rope(x[0].transpose(0, 1), cos, sin), expected, rtol=0, atol=0)


def test_hyper_connection_matches_reference(model, cfg):
    module = model.model.layers[2].ffn_hc
    x = torch.randn(1, 7, cfg.hc_mult, cfg.hidden_size) * 3          # (7 tokens, 3 streams)
    post_ref, comb_ref, collapsed_ref = module(x)
    collapsed, post, comb = hyper_collapse(x[0], HyperWeights(module.fn, module.base, module.scale),
                                           cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.eps)
    torch.testing.assert_close(collapsed, collapsed_ref[0], **TIGHT)
    torch.testing.assert_close(post, post_ref[0], **TIGHT)
    torch.testing.assert_close(comb, comb_ref[0], **TIGHT)
    assert not torch.allclose(comb, comb.transpose(-1, -2))         # direction of the mix matters
    out = torch.randn(7, cfg.hidden_size)
    expected = post_ref.unsqueeze(-1) * out[None].unsqueeze(-2) + torch.matmul(comb_ref.transpose(-1, -2), x)
    torch.testing.assert_close(hyper_expand(x[0], out, post, comb), expected[0], **TIGHT)
    head = model.model.hc_head
    torch.testing.assert_close(hyper_head(x[0], head.hc_fn, head.hc_base, head.hc_scale, cfg.hc_eps, cfg.eps),
                               head(x)[0], **TIGHT)


def _sorted_routes(weights, ids):
    order = ids.argsort(dim=-1)
    return weights.gather(1, order), ids.gather(1, order)


def test_score_router_matches_reference(model, cfg):
    router = model.model.layers[3].mlp.gate
    h = torch.randn(11, cfg.hidden_size)
    _, weights_ref, ids_ref = router(h)
    weights, ids = route_topk(h, router.weight, router.e_score_correction_bias, cfg.scoring, cfg.top_k,
                              cfg.routed_scaling)
    w_ref, i_ref = _sorted_routes(weights_ref, ids_ref)
    w, i = _sorted_routes(weights, ids)
    assert torch.equal(i, i_ref)
    torch.testing.assert_close(w, w_ref, **TIGHT)
    plain = torch.topk(torch.nn.functional.softplus(h @ router.weight.T).sqrt(), cfg.top_k).indices
    assert not torch.equal(plain.sort(-1).values, i)                 # the correction bias changes choices


def test_hash_router_matches_reference(model, cfg):
    router = model.model.layers[0].mlp.gate
    h, token_ids = torch.randn(9, cfg.hidden_size), torch.randint(0, 512, (9,))
    _, weights_ref, ids_ref = router(h, token_ids)
    weights, ids = route_hash(h, router.weight, router.tid2eid, token_ids, cfg.scoring, cfg.routed_scaling)
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(weights, weights_ref, **TIGHT)


def test_clamped_swiglu_matches_experts_and_shared_expert(model, cfg):
    mlp = model.model.layers[4].mlp
    h = torch.randn(6, cfg.hidden_size) * 4                           # large enough that the clamps act
    shared = mlp.shared_experts
    assert (shared.gate_proj(h).abs() > cfg.swiglu_limit).any()
    torch.testing.assert_close(clamped_swiglu(h, shared.gate_proj.weight, shared.up_proj.weight,
                                              shared.down_proj.weight, cfg.swiglu_limit), shared(h), **TIGHT)
    ids = torch.randint(0, 8, (6, 2))
    weights = torch.rand(6, 2)
    expected = mlp.experts(h, ids, weights)
    out = torch.zeros_like(h)
    for t in range(6):
        for k in range(2):
            gate, up = mlp.experts.gate_up_proj[ids[t, k]].chunk(2)
            out[t] += weights[t, k] * clamped_swiglu(h[t], gate, up, mlp.experts.down_proj[ids[t, k]], cfg.swiglu_limit)
    torch.testing.assert_close(out, expected, **TIGHT)


@pytest.mark.parametrize("static", [False, True])                      # True: no start on the host, full-size state
@pytest.mark.parametrize("layer", [1, 2])                               # CSA, HCA
def test_compressor_streams_like_the_reference_cache(model, cfg, layer, static):
    """Prefill of 13 tokens (a window left open), then one token at a time: same entries, same visibility.
    Entries past the closed windows (an open window's partial pool, the static buffer's zeros) stay unseen."""
    from transformers import DynamicCache
    compressor = model.model.layers[layer].self_attn.compressor
    cache = DynamicCache(config=model.config)
    get, _ = layer_weights(model, layer)
    kind = model.config.layer_types[layer]
    w = attention_weights(get, kind, cfg)
    state = layer_states(cfg, [kind], static)
    hidden = torch.randn(1, 25, cfg.hidden_size)
    q_residual = torch.randn(1, 25, model.config.q_lora_rank)
    chunks = [(0, 13)] + [(t, t + 1) for t in range(13, 25)]
    for start, end in chunks:
        positions = torch.arange(start, end)
        entries_ref, bias_ref = compressor(hidden[:, start:end], q_residual[:, start:end], positions[None], cache, layer)
        step = step_at(positions, state, static and start > 0)
        b = layer_buffers(step, 0, kind)
        entries = compress(hidden[0, start:end], positions, step.start, w.compressor, b.compressor, cfg.eps,
                           *cfg.compress_rope)
        closed = entries_ref.shape[2]
        torch.testing.assert_close(entries[:closed], entries_ref[0, 0], **TIGHT)
        if kind == CSA:
            index_keys = compress(hidden[0, start:end], positions, step.start, w.indexer.compressor, b.indexer,
                                  cfg.eps, *cfg.compress_rope)
            cos, sin = rope_cos_sin(positions, *cfg.compress_rope, torch.float32)
            visible = indexer_visible(q_residual[0, start:end], hidden[0, start:end], positions, index_keys,
                                      w.indexer, w.compressor.rate, cos, sin)
            assert torch.equal(visible[:, :closed], bias_ref[0, 0] == 0) and not visible[:, closed:].any()
    assert closed == 25 // w.compressor.rate and entries.shape[0] == (64 // w.compressor.rate if static else closed)
    if kind == CSA:
        assert visible.sum() == cfg.index_topk < closed     # the indexer really selects


@pytest.mark.parametrize("query_chunk", [256, 5])                       # 5: a prompt in 3 chunks
@pytest.mark.parametrize("layer", range(6))
def test_attention_matches_reference_through_prefill_and_decode(model, cfg, trace, layer, query_chunk, monkeypatch):
    monkeypatch.setattr("engine.model.dsv4.attention.QUERY_CHUNK", query_chunk)
    get, _ = layer_weights(model, layer)
    kind = cfg.layer_types[layer]
    w, state = attention_weights(get, kind, cfg), layer_states(cfg, [kind], static=False)
    for h, positions, _, out_ref in trace["attn"][layer]:
        step = step_at(positions[0], state, static=False)
        out = attention(h, step.positions, step.start, w, layer_buffers(step, 0, kind), kind, cfg.sliding_window,
                        cfg.eps, rope_for(cfg, step.positions, h.dtype))
        torch.testing.assert_close(out, out_ref, **TIGHT)
    assert positions[0, -1] + 1 > 2 * cfg.sliding_window                 # the window has slid


@pytest.mark.parametrize("layer", range(6))
def test_decoder_layer_matches_reference(model, cfg, trace, layer):
    get, experts = layer_weights(model, layer)
    block, state = Dsv4Layer(cfg, layer, get), layer_states(cfg, cfg.layer_types, static=False)
    for x, positions, input_ids, out_ref in trace["layer"][layer]:
        step = step_at(positions[0], state, static=False)
        mixed, h = block.mix(x, step, rope_for(cfg, step.positions, x.dtype))
        weights, ids = block.route(h, input_ids[0])
        out = block.combine(mixed, h, routed_experts(block, h, weights, ids, experts))
        torch.testing.assert_close(out, out_ref, **TIGHT)


@pytest.fixture(scope="module")
def generated(model):
    """A 21-token prompt and the reference's 30 greedy tokens after it."""
    prompt = torch.randint(0, model.config.vocab_size, (21,), generator=torch.Generator().manual_seed(5))
    return prompt, model.generate(prompt[None], max_new_tokens=30, do_sample=False)[0, 21:].tolist()


@pytest.mark.parametrize("static", [False, True])       # True: each decode step as a graph replays it (no host start)
def test_pieces_generate_the_reference_tokens(model, generated, static):
    """30 steps after a 21-token prompt: CSA windows (rate 4) and HCA windows (rate 8) close while decoding."""
    prompt, expected = generated
    assert PieceModel(model).greedy(prompt, 30, static) == expected
    assert len(set(expected)) > 5                                     # not a degenerate repetition


def test_refuses_what_the_reference_cannot_build():
    with pytest.raises(KeyError):
        from transformers import AutoModelForCausalLM
        AutoModelForCausalLM.from_config(tiny_config(scoring_func="softmax"))
    with pytest.raises(SluiceError, match="softmax"):
        read_dsv4_config(tiny_config(scoring_func="softmax"))
    from huggingface_hub.errors import StrictDataclassClassValidationError
    with pytest.raises(StrictDataclassClassValidationError, match="layer_types"):
        tiny_config(layer_types=[SLIDING, "full_attention", HCA, CSA, HCA, SLIDING])
