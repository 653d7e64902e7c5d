"""Model-type aliases: a text-only checkpoint of a supported family (`qwen3_5_moe_text`, as transformers' causal
LM of Qwen3.5 saves it) runs as its family does, and a vision-language checkpoint's language model runs
generically (its vision tower neither repacked nor loaded, an image refused in one sentence); token-exact while
experts stream."""
import pytest
import torch
from safetensors import safe_open

import engine
from engine import SluiceError
from engine.format.repack import repack
from engine.model.families import FAMILIES, GENERIC_VL_FAMILIES
from tests.families.generic_models import build_vl_model, built_once, vl_reference_greedy, vl_streamed_tokens
from tests.families.hybrid_models import QWEN3_5_TEXT, _random_like
from tests.families.tokens import NEW_TOKENS, PROMPT_IDS, assert_streamed_tokens_match


def build_qwen3_5_text(dst):
    from transformers import AutoConfig, AutoModelForCausalLM
    from engine.tools.demo import train_tiny_tokenizer
    dst.mkdir(parents=True)
    train_tiny_tokenizer(dst)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3_5_moe_text", **QWEN3_5_TEXT))
    torch.manual_seed(2)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(_random_like(name, param))
    model.eval().to(torch.bfloat16).save_pretrained(str(dst))
    return dst


def test_a_qwen3_5_text_checkpoint_runs_as_qwen3_5(tmp_path):
    hf_dir = build_qwen3_5_text(tmp_path / "hf")
    model_dir = repack(hf_dir, tmp_path / "sluice")
    assert_streamed_tokens_match(hf_dir, model_dir, "bf16")


def test_the_estimate_counts_a_qwen3_5_text_checkpoint_as_its_model(tmp_path):
    import json

    from engine.plan.estimate import model_shape
    hf_dir = build_qwen3_5_text(tmp_path / "hf")
    from transformers import AutoModelForCausalLM
    params = AutoModelForCausalLM.from_pretrained(str(hf_dir)).num_parameters()
    assert model_shape(json.loads((hf_dir / "config.json").read_text())).total_params == params


@pytest.fixture(scope="module")
def vl_models(tmp_path_factory):
    return built_once(tmp_path_factory.mktemp("vl"), build_vl_model)


@pytest.mark.parametrize("family", GENERIC_VL_FAMILIES)
def test_a_vision_language_checkpoints_language_model_runs_token_exact(family, vl_models):
    hf_dir, model_dir = vl_models(family)
    with safe_open(str(model_dir / "dense.safetensors"), "pt") as f:       # no vision tower
        assert all(n.startswith((FAMILIES[family].text_prefix, "lm_head.")) for n in f.keys())
    ours, evictions = vl_streamed_tokens(model_dir, PROMPT_IDS, NEW_TOKENS)
    assert ours == vl_reference_greedy(hf_dir, PROMPT_IDS, NEW_TOKENS) and evictions > 0


def test_an_image_sent_to_a_vision_language_checkpoint_gets_one_sentence(vl_models):
    _, model_dir = vl_models("qwen3_vl_moe")
    eng = engine.load(model_dir)
    message = {"role": "user", "content": [{"type": "text", "text": "what is this?"}, {"type": "image", "url": "a.png"}]}
    try:
        with pytest.raises(SluiceError, match="Images are not supported: Sluice runs the text part of this model only"):
            list(eng.generate([message]))
    finally:
        eng.close()
