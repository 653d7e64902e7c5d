"""MLA attention and the grouped routers against the transformers modules (float32, random weights and inputs)."""
import pytest
import torch

from engine.model.layers import apply_rope, rope_cos_sin
from engine.model.mla import MlaAttention, MlaShape
from engine.model.rotary import apply_rope_interleaved, rope_frequencies
from engine.model.routers import GroupedRouter

MLA = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16,
           qk_rope_head_dim=8, v_head_dim=12, num_hidden_layers=1, vocab_size=32, max_position_embeddings=4096)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 64,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}


def _config(family, **kw):
    from transformers import AutoConfig
    cfg = AutoConfig.for_model(family, **{**MLA, **kw})
    cfg._attn_implementation = "eager"
    return cfg


def _randomise(module, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else torch.randn_like(p) * 0.3)
    return module


def _hf_attention(family, cfg):
    import importlib
    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    prefix = {"deepseek_v2": "DeepseekV2", "deepseek_v3": "DeepseekV3", "glm4_moe_lite": "Glm4MoeLite"}[family]
    attn = _randomise(getattr(mod, prefix + "Attention")(cfg, layer_idx=0)).eval()
    rotary = getattr(mod, prefix + "RotaryEmbedding")(cfg)
    return attn, rotary


@pytest.mark.parametrize("family,kw", [
    ("deepseek_v2", dict(q_lora_rank=None)),                                  # V2-Lite: one q_proj
    ("deepseek_v2", dict(q_lora_rank=24, rope_parameters=YARN)),              # V2: q LoRA, YaRN + mscale
    ("deepseek_v3", dict(q_lora_rank=24, rope_parameters=YARN, attention_bias=True)),
    ("deepseek_v3", dict(q_lora_rank=24, rope_interleave=False)),
    ("glm4_moe_lite", dict(q_lora_rank=24)),
])
@pytest.mark.parametrize("with_kernel", [False, True])        # decode tokens through kernels/mla_decode.py or torch
def test_mla_matches_transformers_in_prefill_and_decode(family, kw, with_kernel):
    cfg = _config(family, **kw)
    attn, rotary = _hf_attention(family, cfg)
    T = 9
    x = torch.randn(1, T, 64)
    positions = torch.arange(T)
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        embeddings = rotary(x, positions[None])
        expected = attn(x, attention_mask=mask, position_embeddings=embeddings)[0][0]     # [T, D]

    shape = MlaShape.from_config(cfg)
    mine = MlaAttention(shape, {k: v.detach() for k, v in attn.state_dict().items()})
    if with_kernel:
        mine.decode_kernel = pytest.importorskip("kernels.mla_decode").mla_decode
    inv_freq, scaling = rope_frequencies(cfg)
    state = {}

    def store(kv_latent, k_rope):
        for name, value in (("kv_latent", kv_latent), ("k_rope", k_rope)):
            state[name] = torch.cat([state[name], value]) if name in state else value
        return state["kv_latent"], state["k_rope"]

    def step(lo, hi):
        cos, sin = rope_cos_sin(positions[lo:hi], inv_freq, scaling, torch.float32)
        return mine.forward(x[0, lo:hi], cos, sin, positions[lo:hi], store)

    got = torch.cat([step(0, 5)] + [step(t, t + 1) for t in range(5, T)])        # prefill 5, then decode one by one
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert state["kv_latent"].shape == (T, 32) and state["k_rope"].shape == (T, 8)
    assert shape.state_bytes_per_token(2) == (32 + 8) * 2


def test_interleaved_rope_equals_deepseek_v2_complex_rotation_up_to_the_layout():
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import apply_rotary_emb
    q, k = torch.randn(1, 3, 5, 8), torch.randn(1, 1, 5, 8)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    freqs = torch.arange(5).float()[:, None] * inv_freq
    hq, hk = apply_rotary_emb(q, k, torch.polar(torch.ones_like(freqs), freqs)[None])
    cos, sin = rope_cos_sin(torch.arange(5), inv_freq, 1.0, torch.float32)                 # [5, 1, 8]
    mq = apply_rope_interleaved(q[0].transpose(0, 1), cos, sin).transpose(0, 1)          # [3, 5, 8]
    de_interleave = torch.cat([torch.arange(0, 8, 2), torch.arange(1, 8, 2)])
    torch.testing.assert_close(mq, hq[0][..., de_interleave], rtol=1e-6, atol=1e-6)
    mk = apply_rope_interleaved(k[0].transpose(0, 1), cos, sin).transpose(0, 1)
    torch.testing.assert_close(mq @ mk.transpose(-1, -2), hq[0] @ hk[0].transpose(-1, -2), rtol=1e-5, atol=1e-5)


