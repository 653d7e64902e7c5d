"""DeepSeek-V2, V2-Lite and V3 (Kimi-K2's architecture): token-exact with transformers while experts stream.

The random checkpoints switch every quirk on (engine.tools.demo.FAMILY_KWARGS): MLA with and without
q LoRA, YaRN with mscale, a dense first layer, two shared experts, 4 expert groups of which 2 stay,
V3's non-zero correction bias.
"""
import pytest

from engine.format.repack import repack
from engine.tools.demo import build_hf_model
from tests.families.tokens import assert_streamed_tokens_match

V2_LITE = dict(q_lora_rank=None, topk_method="greedy", n_group=None, topk_group=None, routed_scaling_factor=1.0)


@pytest.fixture(scope="module")
def v2_lite(tmp_path_factory):
    return build_hf_model("deepseek_v2", tmp_path_factory.mktemp("v2lite") / "hf", seed=3, **V2_LITE)


@pytest.mark.parametrize("quant", ["bf16", "fp8", "nvfp4"])
@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3"])
def test_greedy_tokens_match_transformers(family, quant, hf_models, sluice_models):
    assert_streamed_tokens_match(hf_models(family), sluice_models(family, quant), quant)


@pytest.mark.parametrize("quant", ["bf16", "nvfp4"])
def test_v2_lite_without_q_lora_matches_transformers(quant, v2_lite, tmp_path):
    assert_streamed_tokens_match(v2_lite, repack(v2_lite, tmp_path / quant, quant=quant), quant)
