"""qwen3_next through the user's path (repack -> engine.load -> generate), token-exact with transformers
(float32, streaming forced), with a prompt that spans three DeltaNet prefill chunks."""
import pytest

from engine import GenerationParams
from engine.format.repack import repack
from tests.engine.reference import load_reference, reference_greedy
from tests.families.hybrid_models import build_hybrid
from tests.streaming.sized import streaming_engine

PROMPT_IDS = [(i * 37) % 390 + 3 for i in range(150)]      # 150 tokens: chunks of 64, 64 and 22
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return build_hybrid("qwen3_next", tmp_path_factory.mktemp("qwen3_next") / "hf")


@pytest.mark.parametrize("quant", ["bf16", "fp8", "nvfp4"])
def test_greedy_tokens_match_transformers(quant, hf_dir, tmp_path):
    eng = streaming_engine(repack(hf_dir, tmp_path / quant, quant=quant))
    ours = [e.token_id for e in eng.generate(PROMPT_IDS, GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0))]
    theirs = reference_greedy(load_reference(hf_dir, quant), PROMPT_IDS, NEW_TOKENS)
    assert ours == theirs
    # a second conversation starts from fresh DeltaNet states
    again = [e.token_id for e in eng.generate(PROMPT_IDS, GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0))]
    assert again == ours
    tel = eng.telemetry()
    assert tel["ram_cache"]["capacity_bytes"] < eng.model.expert_bytes_total
    assert tel["ram_cache"]["misses"] > 0 and tel["ram_cache"]["evictions"] > 0
    eng.close()
