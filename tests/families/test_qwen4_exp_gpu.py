"""GPU: qwen4_exp in float32 on CUDA (Triton expert kernels, the decode step in CUDA graphs: QSA selects from device
positions, the n-gram rows copied into static inputs before each layer), token-exact with transformers while
experts and n-gram rows stream; and a middle-sized model's decode with graphs beside the same step eagerly."""
import pytest

from engine.format.repack import repack
from tests.engine.reference import load_reference, reference_greedy
from tests.families.qwen4_models import build_qwen4
from tests.families.test_qwen4_exp import NEW_TOKENS, PROMPT_IDS
from tests.streaming.sized import streaming_engine, token_ids

pytestmark = pytest.mark.gpu

LINEAR, INDEXED = "linear_attention", "indexed_attention"
# 8 layers (QSA every fourth, PLE on two DeltaNet layers), 32 experts of 256 at 1024 wide; n-gram tables of ~50k
# rows a head, so a token's rows are mostly read from disk
MIDDLE = dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2, head_dim=128, num_experts=32,
              num_experts_per_tok=8, moe_intermediate_size=256, shared_expert_intermediate_size=512,
              linear_num_key_heads=8, linear_num_value_heads=16, linear_key_head_dim=64, linear_value_head_dim=64,
              num_hidden_layers=8, layer_types=[LINEAR, LINEAR, LINEAR, INDEXED] * 2, hc_count=4, hc_lowrank=32,
              ple_layer_ids=[2, 6], ple_embed_dim=256, ngram_vocab_size_base=50_000, indexer_n_heads=4,
              indexer_head_dim=64, indexer_budget=64, indexer_compress_ratio=4)


@pytest.mark.parametrize("quant", ["bf16", "fp8", "int8"])
@pytest.mark.parametrize("multimodal", [False, True])
def test_cuda_float32_tokens_match_transformers_in_cuda_graphs(multimodal, quant, tmp_path):
    hf_dir = build_qwen4(tmp_path / "hf", multimodal=multimodal)
    eng = streaming_engine(repack(hf_dir, tmp_path / "m", quant=quant), device="cuda", dtype="float32")
    try:
        ours = token_ids(eng, PROMPT_IDS, NEW_TOKENS)
        assert eng.runner.step.use_graphs and eng.runner.model.graph_safe
        assert token_ids(eng, PROMPT_IDS, NEW_TOKENS) == ours       # a new conversation over the same graphs
        tel = eng.telemetry()
    finally:
        eng.close()
    assert ours == reference_greedy(load_reference(hf_dir, quant), PROMPT_IDS, NEW_TOKENS)
    assert tel["ram_cache"]["misses"] > 0 and tel["ngram"]["misses"] > 0


def _decode(eng, graphs: bool, prompt: list[int], new_tokens: int) -> tuple[list[int], float, dict]:
    """Greedy tokens, decode tok/s and the n-gram section's change, the step replayed in graphs or run eagerly (the
    same kernels; eagerly the step's position is known on the host, as before the family was graph-safe). The
    prompt's rows are read once beforehand, so what is read and waited for is the decode's."""
    step = eng.runner.step
    captured = step._graphs
    step._graphs, step.use_graphs = (captured, True) if graphs else (None, False)
    token_ids(eng, prompt, 1)
    before = eng.telemetry()["ngram"]
    tokens = token_ids(eng, prompt, new_tokens)
    tel = eng.telemetry()
    step._graphs, step.use_graphs = captured, True
    return tokens, tel["speed"]["decode_tok_s"], {k: tel["ngram"][k] - before[k] for k in ("read_s", "wait_s", "misses")}


def test_graph_decode_matches_eager_and_is_faster(tmp_path):
    """bf16 from one repack: the graphs' tokens are the eager step's; prints eager vs graph tok/s and how much of
    the n-gram reads the layers before the PLE layers hid (waited: what the host still waited for)."""
    hf_dir = build_qwen4(tmp_path / "hf", **MIDDLE)
    eng = streaming_engine(repack(hf_dir, tmp_path / "m"), device="cuda", dtype="bfloat16")
    prompts = [[(i * k) % 390 + 3 for i in range(24)] for k in (37, 41, 43)]     # fresh n-grams for each timing
    new_tokens, runs = 128, {}
    try:
        assert eng.runner.step.use_graphs
        same = [_decode(eng, graphs, prompts[0], 32)[0] for graphs in (True, False)]
        for graphs, prompt in ((False, prompts[1]), (True, prompts[2])):
            runs["graphs" if graphs else "eager"] = _decode(eng, graphs, prompt, new_tokens)
    finally:
        eng.close()
    assert same[0] == same[1]
    for name, (_, tok_s, ngram) in runs.items():
        print(f"qwen4_exp middle, bf16 decode {name}: {tok_s:.1f} tok/s; n-gram rows a token: read "
              f"{ngram['read_s'] / new_tokens * 1e6:.0f} us, waited {ngram['wait_s'] / new_tokens * 1e6:.0f} us "
              f"({ngram['misses']} rows read)")
    assert runs["graphs"][1] > runs["eager"][1]
