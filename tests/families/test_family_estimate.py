"""The estimate knows the DeepSeek-style families and ERNIE-4.5: parameters as transformers counts them (MLA, shared
experts, dense first layers, correction biases) and MLA's latent state bytes per token (the family's state specs, as the runtime holds them)."""
import pytest
import torch

from engine.model.families import family_module
from engine.model.spec import read_spec
from engine.model.state import state_bytes
from engine.plan.estimate import model_shape
from engine.tools.demo import COMMON, FAMILY_KWARGS
from engine.tools.presets import preset_config

FAMILIES = ["deepseek_v2", "deepseek_v3", "glm4_moe", "glm4_moe_lite", "minimax_m2", "dots1",
            "ernie4_5_moe"]


def _config(family):
    from transformers import AutoConfig
    return AutoConfig.for_model(family, **{**COMMON, **FAMILY_KWARGS[family], "num_hidden_layers": 3,
                                           "vocab_size": 400}).to_dict()


def _transformers_count(config):
    from transformers import AutoConfig, AutoModelForCausalLM
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "transformers_version")}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **fields))
    tensors = {id(t): t for t in model.state_dict(keep_vars=True).values()}       # a tied head once
    return sum(t.numel() for t in tensors.values())


@pytest.mark.parametrize("family", FAMILIES)
def test_parameter_count_matches_transformers(family):
    config = _config(family)
    assert model_shape(config).total_params == _transformers_count(config)


def test_deepseek_v2_lite_preset_is_the_real_15_7b_model():
    shape = model_shape(preset_config("deepseek-v2-lite"))
    assert round(shape.total_params / 1e9, 1) == 15.7 and shape.num_moe_layers == 26 and shape.top_k == 6
    assert 2.0e9 < shape.active_params < 3.0e9            # "2.4B active" with the shared experts and the dense layer


@pytest.mark.parametrize("family", FAMILIES)
def test_kv_bytes_per_token_equal_the_runtime_state(family):
    config = _config(family)
    spec = read_spec(config)
    module = family_module(spec.family)
    model = module.build(spec, _meta_weights(config), torch.bfloat16, torch.device("meta"))
    per_token = state_bytes(module.state_specs(spec), 1, torch.bfloat16)     # what the estimate counts
    assert per_token == state_bytes(model.state_specs(), 1, torch.bfloat16)
    if family in ("deepseek_v2", "deepseek_v3", "glm4_moe_lite"):
        assert per_token == 3 * (32 + 8) * 2                                   # latent + rope key, not full K/V


def _meta_weights(config):
    from transformers import AutoConfig, AutoModelForCausalLM
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "transformers_version")}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **fields))
    return dict(model.state_dict())
