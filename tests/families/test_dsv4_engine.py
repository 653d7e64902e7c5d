"""DeepSeek-V4 through the user's path: repack, Engine.load(...).generate(...) with experts streaming
(RAM cache and device slots smaller than the expert set), greedy tokens equal to transformers (float32)."""
import pytest
import torch

import engine
from engine import GenerationParams
from engine.errors import SluiceError
from tests.engine.reference import load_reference, reference_greedy
from tests.families.dsv4_checkpoint import build_dsv4

PROMPT = [(i * 37) % 300 + 3 for i in range(21)]     # 21: a CSA and an HCA window left open at prefill's end
NEW_TOKENS = 30


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return build_dsv4(tmp_path_factory.mktemp("dsv4") / "hf", seed=2)


def streaming_engine(model_dir):
    probe = engine.load(model_dir)
    ram = probe.model.expert_bytes_total // 3
    vram = probe.plan.dense_bytes + probe.plan.kv_bytes + 2 * probe.spec.top_k * probe.plan.device_slot_bytes
    probe.close()
    return engine.load(model_dir, vram_budget=vram, ram_cache=ram)


@pytest.mark.parametrize("quant", ["bf16", "fp8"])
def test_greedy_tokens_equal_transformers_while_streaming(hf_dir, tmp_path, quant):
    from engine.format.repack import repack
    model_dir = repack(hf_dir, tmp_path / quant, quant=quant)
    eng = streaming_engine(model_dir)
    tokens = [e.token_id for e in eng.generate(PROMPT, GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0))]
    expected = reference_greedy(load_reference(hf_dir, quant), PROMPT, NEW_TOKENS)
    assert tokens == expected
    t = eng.telemetry()
    assert t["ram_cache"]["evictions"] > 0 and t["disk"]["bytes_read"] > eng.model.expert_bytes_total
    eng.close()


def test_refuses_unknown_layer_kinds_in_one_sentence(hf_dir):
    import json
    from engine.model.spec import read_spec
    config = json.loads((hf_dir / "config.json").read_text())
    with pytest.raises(SluiceError, match="layer_types"):
        read_spec({**config, "layer_types": ["full_attention"] * config["num_hidden_layers"]})
    with pytest.raises(SluiceError, match="softmax"):
        read_spec({**config, "scoring_func": "softmax"})