def test_partial_rotary_rotates_the_first_dims_only_like_glm():
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeRotaryEmbedding, apply_rotary_pos_emb
    from transformers import AutoConfig
    cfg = AutoConfig.for_model("glm4_moe", hidden_size=64, num_attention_heads=4, head_dim=16,
                               rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5})
    q, k = torch.randn(1, 4, 6, 16), torch.randn(1, 2, 6, 16)
    cos_hf, sin_hf = Glm4MoeRotaryEmbedding(cfg)(q, torch.arange(6)[None])
    hq, hk = apply_rotary_pos_emb(q, k, cos_hf, sin_hf)
    inv_freq, scaling = rope_frequencies(cfg)
    assert inv_freq.shape == (4,)
    cos, sin = rope_cos_sin(torch.arange(6), inv_freq, scaling, torch.float32)
    torch.testing.assert_close(apply_rope(q[0].transpose(0, 1), cos, sin), hq[0].transpose(0, 1))
    torch.testing.assert_close(apply_rope(k[0].transpose(0, 1), cos, sin), hk[0].transpose(0, 1))


ROUTER = dict(hidden_size=64, num_experts_per_tok=3, routed_scaling_factor=2.5, n_group=4, topk_group=2,
              num_attention_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)


@pytest.mark.parametrize("family,kw", [
    ("deepseek_v2", dict(n_routed_experts=16, topk_method="greedy")),
    ("deepseek_v2", dict(n_routed_experts=16, topk_method="group_limited_greedy")),
    ("deepseek_v3", dict(n_routed_experts=16, norm_topk_prob=True)),
    ("deepseek_v3", dict(n_routed_experts=16, norm_topk_prob=False)),
    ("glm4_moe", dict(n_routed_experts=16, norm_topk_prob=True, head_dim=16)),
    ("glm4_moe_lite", dict(n_routed_experts=16, norm_topk_prob=True)),
    ("minimax_m2", dict(num_local_experts=16, head_dim=16)),
])
def test_router_matches_transformers(family, kw):
    import importlib
    from transformers import AutoConfig
    cfg = AutoConfig.for_model(family, **{**ROUTER, **kw})
    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    cls = next(getattr(mod, n) for n in dir(mod) if n.endswith(("TopkRouter", "TopKRouter")))
    hf = _randomise(cls(cfg))
    bias = None
    if hasattr(hf, "e_score_correction_bias") or family == "minimax_m2":
        bias = 0.5 * torch.randn(16)                  # non-zero: selection differs from the weights' order
        if family != "minimax_m2":
            hf.e_score_correction_bias.copy_(bias)
    h = torch.randn(50, 64)
    with torch.no_grad():
        _, hf_weights, hf_ids = hf(h, bias) if family == "minimax_m2" else hf(h)
    router = GroupedRouter.from_config(cfg)
    weights, ids = router.route(h, hf.weight.detach(), bias)
    order, hf_order = ids.sort(-1).indices, hf_ids.sort(-1).indices
    assert torch.equal(ids.gather(1, order), hf_ids.gather(1, hf_order))
    torch.testing.assert_close(weights.gather(1, order), hf_weights.gather(1, hf_order), rtol=1e-6, atol=1e-7)
    if router.num_groups > 1:                         # chosen experts lie in at most topk_group groups
        assert all(len(set((row // 4).tolist())) <= 2 for row in ids)
    torch.testing.assert_close(router.route(h, hf.weight.detach(), bias)[0], weights)   # pure: same input, same route


def test_unknown_v2_topk_method_is_refused_in_one_sentence():
    from transformers import AutoConfig
    from engine.errors import SluiceError
    cfg = AutoConfig.for_model("deepseek_v2", **{**ROUTER, "n_routed_experts": 16, "topk_method": "noaux_tc"})
    with pytest.raises(SluiceError, match="topk_method 'noaux_tc'"):
        GroupedRouter.from_config(cfg)
