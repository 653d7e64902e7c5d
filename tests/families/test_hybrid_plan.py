"""What the planner and the spec know of the hybrids: parameter counts (transformers' own), the
fixed DeltaNet state in the budget, the layer pattern from full_attention_interval, refusals."""
import pytest
import torch

from engine import SluiceError
from engine.model.families.hybrid import dims
from engine.model.spec import read_spec
from engine.plan.estimate import MAX_CONTEXT_TOKENS, _state_bytes, model_shape
from tests.families.hybrid_models import QWEN3_5_TEXT, QWEN3_NEXT, VISION


def qwen3_5_config() -> dict:
    from transformers import AutoConfig
    return AutoConfig.for_model("qwen3_5_moe", text_config=QWEN3_5_TEXT, vision_config=VISION).to_dict()


def qwen3_next_config() -> dict:
    from transformers import AutoConfig
    return AutoConfig.for_model("qwen3_next", **QWEN3_NEXT).to_dict()


@pytest.mark.parametrize("make", [qwen3_next_config, qwen3_5_config])
def test_parameter_counts_match_transformers(make):
    from transformers import AutoConfig, AutoModelForCausalLM
    config = make()
    fields = {k: v for k, v in config.items() if k not in ("model_type", "transformers_version", "architectures")}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **fields))   # text model
    shape = model_shape(config)
    assert shape.total_params == model.num_parameters()
    routed = shape.num_moe_layers * shape.num_experts * shape.expert_params
    assert shape.active_params == shape.total_params - routed + shape.num_moe_layers * shape.top_k * shape.expert_params


@pytest.mark.parametrize("make", [qwen3_next_config, qwen3_5_config])
def test_state_in_the_estimate_is_kv_of_attention_layers_plus_fixed_deltanet_state(make):
    config = make()
    spec = read_spec(config)
    d = dims(spec)
    linear = sum(d.is_linear(layer) for layer in range(spec.num_layers))
    context = min(spec.max_position_embeddings, MAX_CONTEXT_TOKENS)
    kv = 2 * (spec.num_layers - linear) * context * spec.num_kv_heads * spec.head_dim * 4
    fixed = linear * (d.conv_channels * (d.conv_kernel - 1) * 4 + d.num_v_heads * d.k_head_dim * d.v_head_dim * 4)
    assert _state_bytes(config, torch.float32) == kv + fixed
    assert _state_bytes(config, torch.bfloat16) < kv + fixed      # KV and conv window in bf16, recurrent stays fp32


def test_layer_pattern_from_full_attention_interval_and_real_qwen3_next_keys():
    config = {k: v for k, v in QWEN3_NEXT.items() if k != "rope_parameters"}
    config.update(model_type="qwen3_next", num_hidden_layers=6, full_attention_interval=3, rope_theta=10000000,
                  partial_rotary_factor=0.25)                          # the Hub's spelling of rope settings
    spec = read_spec(config)
    assert dims(spec).layer_types == ("linear_attention", "linear_attention", "full_attention") * 2
    assert dims(spec).rotary_dim == 4 and spec.rope_theta == 10000000
    assert spec.moe_layers == (0, 1, 3, 4, 5) and spec.shared_expert_intermediate == 48


def test_unknown_layer_types_are_refused_in_one_sentence():
    config = dict(QWEN3_NEXT, model_type="qwen3_next", layer_types=["linear_attention", "sliding_attention"] * 2)
    with pytest.raises(SluiceError, match="does not run"):
        read_spec(config)


def test_qwen3_5_bench_preset_has_the_published_size():
    from engine.tools.presets import preset_config
    config = preset_config("qwen3.5-35b-a3b")
    shape, spec = model_shape(config), read_spec(config)
    assert 34e9 < shape.total_params < 36e9 and 2.5e9 < shape.active_params < 3.6e9      # "35B-A3B"
    assert spec.num_experts == 256 and spec.top_k == 8 and spec.shared_expert_intermediate == 512
    assert dims(spec).layer_types.count("full_attention") == 10
