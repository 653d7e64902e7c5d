"""gpt-oss: its pieces against transformers' modules, then greedy tokens identical to transformers
(float32) while experts stream, in every expert format, and a native MXFP4 checkpoint (the Hub's
`*_blocks` / `*_scales`) repacked byte for byte and giving the tokens transformers gives on it."""
import json

import pytest
import torch

import engine
from engine import GenerationParams
from engine.format.layout import block_layout
from engine.format.repack import repack
from engine.model.families.gpt_oss import SWIGLU_ALPHA
from engine.model.gptoss import TopKSoftmaxRouter, clamped_swiglu_expert
from kernels.attention_ref import attention_ref
from engine.tools.demo import build_hf_model, write_mxfp4_checkpoint
from tests.engine.reference import load_reference, reference_greedy
from tests.streaming.sized import streaming_engine

PROMPT = [(i * 37) % 300 + 3 for i in range(20)]       # 20 tokens: longer than the window (8)
NEW_TOKENS = 24


def _config(**kw):
    from transformers import AutoConfig
    from engine.tools.demo import COMMON, FAMILY_KWARGS
    return AutoConfig.for_model("gpt_oss", **{**COMMON, **FAMILY_KWARGS["gpt_oss"], "num_hidden_layers": 2,
                                              "vocab_size": 64, **kw})


def test_sink_attention_equals_transformers_eager_attention():
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, eager_attention_forward
    g = torch.Generator().manual_seed(0)
    module = GptOssAttention(_config(), layer_idx=0)
    module.sinks.data = torch.randn(4, generator=g)                       # non-zero sinks
    T, window = 13, 5
    q, k, v = (torch.randn(1, heads, T, 16, generator=g) for heads in (4, 2, 2))
    pos = torch.arange(T)
    visible = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window)
    mask = torch.zeros(T, T).masked_fill(~visible, torch.finfo(torch.float32).min)[None, None]
    theirs, _ = eager_attention_forward(module, q, k, v, mask, scaling=16 ** -0.5)     # [1, T, Hq, D]
    ours = attention_ref(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), pos, window,
                         sinks=module.sinks)
    torch.testing.assert_close(ours, theirs.reshape(T, -1), rtol=1e-5, atol=1e-6)
    # a query may attend to "nothing": with a huge sink the output vanishes
    nothing = attention_ref(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), pos, None,
                            sinks=torch.full((4,), 80.0))
    assert nothing.abs().max() < 1e-20


def test_router_and_clamped_swiglu_expert_equal_transformers():
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts, GptOssTopKRouter
    g = torch.Generator().manual_seed(1)
    cfg = _config()
    router = GptOssTopKRouter(cfg)
    router.weight.data, router.bias.data = torch.randn(8, 64, generator=g), torch.randn(8, generator=g)
    h = torch.randn(9, 64, generator=g)
    _, their_weights, their_ids = router(h)
    weights, ids = TopKSoftmaxRouter(router.weight, router.bias, 2)(h)
    assert torch.equal(ids, their_ids)
    torch.testing.assert_close(weights, their_weights, rtol=1e-6, atol=1e-7)

    experts = GptOssExperts(cfg)
    for p in experts.parameters():
        p.data = torch.randn(p.shape, generator=g) * 0.5
    expert = 5
    theirs = experts(h, torch.full((9, 1), expert), torch.ones(9, 1))
    gate_up, gate_up_bias = experts.gate_up_proj[expert], experts.gate_up_proj_bias[expert]   # [H, 2I], [2I]
    w = {"gate": gate_up[:, 0::2].T, "up": gate_up[:, 1::2].T, "down": experts.down_proj[expert].T,
         "gate_bias": gate_up_bias[0::2], "up_bias": gate_up_bias[1::2], "down_bias": experts.down_proj_bias[expert]}
    ours = clamped_swiglu_expert(h, w, getattr(cfg, "swiglu_alpha", SWIGLU_ALPHA), cfg.swiglu_limit)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert (h @ w["gate"].T + w["gate_bias"]).max() > cfg.swiglu_limit          # the clamp really acts


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return build_hf_model("gpt_oss", tmp_path_factory.mktemp("gpt_oss") / "hf", num_layers=3)


