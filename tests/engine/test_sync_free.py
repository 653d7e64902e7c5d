"""Decode steps with one host sync a token (engine/runtime/sync_free.py): where every expert block sits in a slot
or in the RAM cache, a step launches each MoE layer's experts straight after its router, the misses read in
place from RAM, and its tokens stay transformers'; every REFRESH_TOKENS-th step is a synced one that copies its
misses in; where RAM is short of the model no step goes without its syncs; a kernel that reads a RAM block in
place wrongly turns them off. On a GPU as the engine runs; without one the kernels run in Triton's interpreter,
attached as on a GPU."""
import pytest
import torch

import engine
from engine.format.repack import repack
from engine.runtime import attach, runner, sync_free
from engine.runtime.sync_free import extra_miss_s
from engine.tools.demo import build_hf_model
from kernels.formats import random_bank
from tests.engine.reference import load_reference, reference_greedy
from tests.families.qwen4_models import build_qwen4
from tests.streaming.sized import DEVICE, engine_with_slots, token_ids

pytest.importorskip("triton")

PROMPT = [5, 17, 42, 99, 3, 250, 7, 64]
NEW_TOKENS = 24


def _build(family: str, tmp):
    if family == "qwen4_exp_text":                 # PLE rows and QSA picks through the step's hooks
        build_qwen4(tmp / "hf", seed=5)
    else:
        build_hf_model(family, tmp / "hf", num_layers=2, with_tokenizer=False, seed=5)
    repack(tmp / "hf", tmp / "sluice", quant="bf16")
    return tmp


@pytest.fixture(scope="module", params=["olmoe", "gpt_oss", "qwen4_exp_text"])
def model_dir(request, tmp_path_factory):
    return _build(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def olmoe_dir(tmp_path_factory):
    return _build("olmoe", tmp_path_factory.mktemp("olmoe"))


@pytest.fixture
def attached(monkeypatch, tmp_path):
    """engine.load attaches the kernels on the CPU as it does on a GPU; verdicts in a private cache."""
    monkeypatch.setenv("SLUICE_DATA_DIR", str(tmp_path))
    real = attach.attach_kernels
    real_experts = runner.expert_kernels

    def attach_here(model, weights, device, dtype, options, warn):
        with monkeypatch.context() as m:
            m.setattr(attach, "attaches", lambda options, device: not options.eager)
            real(model, weights, device, dtype, options, warn)

    def experts_here(*args):
        with monkeypatch.context() as m:
            m.setattr(attach, "attaches", lambda options, device: not args[-2].eager)
            return real_experts(*args)
    monkeypatch.setattr(runner, "attach_kernels", attach_here)
    monkeypatch.setattr(runner, "expert_kernels", experts_here)


def _generate(model_dir, ram_blocks: int | None):
    """(tokens, telemetry, the engine's SyncFreeSteps) of a second generation: the first reads every block into
    the RAM cache as it decodes (a step goes in place only once each block sits in a tier; on a GPU the steps
    outrun the reads)."""
    probe = engine.load(model_dir / "sluice", device=DEVICE, dtype="float32")
    total = len(probe.spec.moe_layers) * probe.spec.num_experts
    probe.close()
    eng = engine_with_slots(model_dir / "sluice", slots_per_bank=4, ram_blocks=ram_blocks or total)
    try:
        assert eng.runner.experts.compute.kernel is not None               # the decode kernel attached
        token_ids(eng, PROMPT, NEW_TOKENS)
        before = eng.telemetry()
        ours = token_ids(eng, PROMPT, NEW_TOKENS)
        tel = eng.telemetry()
        tel["sync_free"] = {k: v - before["sync_free"][k] for k, v in tel["sync_free"].items()}
        tel["vram"]["misses"] -= before["vram"]["misses"]
        return ours, tel, eng.runner.experts.sync_free
    finally:
        eng.close()


def test_steps_read_misses_in_place_with_one_sync_a_token_and_keep_transformers_tokens(model_dir, attached):
    ours, tel, steps = _generate(model_dir, ram_blocks=None)
    assert steps is not None and steps.captured == torch.cuda.is_available()      # in CUDA graphs on a GPU
    assert ours == reference_greedy(load_reference(model_dir / "hf", "bf16"), PROMPT, NEW_TOKENS)
    free = tel["sync_free"]
    synced = NEW_TOKENS - 1 - free["steps"]                    # the first token comes from the prompt's pass
    assert free["steps"] >= NEW_TOKENS // 2 and synced >= (NEW_TOKENS - 1) // sync_free.REFRESH_TOKENS
    assert free["pcie_reads"] > 0                              # 4 slots a bank: most routed experts sit in RAM
    assert tel["vram"]["misses"] >= free["pcie_reads"]


def test_a_ram_cache_short_of_the_model_keeps_every_sync(olmoe_dir, attached):
    ours, tel, _ = _generate(olmoe_dir, ram_blocks=5)
    assert tel["sync_free"] == {"steps": 0, "pcie_reads": 0}
    assert ours == reference_greedy(load_reference(olmoe_dir / "hf", "bf16"), PROMPT, NEW_TOKENS)


def test_a_kernel_that_reads_in_place_wrongly_is_not_used(olmoe_dir):
    from engine.format.modeldir import open_model_dir
    from kernels.moe_decode import moe_decode
    layout = open_model_dir(olmoe_dir / "sluice").layout
    offsets = {f.name: f.offset for f in layout.fields}
    block = random_bank(1, layout.block_bytes, layout.fmt, offsets, layout.intermediate, layout.hidden)[0]
    bank = torch.zeros(2, layout.block_bytes, dtype=torch.uint8, device=DEVICE)
    host_block = block.pin_memory() if DEVICE == "cuda" else block
    args = (bank, block.to(DEVICE), host_block, layout, offsets, torch.float32)
    extra = extra_miss_s(moe_decode, *args)                                 # the real kernel
    assert extra is not None and (extra >= 0.0 if DEVICE == "cuda" else extra == 0.0)

    def off_by_one(*a, bases=None, **kw):
        out = moe_decode(*a, bases=bases, **kw)
        return out + 1 if bases is not None else out
    assert extra_miss_s(off_by_one, *args) is None
