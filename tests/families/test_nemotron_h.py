"""Nemotron-H natively (families.nemotron_h): token-exact with transformers while experts stream (float32 on the CPU,
24 tokens), with Mamba-2, attention (no rope), MoE (ungated relu² experts, a shared expert, expert groups, a
correction bias, scaling) and relu² MLP layers; prompts under one scan chunk and across three (chunk_size 16)."""
import json
import re

import pytest

import engine
from engine.errors import SluiceError
from engine.format.repack import repack
from engine.model.families import FAMILIES, GENERIC_FAMILIES
from engine.model.spec import read_spec
from tests.engine.reference import load_reference, reference_greedy
from tests.families.generic_models import build_generic_model, built_once
from tests.families.tokens import NEW_TOKENS, assert_streamed_tokens_match
from tests.streaming.sized import streaming_engine, token_ids

# the Hub's pattern string instead of the list (attention first; an MLP between MoE layers), one Mamba group
VARIANTS = {
    "layers": {},
    "pattern": dict(layers_block_type=None, hybrid_override_pattern="*ME-ME", n_groups=1, num_hidden_layers=6),
}
LONG_PROMPT = [(i * 37) % 390 + 3 for i in range(40)]       # scan chunks of 16, 16 and 8


@pytest.fixture(scope="module")
def nemotron_models(tmp_path_factory):
    return built_once(tmp_path_factory.mktemp("nemotron_h"),
                      lambda variant, dst: build_generic_model("nemotron_h", dst, **VARIANTS[variant]))


def test_nemotron_h_runs_natively_on_sluices_blocks(nemotron_models):
    from engine.model.families.nemotron_h import Mamba2Mixer, PlainAttention
    assert FAMILIES["nemotron_h"].path == "native" and "nemotron_h" not in GENERIC_FAMILIES
    _, model_dir = nemotron_models("pattern")
    eng = engine.load(model_dir)
    try:
        kinds = [type(b.mixer).__name__ if b.mixer else "moe" if b.is_moe else "mlp" for b in eng.runner.model.blocks]
    finally:
        eng.close()
    assert kinds == [PlainAttention.__name__, Mamba2Mixer.__name__, "moe", "mlp", Mamba2Mixer.__name__, "moe"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_tokens_match_transformers_while_experts_stream(variant, nemotron_models):
    hf_dir, model_dir = nemotron_models(variant)
    assert_streamed_tokens_match(hf_dir, model_dir, "bf16")


def test_a_prompt_across_scan_chunks_then_a_fresh_conversation(nemotron_models):
    """Prefill scans 40 tokens in three chunks; the next conversation starts from zero Mamba states."""
    hf_dir, model_dir = nemotron_models("layers")
    eng = streaming_engine(model_dir)
    try:
        ours = token_ids(eng, LONG_PROMPT, NEW_TOKENS)
        again = token_ids(eng, LONG_PROMPT, NEW_TOKENS)
        misses = eng.telemetry()["ram_cache"]["misses"]
    finally:
        eng.close()
    assert ours == reference_greedy(load_reference(hf_dir), LONG_PROMPT, NEW_TOKENS)
    assert again == ours and misses > 0


def test_int8_experts_match_transformers_on_the_same_rounded_weights(nemotron_models, tmp_path):
    hf_dir, _ = nemotron_models("layers")
    assert_streamed_tokens_match(hf_dir, repack(hf_dir, tmp_path / "sluice", quant="int8"), "int8")


def test_experts_fused_as_transformers_holds_them_repack_alike(nemotron_models, tmp_path):
    """A checkpoint saved with its experts fused (`mixer.experts.up_proj` [E, I, H], `down_proj` [E, H, I]) gives
    the tokens of the Hub's per-expert tensors."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    hf_dir, _ = nemotron_models("layers")
    fused_dir = tmp_path / "fused"
    shutil.copytree(hf_dir, fused_dir)
    tensors = load_file(str(fused_dir / "model.safetensors"))
    per_expert = re.compile(r"(.*\.experts)\.(\d+)\.(up|down)_proj\.weight")
    grouped: dict[str, dict[int, torch.Tensor]] = {}
    for name in [n for n in tensors if per_expert.fullmatch(n)]:
        prefix, expert, proj = per_expert.fullmatch(name).groups()
        grouped.setdefault(f"{prefix}.{proj}_proj", {})[int(expert)] = tensors.pop(name)
    assert len(grouped) == 4                                     # two MoE layers, up and down each
    tensors.update({name: torch.stack([w[e] for e in sorted(w)]) for name, w in grouped.items()})
    save_file(tensors, str(fused_dir / "model.safetensors"), metadata={"format": "pt"})
    assert_streamed_tokens_match(hf_dir, repack(fused_dir, tmp_path / "sluice"), "bf16")


def test_the_sluice_dir_names_the_text_model_as_every_family_does(nemotron_models):
    from safetensors import safe_open
    _, model_dir = nemotron_models("layers")
    with safe_open(str(model_dir / "dense.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "model.layers.0.mixer.A_log"} <= names
    assert not any(n.startswith("backbone.") or ".experts." in n for n in names)


@pytest.mark.parametrize("config,sentence", [
    ({"moe_latent_size": 1024}, "experts work in a latent width apart from the hidden size (moe_latent_size)"),
    ({"mlp_bias": True}, "has projection biases (mlp_bias)"),
    ({"mamba_hidden_act": "gelu"}, "uses mamba_hidden_act 'gelu'"),
])
def test_variants_it_cannot_run_exactly_are_refused_from_the_config(config, sentence):
    with pytest.raises(SluiceError, match=re.escape(sentence)) as refusal:
        read_spec({"model_type": "nemotron_h", **config})
    assert "\n" not in str(refusal.value)


def test_the_estimate_counts_the_parameters_as_transformers_holds_them(nemotron_models):
    """Every tensor of transformers' model (the routers' correction biases included) and ungated experts of two
    projections."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from engine.plan.estimate import expert_block_bytes, model_shape
    hf_dir, model_dir = nemotron_models("pattern")
    shape = model_shape(json.loads((hf_dir / "config.json").read_text()))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(hf_dir)))
    assert shape.total_params == sum(t.numel() for t in model.state_dict().values())
    assert shape.num_moe_layers == 2 and shape.num_experts == 8 and shape.num_layers == 6
    assert not shape.has_expert_gate and shape.expert_params == 2 * shape.hidden * shape.expert_intermediate
    layers = json.loads((model_dir / "sluice.json").read_text())["experts"]["layers"]
    assert {entry["block_bytes"] for entry in layers.values()} == {expert_block_bytes(shape, "bf16")}


