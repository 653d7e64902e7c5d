"""Streaming tests: an engine with an exact number of slots a bank."""
import dataclasses
from unittest import mock

import torch

import engine
from engine.runtime import runner

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
WORKSPACE_SLACK = 8 << 20   # a GPU's context and graphs vary by megabytes between loads (the probe's and the test's)


def engine_with_slots(path, slots_per_bank: int, ram_blocks: int, max_context: int = 64, **kw):
    """An Engine with exactly `slots_per_bank` slots a bank and a RAM cache of `ram_blocks` blocks.
    The engine plans its budgets as always (an unconstrained VRAM budget), and the plan's slot count
    is then cut to the one asked for: on a GPU the memory the engine charges besides the slots (CUDA
    graphs, the driver's context) varies by megabytes between loads, far more than a test model's
    12 KB slot, so no budget in bytes gives an exact slot count."""
    real_plan = runner.plan_budgets

    def plan_with_slots(**budgets):
        plan = real_plan(**budgets)
        assert plan.slots_per_bank >= slots_per_bank, plan
        return dataclasses.replace(plan, slots_per_bank=slots_per_bank)

    kw = {"device": DEVICE, "dtype": "float32", "max_context": max_context, **kw}
    probe = engine.load(path, device=kw["device"], dtype="float32", max_context=max_context)
    plan = probe.plan
    probe.close()
    # the CPU device's default keeps top_k slots a bank where it computes experts in RAM: room for more
    vram = max(plan.vram_budget_bytes, plan.dense_bytes + plan.kv_bytes + plan.workspace_bytes
               + 2 * slots_per_bank * plan.device_slot_bytes + WORKSPACE_SLACK)
    with mock.patch.object(runner, "plan_budgets", plan_with_slots):
        return engine.load(path, vram_budget=vram, ram_cache=ram_blocks * plan.block_bytes, **kw)


def streaming_budgets(model_dir, **kw) -> tuple[int, int]:
    """(VRAM budget, RAM cache) far below the experts: the cache ~ a third of the expert bytes, the slots
    about two layers' active experts. kw: engine.load options (device, dtype)."""
    probe = engine.load(model_dir, **kw)
    plan = probe.plan
    ram = probe.model.expert_bytes_total // 3
    vram = plan.dense_bytes + plan.kv_bytes + 2 * probe.spec.top_k * plan.device_slot_bytes
    if probe.runner.is_cuda:
        vram += plan.workspace_bytes + WORKSPACE_SLACK
    probe.close()
    return vram, ram


def streaming_engine(model_dir, **kw):
    """An engine whose experts really stream (see streaming_budgets)."""
    vram, ram = streaming_budgets(model_dir, **kw)
    return engine.load(model_dir, vram_budget=vram, ram_cache=ram, **kw)


def token_ids(eng, prompt, max_new_tokens: int, **params) -> list[int]:
    from engine import GenerationParams
    params = {"temperature": 0, "ignore_eos": True, **params}
    return [e.token_id for e in eng.generate(prompt, GenerationParams(max_new_tokens=max_new_tokens, **params))]
