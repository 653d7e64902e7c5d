"""qwen3_5_moe (text part of the vision-language checkpoint) through the user's path, token-exact with
transformers (float32, streaming forced); the vision tower is skipped; an image gets one sentence."""
import pytest
from safetensors import safe_open

import engine
from engine import GenerationParams, SluiceError
from engine.format.repack import repack
from tests.engine.reference import load_reference, reference_greedy
from tests.families.hybrid_models import build_hybrid
from tests.families.test_qwen3_next import NEW_TOKENS, PROMPT_IDS
from tests.streaming.sized import streaming_engine


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return build_hybrid("qwen3_5_moe", tmp_path_factory.mktemp("qwen3_5_moe") / "hf", seed=1, with_tokenizer=True)


@pytest.mark.parametrize("quant", ["bf16", "fp8", "nvfp4"])
def test_greedy_tokens_match_transformers(quant, hf_dir, tmp_path):
    model_dir = repack(hf_dir, tmp_path / quant, quant=quant)
    with safe_open(str(model_dir / "dense.safetensors"), "pt") as f:
        names = list(f.keys())
    assert not any("visual" in n or "language_model" in n for n in names)
    eng = streaming_engine(model_dir)
    ours = [e.token_id for e in eng.generate(PROMPT_IDS, GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0))]
    assert ours == reference_greedy(load_reference(hf_dir, quant), PROMPT_IDS, NEW_TOKENS)
    tel = eng.telemetry()
    assert tel["ram_cache"]["misses"] > 0 and tel["ram_cache"]["evictions"] > 0
    eng.close()


@pytest.mark.parametrize("message", [
    {"role": "user", "content": [{"type": "text", "text": "what is this?"}, {"type": "image", "url": "cat.png"}]},
    {"role": "user", "content": "what is this?", "images": ["aGVsbG8="]},           # Ollama's spelling
])
def test_an_image_in_a_request_gets_one_sentence(message, hf_dir, tmp_path):
    eng = engine.load(repack(hf_dir, tmp_path / "m"))
    with pytest.raises(SluiceError, match="Images are not supported"):
        list(eng.generate([message], GenerationParams(max_new_tokens=2)))
    text = [e.text for e in eng.generate([{"role": "user", "content": "hi"}], GenerationParams(max_new_tokens=3))]
    assert len(text) == 3
    eng.close()
