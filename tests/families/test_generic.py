"""The generic path (engine.model.generic): families without a native module run as transformers' own modules
while their routed experts stream through Sluice's tiers; greedy tokens identical to transformers' (float32,
24 tokens, slots and RAM far below the experts), on the CPU. Families it cannot run are refused from the
config alone, in one sentence naming what is missing."""
import re

import pytest

from engine.errors import SluiceError
from engine.format.repack import repack
from engine.model.families import FAMILIES, GENERIC_FAMILIES, Family
from engine.model.spec import SUPPORTED_FAMILIES, read_spec
from tests.families.generic_models import UNLISTED_KWARGS, build_generic_model, built_once
from tests.families.tokens import assert_streamed_tokens_match


@pytest.fixture(scope="module")
def generic_models(tmp_path_factory):
    return built_once(tmp_path_factory.mktemp("generic"), build_generic_model)


@pytest.mark.parametrize("family", GENERIC_FAMILIES)
def test_greedy_tokens_match_transformers_while_experts_stream(family, generic_models):
    hf_dir, model_dir = generic_models(family)
    assert_streamed_tokens_match(hf_dir, model_dir, "bf16")


@pytest.mark.parametrize("family,quant", [("lfm2_moe", "fp8"), ("granitemoehybrid", "nvfp4")])
def test_quantized_experts_match_transformers_on_the_same_rounded_weights(family, quant, generic_models, tmp_path):
    """Each layout of transformers' experts (feed_forward, transposed, ungated, ...) quantised as repack does."""
    hf_dir, _ = generic_models(family)
    assert_streamed_tokens_match(hf_dir, repack(hf_dir, tmp_path / "sluice", quant=quant), quant)


def test_ungated_experts_run_generically(tmp_path, monkeypatch):
    """transformers' ungated experts (up_proj [E, I, H] alone, relu²): Nemotron-H's, which Sluice now runs natively
    (test_nemotron_h.py), put on the generic path, int8."""
    monkeypatch.setitem(FAMILIES, "nemotron_h", Family("nemotron_h", "generic"))
    hf_dir = build_generic_model("nemotron_h", tmp_path / "hf")
    assert not read_spec(hf_dir).generic.has_gate
    assert_streamed_tokens_match(hf_dir, repack(hf_dir, tmp_path / "sluice", quant="int8"), "int8")


@pytest.mark.parametrize("quant", ["bf16", "int8"])
def test_experts_called_on_scaled_inputs_run_generically(quant, tmp_path, monkeypatch):
    """transformers' other experts contract (inputs scaled by their scores; fused, transposed weights): Llama 4's,
    which Sluice now runs natively (test_llama4.py), put on the generic path."""
    monkeypatch.setitem(FAMILIES, "llama4_text", Family("llama4_text", "generic"))
    hf_dir = build_generic_model("llama4_text", tmp_path / "hf")
    assert read_spec(hf_dir).generic.scaled_inputs
    assert_streamed_tokens_match(hf_dir, repack(hf_dir, tmp_path / "sluice", quant=quant), quant)


@pytest.mark.parametrize("family", UNLISTED_KWARGS)
def test_a_family_sluice_does_not_list_runs_generically_on_first_sight(family, generic_models):
    assert family not in SUPPORTED_FAMILIES
    hf_dir, model_dir = generic_models(family)
    assert FAMILIES[family].is_generic
    assert_streamed_tokens_match(hf_dir, model_dir, "bf16")


def test_generic_families_say_so():
    assert FAMILIES["afmoe"].path == "generic (slower)" and FAMILIES["qwen3_moe"].path == "native"


@pytest.mark.parametrize("family,missing", [
    ("inkling_text", "its experts (InklingSharedExperts) do not use transformers' shared experts interface"),
    ("sarvam_moe", "transformers splits some of its dense weights as it loads them (query_key_value into q_proj"),
])
def test_families_the_generic_path_cannot_run_are_refused_from_the_config(family, missing):
    with pytest.raises(SluiceError, match=re.escape(f"Sluice cannot run '{family}' models: {missing}")) as refusal:
        read_spec({"model_type": family})
    assert "\n" not in str(refusal.value)


def test_experts_in_a_latent_width_are_refused_from_the_config(monkeypatch):
    """Nemotron-H's experts may work in a narrower width than the hidden states (moe_latent_size); put on the
    generic path, the experts scan says so."""
    monkeypatch.setitem(FAMILIES, "nemotron_h", Family("nemotron_h", "generic"))
    with pytest.raises(SluiceError, match=re.escape("Sluice cannot run 'nemotron_h' models: its experts work in a "
                                                    "latent width apart from the hidden size.")):
        read_spec({"model_type": "nemotron_h", "moe_latent_size": 1024})


def test_the_estimate_says_a_family_runs_generically(generic_models):
    import json

    from engine.plan.estimate import Machine, estimate
    hf_dir, _ = generic_models("afmoe")
    machine = Machine("cpu", 16 << 30, 20e9, 2e9, 100 << 30)
    reason = estimate(json.loads((hf_dir / "config.json").read_text()), 1 << 20, machine).reason
    assert reason.endswith("Sluice runs afmoe on its generic (slower) path.")


