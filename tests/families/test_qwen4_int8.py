"""qwen4_exp with int8 dense weights (engine.model.dense_quant): transformers' tokens when both hold the same
dequantised dense weights (experts streaming, n-gram rows read from ngram.bin), and the VRAM they free: Flash-Next's
dense weights are ~9.9 GB in bf16, more than an 8 GB GPU holds."""
import torch
from safetensors import safe_open

import engine
from engine.format.repack import repack
from engine.model.dense_quant import quantized_names
from engine.model.layers import Packed
from tests.engine.reference import load_reference, reference_greedy
from tests.families.qwen4_models import EOS, build_qwen4
from tests.streaming.sized import engine_with_slots, token_ids

PROMPT = [(i * 37) % 390 + 3 for i in range(40)]
PROMPT[17] = EOS                                          # the n-gram history resets mid-prompt
NEW_TOKENS = 16


def test_int8_dense_weights_give_transformers_tokens_with_the_same_weights(tmp_path):
    hf_dir = build_qwen4(tmp_path / "hf", seed=3)
    model_dir = repack(hf_dir, tmp_path / "m", quant="int8")
    eng = engine_with_slots(model_dir, slots_per_bank=3, ram_blocks=4, dense_quant="int8")
    try:
        ours = token_ids(eng, PROMPT, NEW_TOKENS)
        model = eng.runner.model
        ngram = eng.telemetry()["ngram"]
    finally:
        eng.close()
    assert eng.info["dense_quant"] == "int8" and ngram["rows"] > 0
    assert all(isinstance(w, Packed) for w in (model.embed_tokens, model.lm_head, model.mixer.down,
                                               model.blocks[0].mixer.in_qkv, model.blocks[1].mixer.index_qk,
                                               model.blocks[0].ple.key))
    reference = load_reference(hf_dir, "int8", dense_quant="int8")
    with safe_open(str(model_dir / "dense.safetensors"), "pt") as f:
        stored = list(f.keys())
    # the reference rounded the very tensors the engine did
    assert quantized_names("qwen4_exp_text", stored) == quantized_names("qwen4_exp_text",
                                                                      dict(reference.named_parameters()))
    assert ours == reference_greedy(reference, PROMPT, NEW_TOKENS)


def test_int8_dense_weights_fit_flash_next_on_an_8_gb_gpu():
    from engine.plan.estimate import Machine, estimate
    from tests.families.test_qwen4_bench import full_config
    machine = Machine("cuda", ram_available_bytes=31 << 30, mem_bw_bps=60e9, disk_read_bps=14e9,
                      free_disk_bytes=4 << 40, vram_bytes=8 << 30, pcie_bps=26e9, gpu_mem_bw_bps=448e9)
    as_stored = estimate(full_config(), 0, machine, "nvfp4")
    int8 = estimate(full_config(), 0, machine, "nvfp4", dense_quant="int8")
    assert as_stored.verdict == "will not run" and "GPU memory" in as_stored.reason
    assert int8.verdict != "will not run" and int8.tok_s > 0


def test_int8_dense_weights_leave_more_of_a_budget_to_slots(tmp_path):
    model_dir = repack(build_qwen4(tmp_path / "hf", seed=3), tmp_path / "m", quant="int8")
    plans = {}
    for dense_quant in (None, "int8"):
        eng = engine.load(model_dir, device="cpu", vram_budget="1500KB", max_context=64, dense_quant=dense_quant)
        plans[dense_quant] = eng.plan
        eng.close()
    assert plans["int8"].dense_bytes < plans[None].dense_bytes * 0.5
    assert plans["int8"].slots_per_bank > plans[None].slots_per_bank
    assert torch.float32 == eng.runner.model.compute_dtype
