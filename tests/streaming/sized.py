"""Streaming tests: a CUDA runtime model with an exact number of slots a bank."""
import torch

from engine.runtime.cuda_model import CudaModel

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def model_with_slots(path, slots_per_bank: int, ram_blocks: int, **kw) -> CudaModel:
    """A CudaModel whose VRAM budget leaves exactly `slots_per_bank` slots a bank, and a RAM cache of
    `ram_blocks` blocks. The budget is derived from a model's own plan: on a GPU the workspace it
    charges includes measured CUDA-graph memory, which is larger for the first model of a process
    (library workspaces made once), so the sizing is repeated until it holds."""
    kw = {"device": DEVICE, "dtype": torch.float32, "max_tokens": 64, **kw}
    vram = ram = None
    for _ in range(4):
        model = CudaModel(path, vram_budget=vram, ram_cache=ram, **kw)
        plan = model.plan
        if vram is not None and plan.slots_per_bank == slots_per_bank:
            return model
        model.close()
        del model
        vram = plan.dense_bytes + plan.kv_bytes + plan.workspace_bytes + 2 * slots_per_bank * plan.block_bytes
        ram = ram_blocks * plan.block_bytes
    raise AssertionError(f"could not size a budget for {slots_per_bank} slots a bank (last plan: {plan})")
