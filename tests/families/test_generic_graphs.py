"""The generic path's decode as CUDA graph segments (engine.model.generic.graphs): which families it captures (a rule
read from the config), and on the CPU the static-cache forward those graphs replay, token-exact with transformers."""
import pytest
import torch

import engine
from engine import GenerationParams
from engine.model.families import FAMILIES, Family
from engine.model.generic.graphs import cache_bytes, graph_blocker
from engine.model.state import state_bytes
from engine.model.spec import read_spec
from tests.engine.reference import load_reference, reference_greedy
from tests.families.generic_models import build_generic_model, built_once
from tests.families.tokens import NEW_TOKENS, PROMPT_IDS

CAPTURED = ["hy_v3", "solar_open", "phimoe", "granitemoe"]


@pytest.fixture(scope="module")
def generic_models(tmp_path_factory):
    return built_once(tmp_path_factory.mktemp("generic"), build_generic_model)


@pytest.mark.parametrize("family,blocker", [
    *[(family, None) for family in CAPTURED],
    ("afmoe", "its cache has sliding_attention layers"),
    ("lfm2_moe", "its cache has conv layers"),
    ("kimi_linear", "its cache has linear_attention layers"),
    ("longcat_flash", "its identity experts pick the routed tokens on the host"),
])
def test_a_family_is_captured_only_where_its_decode_has_no_step_dependent_host_flow(family, blocker, generic_models):
    spec = read_spec(generic_models(family)[0])
    assert graph_blocker(spec.generic, spec.cfg.get_text_config(decoder=True)) == blocker


def test_an_indexed_attention_family_decodes_eagerly(tmp_path):
    """GLM-5-Next's text part (DeepSeek-V3.2 and GLM-5 are native now): its indexer's selection is per step."""
    from tests.families.generic_models import build_vl_model
    spec = read_spec(build_vl_model("glm5_next", tmp_path / "g5"))
    assert graph_blocker(spec.generic, spec.cfg.get_text_config(decoder=True)) == \
        "its cache has indexed_attention, linear_attention layers"


def test_experts_on_scaled_inputs_and_position_dependent_ropes_decode_eagerly(tmp_path, monkeypatch):
    monkeypatch.setitem(FAMILIES, "llama4_text", Family("llama4_text", "generic"))
    spec = read_spec(build_generic_model("llama4_text", tmp_path / "l4"))
    assert "scaled" in graph_blocker(spec.generic, spec.cfg.get_text_config(decoder=True))
    spec = read_spec(build_generic_model("hy_v3", tmp_path / "hy"))
    text = spec.cfg.get_text_config(decoder=True)
    text.rope_parameters = dict(text.rope_parameters, rope_type="dynamic", factor=2.0)
    assert graph_blocker(spec.generic, text) == "its dynamic rope depends on the position"


@pytest.mark.parametrize("family", ["hy_v3", "solar_open"])
def test_the_static_cache_decode_matches_transformers(family, generic_models):
    """The forward the graphs capture (a static cache, its length grown in place), run eagerly on the CPU: two
    conversations, the second's prompt copied over the first's keys; the cache holds what the budget counts."""
    hf_dir, model_dir = generic_models(family)
    eng = engine.load(model_dir, dtype="float32")
    try:
        model = eng.runner.model
        assert model.use_static_decode(64, kv_bytes=2**30)
        params = GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0)
        runs = [[e.token_id for e in eng.generate(prompt, params)] for prompt in (PROMPT_IDS, PROMPT_IDS[3:])]
        assert model._cache is model._static
        assert cache_bytes(model._static) == state_bytes(model.state_specs(), 64, torch.float32)
    finally:
        eng.close()
    reference = load_reference(hf_dir, "bf16")
    assert runs == [reference_greedy(reference, prompt, NEW_TOKENS) for prompt in (PROMPT_IDS, PROMPT_IDS[3:])]


def test_the_segments_split_at_each_moe_layer_and_end_with_the_logits(generic_models):
    """The capture's plan, walked without recording (its warm-up): one segment before each MoE layer's experts, with
    that layer's static inputs and the next MoE layer's guesses, and a last one whose output is the logits."""
    from engine.model.generic.graphs import SegmentCapture
    _, model_dir = generic_models("solar_open")
    eng = engine.load(model_dir, dtype="float32")
    try:
        model, spec = eng.runner.model, eng.spec
        assert model.use_static_decode(16, kv_bytes=2**30)
        walk = SegmentCapture()
        logits = model._captured_step(walk)
        segments = walk.finish()
    finally:
        eng.close()
    moe = list(spec.moe_layers)
    assert [s.layer for s in segments] == moe + [None] and logits.shape == (spec.vocab_size,)
    assert [s.next_layer for s in segments[:-1]] == moe[1:] + [None]
    for s, layer in zip(segments[:-1], moe):
        assert s.x.shape == s.out.shape == (1, spec.hidden_size) and s.weights.shape == (1, spec.top_k)
        assert len(s.ids) == spec.top_k * (2 if layer != moe[-1] else 1)      # routed, then the next layer's guesses
