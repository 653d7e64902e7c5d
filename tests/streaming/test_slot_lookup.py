"""A decode step's experts launched from the slot table (Options.slot_lookup, engine/runtime/slot_table.py): the
launch reads the slots of the experts whose blocks the table holds, before the host has read the routed ids, and
the host adds the others on top. gpt-oss experts stream through 3 slots a bank, so most steps have misses and
evictions between lookups; the tokens stay transformers'. On the CPU the decode kernel runs in Triton's
interpreter, put in place by hand as in test_activation_kernels.py."""
import functools

import numpy as np
import pytest
import torch

from engine.format.repack import repack
from engine.options import Options
from engine.runtime.slot_table import SlotTable
from engine.tools.demo import build_hf_model
from tests.engine.reference import load_reference, reference_greedy
from tests.streaming.sized import engine_with_slots, token_ids

pytest.importorskip("triton")
from kernels.moe_decode import moe_decode  # noqa: E402
from tests.streaming.test_activation_kernels import CPU_DECODE, CPU_PREFILL  # noqa: E402
from kernels.moe_prefill import PrefillKernel  # noqa: E402

PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 1, 300]
NEW_TOKENS = 6


def test_a_placed_block_enters_its_row_once_landed_and_leaves_when_evicted():
    table = SlotTable(num_layers=2, num_experts=4, device=torch.device("cpu"))
    landed = {3: False}
    table.placed((1, 2), 3)
    assert table.send(1, lambda layer, slot: landed[slot]).tolist() == [-1, -1, -1, -1]     # copy in flight
    landed[3] = True
    assert table.send(1, lambda layer, slot: landed[slot]).tolist() == [-1, -1, 3, -1]
    assert table.device[1].tolist() == [-1, -1, 3, -1]
    assert table.look_up(1, torch.tensor([2, 0])).tolist() == [[3, -1]]
    table.evicted((1, 2))                        # its slot goes to another block, placed elsewhere again later
    table.placed((1, 2), 0)
    landed[0] = False
    assert table.send(1, lambda layer, slot: landed[slot]).tolist() == [-1, -1, -1, -1]    # never the old slot
    assert table.device[1].tolist() == [-1, -1, -1, -1] and table.device[0].tolist() == [-1] * 4


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("slot_lookup")
    hf = build_hf_model("gpt_oss", tmp / "hf", num_layers=2, with_tokenizer=False, seed=5, swiglu_limit=1.0)
    return hf, repack(hf, tmp / "bf16", quant="bf16")


class Spy:
    """Counts calls of one method of a class (and those whose argument `arg` is not empty)."""

    def __init__(self, monkeypatch, owner, name, arg: int | None = None):
        self.calls = self.nonempty = 0
        real = getattr(owner, name)

        def counted(*args, **kw):
            self.calls += 1
            self.nonempty += arg is not None and bool(args[arg])
            return real(*args, **kw)
        monkeypatch.setattr(owner, name, counted)


def _lookup_tokens(path, monkeypatch) -> tuple[list[int], int, tuple[int, int]]:
    """(greedy tokens with the slot table on, lookups, (their finishing calls, those that added experts))."""
    from engine.runtime.expert_compute import LayerCompute
    look_up = Spy(monkeypatch, LayerCompute, "look_up")
    rest = Spy(monkeypatch, LayerCompute, "launch_rest", arg=2)
    eng = engine_with_slots(path, slots_per_bank=3, ram_blocks=4, cpu_experts="off",
                            options=Options(slot_lookup=True, kernel_warmup=False))
    try:
        compute = eng.runner.experts.compute
        if not eng.runner.is_cuda:
            compute.kernel = functools.partial(moe_decode, config=CPU_DECODE, activation=eng.runner.model.expert_kernel)
            compute.prefill_kernel = PrefillKernel(CPU_PREFILL, eng.runner.model.expert_kernel)
        assert eng.runner.banks.table is not None
        tokens = token_ids(eng, PROMPT, NEW_TOKENS)
        assert eng.telemetry()["ram_cache"]["evictions"] > 0
        return tokens, look_up.calls, (rest.calls, rest.nonempty)
    finally:
        eng.close()


def test_experts_launched_from_the_slot_table_give_transformers_tokens(gpt_oss, monkeypatch):
    hf, path = gpt_oss
    expected = reference_greedy(load_reference(hf), PROMPT, NEW_TOKENS)
    tokens, lookups, (finished, added) = _lookup_tokens(path, monkeypatch)
    assert tokens == expected
    assert lookups == finished == 2 * (NEW_TOKENS - 1)    # both MoE layers of every decode step
    assert 0 < added < lookups                            # 3 slots a bank: some steps add misses on top


def test_a_table_that_keeps_evicted_blocks_gives_other_tokens(gpt_oss, monkeypatch):
    """The comparison above can fail: a table that never forgets an evicted block launches experts from slots that
    now hold other blocks."""
    hf, path = gpt_oss
    expected = reference_greedy(load_reference(hf), PROMPT, NEW_TOKENS)
    monkeypatch.setattr(SlotTable, "evicted", lambda self, key: None)
    real_placed = SlotTable.placed

    def placed_keeping_the_old_entry(self, key, slot):
        real_placed(self, key, slot)
        self._stale[key[0]].discard(key[1])
    monkeypatch.setattr(SlotTable, "placed", placed_keeping_the_old_entry)
    tokens, _, _ = _lookup_tokens(path, monkeypatch)
    assert tokens != expected


def test_the_table_is_off_by_default(gpt_oss):
    _, path = gpt_oss
    eng = engine_with_slots(path, slots_per_bank=3, ram_blocks=4, options=Options(kernel_warmup=False))
    try:
        assert eng.runner.banks.table is None
    finally:
        eng.close()


def test_sent_rows_match_the_slots_that_hold_the_blocks(gpt_oss, monkeypatch):
    """Each row a lookup read names, for every expert it holds, the slot the residency policy has it in."""
    _, path = gpt_oss
    from engine.runtime.expert_compute import LayerCompute
    checked = []
    real = LayerCompute.look_up

    def checking(self, layer, *args):
        sent = real(self, layer, *args)
        for expert in np.flatnonzero(sent >= 0):
            assert self.banks.holds((layer, int(expert)))
            assert self.banks._resident[self.banks.bank_of(layer)][(layer, int(expert))] == sent[expert]
        checked.append(int((sent >= 0).sum()))
        return sent
    monkeypatch.setattr(LayerCompute, "look_up", checking)
    _lookup_tokens(path, monkeypatch)
    assert checked and max(checked) > 0
