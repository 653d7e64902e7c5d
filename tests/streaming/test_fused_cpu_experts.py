"""The CPU's int8 experts through the fused kernel (kernels.cpu_moe) give the tokens the slot path gives
(every expert copied into a slot and dequantised as the reference does), in decode and in a prompt small
enough for the CPU's share; the engine reports which kernel it chose, keeps torch when told to, and
refuses a kernel that does not match the reference."""
import warnings

import pytest
import torch

from engine.format.repack import repack
from engine.tools.demo import build_hf_model
from engine.options import Options
from kernels import cpu_moe

from tests.families.generic_models import GENERIC_KWARGS
from tests.streaming.sized import engine_with_slots, token_ids

PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 1, 300]

pytestmark = pytest.mark.skipif(not cpu_moe.available(), reason="numba is not installed")


@pytest.fixture(scope="module", params=["olmoe", "gpt_oss", "nemotron_h"])
def int8_model(request, tmp_path_factory):
    """olmoe: SiLU experts; gpt_oss: the clamped SwiGLU with expert biases; nemotron_h: ungated relu2 experts
    (families.nemotron_h)."""
    tmp = tmp_path_factory.mktemp(request.param)
    build_hf_model(request.param, tmp / "hf", **{"num_layers": 3, **GENERIC_KWARGS.get(request.param, {})},
                   with_tokenizer=False, seed=3)
    return repack(tmp / "hf", tmp / "int8", quant="int8")


def _run(path, prompts, cpu_kernel="auto", **kw):
    eng = engine_with_slots(path, 3, 12, options=Options(cpu_kernel=cpu_kernel), **kw)
    try:
        return [token_ids(eng, prompt, n) for prompt, n in prompts], eng.telemetry()
    finally:
        eng.close()


# a decode of 12 tokens, then (its experts now in RAM) a 3-token prompt the CPU's share takes whole
PROMPTS = [(PROMPT, 12), (PROMPT[:3], 6)]


def test_fused_experts_give_the_slot_paths_tokens(int8_model, monkeypatch):
    tokens, snap = _run(int8_model, PROMPTS, "fused", cpu_experts="all")
    slot_tokens, _ = _run(int8_model, PROMPTS, "fused", cpu_experts="off")
    assert tokens == slot_tokens
    placement = snap["placement"]
    assert placement["cpu_kernel"] == "fused" and placement["fused_error"] < 1e-5
    assert snap["cpu"]["experts"] > 0


def test_fused_experts_can_be_switched_off(int8_model, monkeypatch):
    _, snap = _run(int8_model, PROMPTS[:1], "torch", cpu_experts="all")
    assert snap["placement"]["cpu_kernel"] == "torch" and "fused_expert_s" not in snap["placement"]


def test_a_kernel_that_misses_the_reference_is_refused(int8_model, monkeypatch):
    real = cpu_moe.FusedExperts.into

    def off_by_a_little(self, y, *args):
        real(self, y, *args)
        y.mul_(1.001)

    monkeypatch.setattr(cpu_moe.FusedExperts, "into", off_by_a_little)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tokens, snap = _run(int8_model, PROMPTS[:1], "fused", cpu_experts="all")
    assert snap["placement"]["cpu_kernel"] == "torch" and snap["placement"]["fused_error"] > 1e-4
    assert any("fused CPU expert kernel is not used" in str(w.message) for w in caught)
    assert tokens == _run(int8_model, PROMPTS[:1], "torch", cpu_experts="all")[0]


def test_bfloat16_runs_with_the_fused_kernel_chosen(int8_model, monkeypatch):
    """In bfloat16 the CPU's share is fused (float32 inside) while slot experts keep torch's bf16 path:
    a prompt through the slots and a decode with the share both run, and the slot-only tokens are the
    ones the engine gives with the fused kernel off."""
    tokens, snap = _run(int8_model, PROMPTS, "fused", cpu_experts="all", dtype="bfloat16")
    assert snap["placement"]["cpu_kernel"] == "fused" and snap["cpu"]["experts"] > 0
    slot_fused, _ = _run(int8_model, PROMPTS[:1], "fused", cpu_experts="off", dtype="bfloat16")
    assert slot_fused == _run(int8_model, PROMPTS[:1], "torch", cpu_experts="off", dtype="bfloat16")[0]
    assert len(tokens[0]) == 12


@pytest.mark.parametrize("max_group", [32, 2])       # 2: a prompt's larger groups take torch's path
def test_a_prompt_on_the_cpu_device_computes_ram_resident_experts_in_place(int8_model, monkeypatch, max_group):
    """The CPU device computes a prompt's RAM-resident experts where they sit (no copy into a slot), the fused
    kernel for small groups and torch's expert for larger ones; the tokens are the slot path's."""
    from engine.runtime import cpu_experts, expert_compute
    monkeypatch.setattr(cpu_experts, "FUSED_MAX_GROUP", max_group)
    monkeypatch.setattr(expert_compute, "FUSED_MAX_UNDECODED", max_group)
    long_prompt = PROMPT * 2                                 # 20 tokens: past the GPU's share of 4
    eng = engine_with_slots(int8_model, 3, 12, cpu_experts="all", device="cpu",   # (on a GPU box too)
                            options=Options(cpu_kernel="fused"))
    try:
        token_ids(eng, PROMPT, 4)                            # its experts now in RAM
        before = eng.telemetry()
        ours = token_ids(eng, long_prompt, 1)                 # a prefill alone
        after = eng.telemetry()
    finally:
        eng.close()
    assert after["cpu"]["experts"] > before["cpu"]["experts"]
    slot_tokens, _ = _run(int8_model, [(PROMPT, 4), (long_prompt, 1)], "fused", cpu_experts="off", device="cpu")
    assert ours == slot_tokens[1]


def test_a_prompt_in_place_leaves_a_small_ram_cache_room_for_its_reads(int8_model):
    """With a RAM cache of 2 blocks, a prompt's experts computed in place must not hold the blocks its disk
    misses are read into (the first version locked them all: "RAM cache: every slot is locked")."""
    long_prompt = PROMPT * 3
    outs = []
    for mode in ("all", "off"):
        eng = engine_with_slots(int8_model, 3, 2, cpu_experts=mode, device="cpu")
        try:
            outs.append((token_ids(eng, PROMPT, 4), token_ids(eng, long_prompt, 3)))
        finally:
            eng.close()
    assert outs[0] == outs[1]
