"""GPU: qwen4_exp in float32 on CUDA (Triton expert kernels, eager decode: the n-gram history and QSA need
host-known positions), token-exact with transformers while experts and n-gram rows stream."""
import pytest

from engine.format.repack import repack
from tests.engine.reference import load_reference, reference_greedy
from tests.families.qwen4_models import build_qwen4
from tests.families.test_qwen4_exp import NEW_TOKENS, PROMPT_IDS
from tests.streaming.sized import streaming_engine, token_ids

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("quant", ["bf16", "fp8", "int8"])
@pytest.mark.parametrize("multimodal", [False, True])
def test_cuda_float32_tokens_match_transformers(multimodal, quant, tmp_path):
    hf_dir = build_qwen4(tmp_path / "hf", multimodal=multimodal)
    eng = streaming_engine(repack(hf_dir, tmp_path / "m", quant=quant), device="cuda", dtype="float32")
    ours = token_ids(eng, PROMPT_IDS, NEW_TOKENS)
    assert ours == reference_greedy(load_reference(hf_dir, quant), PROMPT_IDS, NEW_TOKENS)
    tel = eng.telemetry()
    assert tel["ram_cache"]["misses"] > 0 and tel["ngram"]["misses"] > 0
    eng.close()
