"""Streaming tests: an engine with an exact number of slots a bank."""
import torch

import engine

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def engine_with_slots(path, slots_per_bank: int, ram_blocks: int, max_context: int = 64, **kw):
    """An Engine whose VRAM budget leaves exactly `slots_per_bank` slots a bank, and a RAM cache of
    `ram_blocks` blocks. The budget is derived from an engine's own plan: on a GPU the workspace it
    charges includes measured CUDA-graph memory, which is larger for the first model of a process
    (library workspaces made once), so the sizing is repeated until it holds."""
    from engine import SluiceError
    kw = {"device": DEVICE, "dtype": "float32", "max_context": max_context, **kw}
    vram = ram = plan = None
    for _ in range(8):
        try:
            eng = engine.load(path, vram_budget=vram, ram_cache=ram, **kw)
        except SluiceError:           # this load measured more graph memory than the last: one slot more room
            vram += 2 * plan.device_slot_bytes
            continue
        plan = eng.plan
        if vram is not None and plan.slots_per_bank == slots_per_bank:
            return eng
        eng.close()
        del eng
        if vram is None:
            vram = plan.dense_bytes + plan.kv_bytes + plan.workspace_bytes + 2 * slots_per_bank * plan.device_slot_bytes
        else:                         # closed loop on the slot count the engine really gave
            vram += 2 * (slots_per_bank - plan.slots_per_bank) * plan.device_slot_bytes
        ram = ram_blocks * plan.block_bytes
    raise AssertionError(f"could not size a budget for {slots_per_bank} slots a bank (last plan: {plan})")


def token_ids(eng, prompt, max_new_tokens: int, **params) -> list[int]:
    from engine import GenerationParams
    params = {"temperature": 0, "ignore_eos": True, **params}
    return [e.token_id for e in eng.generate(prompt, GenerationParams(max_new_tokens=max_new_tokens, **params))]