def test_the_estimate_prices_the_generic_paths_gpu_layers_as_measured(monkeypatch):
    """One architecture estimated natively and on the generic path: on a GPU the generic path's layers cost 110 us
    more each where its decode replays as CUDA graph segments (an H100: native 444.6, generic 249.3 tok/s), 1.27 ms
    where a position-dependent rope keeps it eager (native 490.0, generic 44.6); on the CPU the two run alike."""
    from engine.model.families import FAMILIES, Family
    from engine.plan.estimate import Machine, estimate
    config = {"model_type": "qwen3_moe", "vocab_size": 400, "hidden_size": 64, "intermediate_size": 64,
              "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "tie_word_embeddings": False}
    machines = {"cuda": Machine("cuda", 16 << 30, 20e9, 2e9, 100 << 30, vram_bytes=8 << 30, pcie_bps=25e9,
                                gpu_mem_bw_bps=1e12),
                "cpu": Machine("cpu", 16 << 30, 20e9, 2e9, 100 << 30)}
    native = {device: estimate(config, 1 << 20, m) for device, m in machines.items()}
    monkeypatch.setitem(FAMILIES, "qwen3_moe", Family("qwen3_moe", "generic"))
    generic = {device: estimate(config, 1 << 20, m) for device, m in machines.items()}
    assert generic["cuda"].compute_s - native["cuda"].compute_s == pytest.approx(3 * 110e-6)
    assert generic["cpu"].compute_s == pytest.approx(native["cpu"].compute_s)
    eager_config = dict(config, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    eager = estimate(eager_config, 1 << 20, machines["cuda"])
    assert eager.compute_s - native["cuda"].compute_s == pytest.approx(3 * 1.27e-3)
    assert eager.tok_s < native["cuda"].tok_s / 2


@pytest.mark.parametrize("family", ["afmoe", "lfm2_moe"])
def test_the_estimate_counts_a_generic_family_as_transformers_does(family, generic_models):
    import json

    from transformers import AutoModelForCausalLM

    from engine.plan.estimate import model_shape
    hf_dir, _ = generic_models(family)
    shape = model_shape(json.loads((hf_dir / "config.json").read_text()))
    assert shape.total_params == AutoModelForCausalLM.from_pretrained(str(hf_dir)).num_parameters()
    assert shape.num_moe_layers == 2 and shape.num_experts == 8


def test_tied_embeddings_load_as_the_head(tmp_path):
    hf_dir = build_generic_model("hy_v3", tmp_path / "hf", tie_word_embeddings=True)
    assert_streamed_tokens_match(hf_dir, repack(hf_dir, tmp_path / "sluice"), "bf16")


def test_a_generic_prompt_is_cancelled_between_layers(generic_models):
    import threading

    import engine
    from engine.runtime.runner import PrefillCancelled
    _, model_dir = generic_models("afmoe")
    eng = engine.load(model_dir, dtype="float32")
    cancel = threading.Event()
    cancel.set()
    try:
        with pytest.raises(PrefillCancelled):
            eng.runner.prefill([5, 17, 42], cancel)
        assert len(eng.runner.prefill([5, 17, 42], threading.Event())) == eng.spec.vocab_size
    finally:
        eng.close()


@pytest.mark.parametrize("family", ["mimo_v2_flash", "hy_v3"])    # a router of one input; one that takes its bias too
def test_decode_guesses_the_next_layers_experts_from_its_own_router(family, generic_models):
    from tests.streaming.sized import streaming_engine, token_ids
    _, model_dir = generic_models(family)
    eng = streaming_engine(model_dir, dtype="float32")
    try:
        token_ids(eng, [5, 17, 42, 99], 12)
        speculation = eng.telemetry()["speculation"]
    finally:
        eng.close()
    if family == "mimo_v2_flash":
        assert speculation["predicted"] > 0 and speculation["correct"] > 0
    else:                              # no guess where the router needs more than the hidden states
        assert speculation["predicted"] == 0


def test_a_checkpoint_lacking_a_dense_tensor_is_refused_at_repack(generic_models, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file
    hf_dir, _ = generic_models("mimo_v2_flash")
    broken = tmp_path / "broken"
    shutil.copytree(hf_dir, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["model.layers.1.mlp.gate.e_score_correction_bias"]
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(SluiceError, match="has no tensor for 'model.layers.1.mlp.gate.e_score_correction_bias', "
                                          "which transformers' mimo_v2_flash"):
        repack(broken, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("config,supported", [
    ({"model_type": "qwen3_moe"}, True),                 # listed
    ({"model_type": "granitemoeshared"}, True),          # unlisted: transformers' experts interface
    ({"model_type": "nemotron_h"}, True),                # listed (native): ungated experts
    ({"model_type": "sarvam_moe"}, False),               # a dense weight transformers splits
    ({"model_type": "llama"}, False),                    # dense
])
def test_the_download_wizard_offers_families_the_generic_path_runs(config, supported):
    from engine.hub.search import RepoInfo
    assert RepoInfo("someone/model", "0" * 40, [], config).is_supported is supported
