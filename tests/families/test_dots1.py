"""dots.llm1 (dots1) natively, as a DeepSeek-style family: token-exact while experts stream, with per-head QK norm,
qkv biases, a sliding window shorter than the prompt on the last layer, V3's grouped sigmoid router with a
non-zero correction bias, a shared expert and a dense first layer (engine.tools.demo.FAMILY_KWARGS)."""
import json

import pytest

from engine.model.families import FAMILIES, GENERIC_FAMILIES
from tests.families.tokens import assert_streamed_tokens_match


@pytest.mark.parametrize("quant", ["bf16", "int8"])
def test_greedy_tokens_match_transformers(quant, hf_models, sluice_models):
    assert_streamed_tokens_match(hf_models("dots1"), sluice_models("dots1", quant), quant)


def test_dots1_runs_natively():
    assert FAMILIES["dots1"].path == "native" and "dots1" not in GENERIC_FAMILIES


def test_the_estimate_counts_parameters_and_windows_as_transformers_does(hf_models):
    """Parameters as transformers' model holds them (the correction bias is a buffer: num_parameters() leaves it
    out, the checkpoint has it); the windows where transformers' layer_types put them."""
    from transformers import AutoModelForCausalLM

    from engine.model.spec import read_spec
    from engine.plan.estimate import model_shape
    hf_dir = hf_models("dots1")
    config = json.loads((hf_dir / "config.json").read_text())
    shape = model_shape(config)
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir))
    biases = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    assert shape.total_params == model.num_parameters() + biases and biases == 2 * 16
    assert shape.num_moe_layers == 2 and read_spec(config).sliding_windows == (None, None, 8)