def test_the_estimates_state_equals_the_runtimes(nemotron_models):
    """Fixed Mamba-2 state (conv window, float32 ssm) plus K/V for the attention layer alone."""
    import torch

    from engine.model.families import nemotron_h
    from engine.model.state import state_bytes
    _, model_dir = nemotron_models("pattern")
    eng = engine.load(model_dir)
    try:
        runtime = eng.runner.model.state_specs()
    finally:
        eng.close()
    specs = nemotron_h.state_specs(eng.spec)
    assert specs == runtime
    assert state_bytes(specs, 1, torch.bfloat16) - state_bytes(specs, 0, torch.bfloat16) == 2 * 2 * 16 * 2   # K, V
    assert [sorted(s) for s in specs] == [["k", "v"], ["conv", "ssm"], [], [], ["conv", "ssm"], []]


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["bf16", "int8"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_cuda_float32_tokens_match_transformers(variant, quant, tmp_path):
    hf_dir = build_generic_model("nemotron_h", tmp_path / "hf", **VARIANTS[variant])
    assert_streamed_tokens_match(hf_dir, repack(hf_dir, tmp_path / "sluice", quant=quant), quant, device="cuda",
                                 dtype="float32")


@pytest.mark.gpu
def test_cuda_graphed_decode_across_scan_chunks_matches_transformers(tmp_path):
    """The default CUDA path (float32): decode steps replayed as CUDA graphs, the Mamba-2 states updated in place."""
    hf_dir = build_generic_model("nemotron_h", tmp_path / "hf")
    eng = streaming_engine(repack(hf_dir, tmp_path / "sluice"), device="cuda", dtype="float32")
    try:
        ours = token_ids(eng, LONG_PROMPT, NEW_TOKENS)
        assert eng.runner.step.use_graphs
        assert token_ids(eng, LONG_PROMPT, NEW_TOKENS) == ours
    finally:
        eng.close()
    assert ours == reference_greedy(load_reference(hf_dir), LONG_PROMPT, NEW_TOKENS)


def test_int8_dense_weights_give_transformers_tokens_with_the_same_weights(nemotron_models, tmp_path):
    """Mamba's in/out projections, attention, the MLP and shared experts, the embedding and the head as int8; the
    routers, convs, A_log, D, dt_bias and norms exact. The estimate leaves exact what the runtime does."""
    import torch
    from safetensors import safe_open

    from engine.model.dense_quant import quantized_names
    from engine.plan.estimate import model_shape
    from tests.families.tokens import int8_dense_tokens
    hf_dir, _ = nemotron_models("pattern")
    model_dir = repack(hf_dir, tmp_path / "sluice", quant="int8")
    ours, theirs, reference = int8_dense_tokens(hf_dir, model_dir)
    with safe_open(str(model_dir / "dense.safetensors"), "pt") as f:
        stored = {n: f.get_slice(n).get_shape() for n in f.keys()}
    rounded = quantized_names("nemotron_h", dict(reference.named_parameters()))
    # embedding and head, q/k/v/o, two Mamba layers' in/out, the MLP's up/down, two shared experts' up/down
    assert len(quantized_names("nemotron_h", stored)) == len(rounded) == 2 + 4 + 2 * 2 + 2 + 2 * 2
    assert ours == theirs
    exact = sum(torch.Size(s).numel() for n, s in stored.items() if n not in quantized_names("nemotron_h", stored))
    assert model_shape(json.loads((hf_dir / "config.json").read_text())).exact_params == exact
