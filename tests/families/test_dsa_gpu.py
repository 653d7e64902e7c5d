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


def test_native_decode_outpaces_the_generic_path(tmp_path, monkeypatch):
    """GLM-5's layers at a middle size (the indexer keeping 64 of up to 256 keys) run both ways from one repack:
    natively (CUDA graphs) and as transformers' modules (the generic path these families took before)."""
    import time

    from engine.format.repack import repack
    from engine.model import families
    from engine.tools.demo import build_hf_model
    from tests.families.test_generic_gpu import _decode_tok_s
    hf_dir = build_hf_model("glm_moe_dsa", tmp_path / "hf", num_layers=8, hidden_size=1024, num_attention_heads=16,
                            num_key_value_heads=16, kv_lora_rank=256, q_lora_rank=384, qk_nope_head_dim=64,
                            qk_rope_head_dim=32, v_head_dim=64, head_dim=32, n_routed_experts=32, num_experts_per_tok=8,
                            n_group=1, topk_group=1, moe_intermediate_size=256, index_topk=64, index_head_dim=64,
                            index_n_heads=16, indexer_types=["full", "shared"] * 4, with_tokenizer=False)
    model_dir = repack(hf_dir, tmp_path / "sluice")
    start = time.perf_counter()
    native = _decode_tok_s(model_dir)
    monkeypatch.setitem(families.FAMILIES, "glm_moe_dsa", families.Family("glm_moe_dsa", "generic"))
    generic = _decode_tok_s(model_dir)
    print(f"glm_moe_dsa decode: native {native:.1f} tok/s, generic {generic:.1f} tok/s "
          f"({time.perf_counter() - start:.0f} s)")
    assert native > 2 * generic
