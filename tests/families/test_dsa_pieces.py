"""DeepSeek Sparse Attention's pieces (engine.model.dsa): the lightning indexer's selection against transformers'
own indexer modules (DeepSeek-V3.2: rope in halves; GLM-5: in pairs), a decode row equal to the prompt's, and the
mixer's one-token step over the static state the CUDA graphs use (full size, start unknown) equal to the growing
state's (float32, random weights)."""
import pytest
import torch

from engine.model.block import Rope, Step
from engine.model.dsa import DsaMixer, Indexer, IndexerShape
from engine.model.layers import rope_cos_sin
from engine.model.mla import MlaAttention, MlaShape
from engine.model.rotary import rope_frequencies
from engine.model.state import ModelState

CONFIG = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=24,
              qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, num_hidden_layers=1, vocab_size=32,
              max_position_embeddings=4096, index_topk=5, index_head_dim=16, index_n_heads=8, n_routed_experts=8,
              rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                               "original_max_position_embeddings": 64, "mscale": 0.707, "mscale_all_dim": 0.707})
PREFIXES = {"deepseek_v32": "DeepseekV32", "glm_moe_dsa": "GlmMoeDsa"}
T = 13          # positions: more than index_topk, so most queries see fewer keys than they could


def _transformers(family):
    import importlib

    from transformers import AutoConfig
    cfg = AutoConfig.for_model(family, **CONFIG)
    cfg._attn_implementation = "eager"
    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    torch.manual_seed(0)
    attn = getattr(mod, PREFIXES[family] + "Attention")(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for name, p in attn.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight") else torch.randn_like(p) * 0.3)
    return cfg, attn, getattr(mod, PREFIXES[family] + "RotaryEmbedding")(cfg)


def _weights(module, prefix=""):
    return {k[len(prefix):]: v.detach() for k, v in module.state_dict().items() if k.startswith(prefix)}


@pytest.mark.parametrize("family", PREFIXES)
def test_indexer_selects_the_keys_transformers_selects(family):
    cfg, attn, rotary = _transformers(family)
    x, positions = torch.randn(T, 64), torch.arange(T)
    q_residual = attn.q_a_layernorm(attn.q_a_proj(x)).detach()
    mask = torch.full((T, T), float("-inf")).triu(1)[None]                                 # [1, T, T]
    with torch.no_grad():
        picked = attn.indexer(x[None], q_residual[None], rotary(x[None], positions[None]), mask, positions[None])[0]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    expected = torch.zeros(T, T, dtype=torch.bool).scatter(1, picked.long(), True) & causal

    indexer = Indexer(IndexerShape.from_config(cfg), _weights(attn, "indexer."))
    inv_freq, scaling = rope_frequencies(cfg)
    cos, sin = rope_cos_sin(positions, inv_freq, scaling, torch.float32)
    with torch.no_grad():
        keys = indexer.keys(x, cos, sin)
        visible = indexer.select(x, q_residual, keys, positions, cos, sin)
        last = indexer.select(x[-1:], q_residual[-1:], keys, positions[-1:], cos[-1:], sin[-1:])   # a decode step
    assert torch.equal(visible, expected)
    assert torch.equal(last, visible[-1:])
    assert visible.sum(1).tolist() == [min(p + 1, 5) for p in range(T)]             # the top 5 once 5 are visible


@pytest.mark.parametrize("length,prompt", [(T, 7), (T, 2), (300, 295)])   # 2: fewer keys than top_k; 300: two chunks
@pytest.mark.parametrize("family", PREFIXES)
def test_prompt_and_one_token_steps_match_transformers_over_the_static_and_the_growing_state(family, length, prompt):
    """A prompt, then one-token steps (latent-space attention over the selected keys), against transformers'
    attention on the whole sequence; and the CUDA graphs' layout on the CPU: the state at full size (zeros past
    the position) and no host-known start, where the indexer's top-k runs over every row and never picks a masked
    one."""
    cfg, attn, rotary = _transformers(family)
    x = torch.randn(length, 64)
    mask = torch.full((length, length), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        expected = attn(x[None], rotary(x[None], torch.arange(length)[None]), mask)[0][0]      # [T, D]
    inv_freq, scaling = rope_frequencies(cfg)
    indexer = Indexer(IndexerShape.from_config(cfg), _weights(attn, "indexer."))
    mixer = DsaMixer(0, MlaAttention(MlaShape.from_config(cfg), _weights(attn)), Rope(inv_freq, scaling, torch.float32),
                     indexer, 0)
    growing = ModelState([mixer.state_specs()], 320, torch.float32, torch.device("cpu"), static=False, initial_tokens=4)
    static = ModelState([mixer.state_specs()], 320, torch.float32, torch.device("cpu"), static=True)
    with torch.no_grad():
        outs = {}
        for name, state in (("growing", growing), ("static", static)):
            steps = [mixer(x[:prompt], Step(torch.arange(prompt), 0, state))]
            for p in range(prompt, length):
                steps.append(mixer(x[p:p + 1], Step(torch.tensor([p]), p if name == "growing" else None, state)))
            outs[name] = torch.cat(steps)
    torch.testing.assert_close(outs["growing"], expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs["static"], outs["growing"], rtol=1e-5, atol=1e-5)
    assert static.buffers[0]["index_k"].shape == (320, 16) and growing.buffers[0]["index_k"].shape[0] >= length
