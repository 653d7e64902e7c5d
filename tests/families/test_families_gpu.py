"""H200: the DeepSeek-style families and ERNIE-4.5 in float32 with the Triton kernels and CUDA graphs (the default CUDA
path), token-exact with transformers while experts stream (RAM cache a third of the experts)."""
import pytest

from tests.families.tokens import assert_streamed_tokens_match

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("quant", ["bf16", "fp8", "nvfp4", "int8"])
@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3", "glm4_moe", "glm4_moe_lite", "minimax_m2",
                                    "dots1", "ernie4_5_moe"])
def test_cuda_float32_tokens_match_transformers(family, quant, hf_models, sluice_models):
    assert_streamed_tokens_match(hf_models(family), sluice_models(family, quant), quant, device="cuda", dtype="float32")
