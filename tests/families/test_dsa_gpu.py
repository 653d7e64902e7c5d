"""GPU: DeepSeek-V3.2 and GLM-5 natively in float32 on CUDA, token-exact with transformers while experts stream; the
decode step runs in CUDA graphs (the indexer's keys static at full size beside MLA's latents, its top-k over every
row) with the Triton expert kernels."""
import pytest

from tests.engine.reference import load_reference, reference_greedy
from tests.families.tokens import NEW_TOKENS, PROMPT_IDS
from tests.streaming.sized import streaming_engine, token_ids

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("quant", ["bf16", "fp8", "int8"])
@pytest.mark.parametrize("family", ["deepseek_v32", "glm_moe_dsa"])
def test_cuda_float32_tokens_match_transformers_in_cuda_graphs(family, quant, hf_models, sluice_models):
    eng = streaming_engine(sluice_models(family, quant), device="cuda", dtype="float32")
    try:
        ours = token_ids(eng, PROMPT_IDS, NEW_TOKENS)
        assert eng.runner.step.use_graphs and eng.runner.experts.compute.kernel is not None    # captured at load
        tel = eng.telemetry()
    finally:
        eng.close()
    assert ours == reference_greedy(load_reference(hf_models(family), quant), PROMPT_IDS, NEW_TOKENS)
    assert tel["ram_cache"]["misses"] > 0
