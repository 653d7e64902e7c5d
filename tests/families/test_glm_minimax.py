"""GLM-4.5..4.7 (glm4_moe), GLM-4.7-Flash (glm4_moe_lite, MLA) and MiniMax-M2: token-exact while experts stream.

Quirks on: partial rotary, per-head QK norm and qkv biases (GLM), QK norm over the whole projection
(MiniMax), sigmoid routing with a non-zero correction bias, expert groups, shared experts, a dense
first layer (engine.tools.demo.FAMILY_KWARGS).
"""
import pytest

from tests.families.tokens import assert_streamed_tokens_match


@pytest.mark.parametrize("quant", ["bf16", "fp8", "nvfp4"])
@pytest.mark.parametrize("family", ["glm4_moe", "glm4_moe_lite", "minimax_m2"])
def test_greedy_tokens_match_transformers(family, quant, hf_models, sluice_models):
    assert_streamed_tokens_match(hf_models(family), sluice_models(family, quant), quant)
