"""DeepSeek-V4 through the user's path: repack, Engine.load(...).generate(...) with experts streaming
(RAM cache and device slots smaller than the expert set), greedy tokens equal to transformers (float32)."""
import pytest
import torch

from engine import GenerationParams
from engine.errors import SluiceError
from engine.format.checkpoint import Checkpoint
from tests.engine.reference import load_reference, reference_greedy
from tests.families.dsv4_checkpoint import CSA, HCA, SLIDING, build_dsv4, quantize_like_flash
from tests.streaming.sized import streaming_engine

PROMPT = [(i * 37) % 300 + 3 for i in range(21)]     # 21: a CSA and an HCA window left open at prefill's end
NEW_TOKENS = 30


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return build_dsv4(tmp_path_factory.mktemp("dsv4") / "hf", seed=2)


@pytest.mark.parametrize("quant", ["bf16", "fp8"])
def test_greedy_tokens_equal_transformers_while_streaming(hf_dir, tmp_path, quant):
    from engine.format.repack import repack
    model_dir = repack(hf_dir, tmp_path / quant, quant=quant)
    eng = streaming_engine(model_dir)
    tokens = [e.token_id for e in eng.generate(PROMPT, GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0))]
    expected = reference_greedy(load_reference(hf_dir, quant), PROMPT, NEW_TOKENS)
    assert tokens == expected
    t = eng.telemetry()
    assert t["ram_cache"]["evictions"] > 0 and t["disk"]["bytes_read"] > eng.model.expert_bytes_total
    eng.close()


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [False, True])
def test_greedy_tokens_equal_transformers_on_the_gpu(hf_dir, tmp_path, eager):
    """float32 on CUDA, experts streaming through the slot banks: the decode step in CUDA graphs (the compressors'
    rings and entries static, windows closing at device positions) with the Triton MoE kernels (clamped silu),
    and the eager torch path."""
    from engine.format.repack import repack
    from engine.options import Options
    eng = streaming_engine(repack(hf_dir, tmp_path / "bf16", quant="bf16"), device="cuda", dtype="float32",
                           options=Options(eager=eager))
    assert eng.runner.step.use_graphs != eager and (eng.runner.experts.compute.kernel is None) == eager
    tokens = [e.token_id for e in eng.generate(PROMPT, GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0))]
    assert tokens == reference_greedy(load_reference(hf_dir), PROMPT, NEW_TOKENS)
    assert eng.telemetry()["ram_cache"]["evictions"] > 0
    eng.close()


@pytest.mark.gpu
def test_decode_in_cuda_graphs_outpaces_the_eager_step(tmp_path, monkeypatch):
    """Middle-sized layers with Flash's windows (sliding 128, CSA every 4, HCA every 128), 128 tokens decoded after
    128 (a CSA window closing every 4 steps, an HCA window at the last), in CUDA graphs and in the eager step."""
    from engine.format.repack import repack
    from engine.model.families.deepseek_v4 import Dsv4Model
    from tests.families.test_generic_gpu import _decode_tok_s
    hf = build_dsv4(tmp_path / "hf", seed=2, with_tokenizer=False, hidden_size=1024, num_hidden_layers=8,
                    num_attention_heads=16, head_dim=128, q_lora_rank=256, o_lora_rank=128, o_groups=4,
                    moe_intermediate_size=256, n_routed_experts=32, num_experts_per_tok=6, sliding_window=128,
                    index_topk=16, index_head_dim=64, compress_rates={CSA: 4, HCA: 128},
                    layer_types=[SLIDING, CSA, HCA, CSA] * 2, mlp_layer_types=["hash_moe"] * 2 + ["moe"] * 6,
                    max_position_embeddings=4096,
                    rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32, "beta_slow": 1,
                                     "original_max_position_embeddings": 1024})
    model_dir = repack(hf, tmp_path / "sluice")
    graphs = _decode_tok_s(model_dir)
    monkeypatch.setattr(Dsv4Model, "graph_safe", False)
    eager = _decode_tok_s(model_dir)
    print(f"deepseek_v4 decode (8 layers of 1024, bf16): CUDA graphs {graphs:.1f} tok/s, eager step {eager:.1f} tok/s")
    assert graphs > eager


