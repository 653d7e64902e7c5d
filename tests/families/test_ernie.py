"""ERNIE-4.5-MoE (ernie4_5_moe) natively: token-exact while experts stream, with its interleaved rope (de-interleaved
q/k rows at load), the softmax router's non-zero correction bias, a shared expert, a dense first layer and tied
embeddings (engine.tools.demo.FAMILY_KWARGS)."""
import json

import pytest

from engine.errors import SluiceError
from engine.model.families import FAMILIES, GENERIC_FAMILIES
from engine.model.spec import read_spec
from tests.families.tokens import assert_streamed_tokens_match


@pytest.mark.parametrize("quant", ["bf16", "int8"])
def test_greedy_tokens_match_transformers(quant, hf_models, sluice_models):
    assert_streamed_tokens_match(hf_models("ernie4_5_moe"), sluice_models("ernie4_5_moe", quant), quant)


def test_ernie_runs_natively():
    assert FAMILIES["ernie4_5_moe"].path == "native" and "ernie4_5_moe" not in GENERIC_FAMILIES


def test_the_estimate_counts_parameters_as_transformers_does_from_the_hub_config(hf_models):
    """From config.json as the Hub ships it (moe_k, moe_num_experts; no num_experts_per_tok)."""
    from transformers import AutoModelForCausalLM

    from engine.plan.estimate import model_shape
    hf_dir = hf_models("ernie4_5_moe")
    shape = model_shape(json.loads((hf_dir / "config.json").read_text()))
    assert shape.total_params == AutoModelForCausalLM.from_pretrained(str(hf_dir)).num_parameters()
    assert (shape.num_moe_layers, shape.num_experts, shape.top_k) == (2, 16, 3)


@pytest.mark.parametrize("schedule,moe_layers", [
    (dict(moe_layer_start_index=1), (1, 2, 3, 4, 5)),
    (dict(moe_layer_start_index=0, moe_layer_interval=2), (1, 3, 5)),
    (dict(moe_layer_start_index=2, moe_layer_end_index=4), (2, 3, 4)),
])
def test_moe_layers_follow_start_end_and_interval(schedule, moe_layers):
    config = dict(model_type="ernie4_5_moe", num_hidden_layers=6, **schedule)
    assert read_spec(config).moe_layers == moe_layers


def test_projection_biases_are_refused_in_one_sentence():
    with pytest.raises(SluiceError, match=r"^This ERNIE-4.5 model has biases in its projections \(use_bias\)"):
        read_spec(dict(model_type="ernie4_5_moe", use_bias=True))