@pytest.fixture(scope="module")
def mxfp4_dir(hf_dir):
    return write_mxfp4_checkpoint(hf_dir, hf_dir.parent / "hf-mxfp4")


def _generate_streaming(model_dir) -> list[int]:
    eng = streaming_engine(model_dir)
    ids = [e.token_id for e in eng.generate(PROMPT, GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0))]
    tel = eng.telemetry()
    assert tel["ram_cache"]["misses"] > 0 and tel["ram_cache"]["evictions"] > 0      # experts really streamed
    assert tel["ram_cache"]["capacity_bytes"] < eng.model.expert_bytes_total
    eng.close()
    return ids


@pytest.mark.parametrize("quant", ["bf16", "fp8", "nvfp4", "mxfp4"])
def test_greedy_tokens_match_transformers_while_streaming(quant, hf_dir, tmp_path):
    model_dir = repack(hf_dir, tmp_path / quant, quant=quant)
    assert _generate_streaming(model_dir) == reference_greedy(load_reference(hf_dir, quant), PROMPT, NEW_TOKENS)


def test_native_mxfp4_checkpoint_repacks_byte_identical_and_matches_transformers(hf_dir, mxfp4_dir, tmp_path,
                                                                                   monkeypatch):
    config = json.loads((mxfp4_dir / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "mxfp4"
    model_dir = repack(mxfp4_dir, tmp_path / "mx", quant="mxfp4")
    manifest = json.loads((model_dir / "sluice.json").read_text())
    assert "quantization_config" not in manifest["config"]

    # the blocks hold the checkpoint's own bytes: rows split into gate (even) and up (odd), nothing requantized
    from safetensors import safe_open
    layout = block_layout(64, 64, "mxfp4", bias=True)                     # intermediate 64, hidden 64
    with safe_open(str(mxfp4_dir / "model.safetensors"), "pt") as f:
        blocks = f.get_tensor("model.layers.1.mlp.experts.gate_up_proj_blocks")[3]     # expert 3: [2I, H/32, 16]
        scales = f.get_tensor("model.layers.1.mlp.experts.gate_up_proj_scales")[3]
        down_scales = f.get_tensor("model.layers.1.mlp.experts.down_proj_scales")[3]
    entry = manifest["experts"]["layers"]["1"]
    raw = (model_dir / "experts.bin").read_bytes()[entry["offset"] + 3 * entry["block_bytes"]:][:entry["block_bytes"]]
    views = layout.views(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    assert torch.equal(views["up.w"], blocks[1::2].reshape(64, -1)) and torch.equal(views["gate.scale"], scales[0::2])
    assert torch.equal(views["down.scale"], down_scales)

    # transformers dequantizes MXFP4 itself on the CPU (no Triton kernels here): its tokens are the target
    theirs = reference_greedy(load_reference(mxfp4_dir), PROMPT, NEW_TOKENS)
    assert _generate_streaming(model_dir) == theirs
    # the same checkpoint repacked to bf16 (dequantized by Sluice) gives them too
    assert _generate_streaming(repack(mxfp4_dir, tmp_path / "bf", quant="bf16")) == theirs
    # opened as a raw snapshot, it is repacked on the fly to mxfp4 (its own bytes), not inflated to bf16
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    eng = engine.load(mxfp4_dir)
    assert eng.model.quant == "mxfp4"
    assert [e.token_id for e in eng.generate(PROMPT, GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0))] == theirs
    eng.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("quant", ["bf16", "mxfp4"])
def test_greedy_tokens_match_transformers_on_the_gpu(quant, hf_dir, mxfp4_dir, tmp_path):
    """The H200 path (float32 compute, the Triton decode and prefill kernels with gpt-oss's biases and clamped
    SwiGLU, CUDA graphs)."""
    src = hf_dir if quant == "bf16" else mxfp4_dir
    model_dir = repack(src, tmp_path / quant, quant=quant)
    eng = engine.load(model_dir, device="cuda", dtype="float32")
    assert eng.runner.experts.compute.kernel is not None and eng.runner.experts.compute.prefill_kernel is not None
    ours = [e.token_id for e in eng.generate(PROMPT, GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0))]
    eng.close()
    assert ours == reference_greedy(load_reference(src), PROMPT, NEW_TOKENS)