def test_flash_formats_fp8_dense_and_fp4_experts_equal_transformers(tmp_path):
    """A checkpoint as DeepSeek-V4-Flash ships (FP8 ue8m0-block linears under `.scale`, FP4 experts), read
    by transformers' own loader for the reference; the bf16 repack holds those values exactly."""
    from engine.format.repack import repack
    hf_dir = quantize_like_flash(build_dsv4(tmp_path / "flash", seed=4))
    eng = streaming_engine(repack(hf_dir, tmp_path / "bf16", quant="bf16"))
    tokens = [e.token_id for e in eng.generate(PROMPT, GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0))]
    reference = load_reference(hf_dir)
    assert tokens == reference_greedy(reference, PROMPT, NEW_TOKENS)
    eng.close()
    ckpt = Checkpoint(hf_dir)                       # the dequantised values themselves, not only the tokens
    layer = reference.model.layers[3]
    assert "embed.weight" in ckpt and "layers.3.ffn.experts.5.w1.scale" in ckpt      # DeepSeek's own names
    gate_up = torch.cat([ckpt.get_float(f"layers.3.ffn.experts.5.{p}.weight") for p in ("w1", "w3")])
    assert torch.equal(gate_up, layer.mlp.experts.gate_up_proj[5].detach())
    assert torch.equal(ckpt.get_float("layers.3.attn.wo_a.weight"), layer.self_attn.o_a_proj.weight.detach())


def test_refuses_unknown_layer_kinds_in_one_sentence(hf_dir):
    import json
    from engine.model.spec import read_spec
    config = json.loads((hf_dir / "config.json").read_text())
    with pytest.raises(SluiceError, match="layer_types"):
        read_spec({**config, "layer_types": ["full_attention"] * config["num_hidden_layers"]})
    with pytest.raises(SluiceError, match="softmax"):
        read_spec({**config, "scoring_func": "softmax"})


def test_flash_fp4_experts_repack_to_mxfp4_byte_for_byte_and_equal_transformers(tmp_path):
    """V4-Flash's FP4 experts (e2m1 pairs, an e8m0 scale per 32) are mxfp4 already: `--quant mxfp4`
    copies their bytes into the blocks, and the tokens are transformers' own on that checkpoint."""
    from engine.format.modeldir import open_model_dir
    from engine.format.repack import repack
    hf_dir = quantize_like_flash(build_dsv4(tmp_path / "flash", seed=4))
    model_dir = repack(hf_dir, tmp_path / "mxfp4", quant="mxfp4")
    md, ckpt = open_model_dir(model_dir), Checkpoint(hf_dir)
    layer = md.spec.moe_layers[-1]
    with open(md.path / "experts.bin", "rb") as f:
        f.seek(md.expert_offset(layer, 5))
        block = torch.frombuffer(bytearray(f.read(md.layout.block_bytes)), dtype=torch.uint8)
    views = md.layout.views(block)
    for proj, name in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
        stored = ckpt.get(f"layers.{layer}.ffn.experts.5.{name}.weight").view(torch.uint8)
        assert torch.equal(views[f"{proj}.w"].reshape(stored.shape), stored)
    eng = streaming_engine(model_dir)
    tokens = [e.token_id for e in eng.generate(PROMPT, GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0))]
    eng.close()
    assert tokens == reference_greedy(load_reference(hf_dir), PROMPT, NEW_TOKENS)


def test_the_graph_shaped_decode_step_gathers_the_indexers_entries_as_transformers_selects(hf_dir, tmp_path):
    """The CUDA graphs' step run eagerly on the CPU: the state static at full size and no host-known position, so
    a CSA layer scores every entry row the state holds and gathers its top_k (fewer valid than top_k at first,
    then more). A 5-token prompt, then 40 forced tokens: every step's logits are transformers' over the whole
    sequence."""
    from engine.format.repack import repack
    from engine.model.state import ModelState
    from engine.runtime.decode_step import DecodeStep
    eng = streaming_engine(repack(hf_dir, tmp_path / "m", quant="bf16"), device="cpu", dtype="float32")
    runner = eng.runner
    runner.state = ModelState(runner.model.state_specs(), 96, torch.float32, runner.device, static=True)
    runner.step = DecodeStep(runner.model, runner.state, runner.device)
    runner.step.use_graphs = True                        # as on CUDA: the step's position stays on the device
    prompt, forced = PROMPT[:5], [(i * 53) % 300 + 3 for i in range(40)]
    with torch.inference_mode():
        ours = [runner.prefill(prompt).clone()]
        ours += [runner.decode(token, len(prompt) + i).clone() for i, token in enumerate(forced)]
        theirs = load_reference(hf_dir)(torch.tensor([prompt + forced])).logits[0, len(prompt) - 1:]
    torch.testing.assert_close(torch.stack(ours), theirs, rtol=1e-4, atol=1e-4)
    assert torch.equal(torch.stack(ours).argmax(-1), theirs.argmax(-1))
    eng.close()
