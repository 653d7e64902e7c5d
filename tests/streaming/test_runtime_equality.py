"""The CUDA runtime's code path (streaming MoE, speculative prefetch, static-KV decode pieces),
run on whatever device there is, must produce transformers' greedy tokens with budgets that force
experts to stream. On the CPU it runs the reference math and synchronous copies; on a GPU it runs
the Triton kernels, the copy stream and the CUDA graphs (float32 compute)."""
import pytest
import torch

from engine.tools.demo import build_hf_model
from engine.format.repack import repack

from tests.streaming.sized import model_with_slots

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 1, 300]
NEW_TOKENS = 16


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral", "olmoe", "qwen2_moe"])
def family_model(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    build_hf_model(request.param, tmp / "hf", num_layers=3, with_tokenizer=False, seed=3)
    repack(tmp / "hf", tmp / "sluice", quant="bf16")
    from transformers import AutoModelForCausalLM
    ref = AutoModelForCausalLM.from_pretrained(tmp / "hf", dtype=torch.float32, experts_implementation="eager",
                                               attn_implementation="eager")
    out = ref.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    return tmp / "sluice", out[0, len(PROMPT):].tolist()


def _streaming_model(path, slots_per_bank=3, ram_blocks=4, **kw):
    """Budgets far below the expert set: 3 slots a bank, a RAM cache of 4 blocks."""
    return model_with_slots(path, slots_per_bank, ram_blocks, **kw)


def test_greedy_tokens_equal_transformers_while_streaming(family_model):
    path, expected = family_model
    model = _streaming_model(path)
    try:
        timings = model.generate(PROMPT, NEW_TOKENS)
        snap = model.telemetry.snapshot()
    finally:
        model.close()
    assert timings.token_ids == expected
    assert not model.decoder._decoded          # no decoded copies of slots beside the budgeted blocks
    spec = model.spec
    total_blocks = len(spec.moe_layers) * spec.num_experts
    assert model.plan.slots_per_bank == 3 and model.cache.num_slots == 4 < total_blocks
    assert snap["disk"]["reads"] > total_blocks            # experts really streamed (re-read after eviction)
    assert snap["speculation"]["predicted"] > 0 and snap["prefetch"]["issued"] > 0


def test_eager_switch_gives_the_same_tokens(family_model):
    path, expected = family_model
    model = _streaming_model(path, use_graphs=False, slots_per_bank=2, ram_blocks=2)
    try:
        assert model.generate(PROMPT, NEW_TOKENS).token_ids == expected
    finally:
        model.close()


@pytest.mark.gpu
def test_engine_on_cuda_uses_the_gpu_path_and_matches_transformers(family_model):
    """engine.load(device="cuda") goes through engine.gpu (kernels, graphs, streaming) and still
    gives the reference tokens in float32."""
    import engine
    from engine.params import GenerationParams
    import gc
    path, expected = family_model
    gc.collect()
    before = torch.cuda.memory_allocated()           # other tests' leftovers in this process
    eng = engine.load(path, device="cuda", dtype="float32", vram_budget=None, ram_cache=None)
    try:
        assert eng.gpu is not None
        ids = [ev.token_id for ev in eng.generate(PROMPT, GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0))]
        assert ids == expected
        assert eng.telemetry()["vram"]["peak_bytes"] - before <= eng.plan.vram_budget_bytes
    finally:
        eng.close()
