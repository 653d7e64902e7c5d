"""The prefill kernel in the streaming runtime: a prompt's experts computed one kernel call per batch (the
resident ones, then each batch brought in) while the experts stream through 3 slots a bank, against the
torch loop. On a GPU the runner picks the kernel (after its self-check); on the
CPU, where the runner picks kernels for CUDA only, it is put in place by hand and runs in Triton's
interpreter (float32 compute both ways)."""
import pytest
import torch

from engine.format.repack import repack
from engine.tools.demo import build_hf_model
from tests.engine.reference import load_reference, reference_greedy
from tests.streaming.sized import engine_with_slots, token_ids

pytest.importorskip("triton")
from kernels.moe_prefill import PrefillConfig, PrefillKernel  # noqa: E402

PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 1, 300]     # 10 tokens: more than the decode kernel's 4
NEW_TOKENS = 8
CPU_CONFIG = PrefillConfig(16, 32, 64)    # tiles every format takes (mxfp4: 32-value groups), few interpreted programs


class Counting:
    """The engine's prefill kernel, counting the experts of each call."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, []

    def route(self, *args):
        return self.kernel.route(*args)

    def __call__(self, x, bank, routing, slot_of, *rest, **kw):
        self.calls.append(len(slot_of))
        return self.kernel(x, bank, routing, slot_of, *rest, **kw)


@pytest.fixture(scope="module")
def olmoe(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("olmoe")
    build_hf_model("olmoe", tmp / "hf", num_layers=3, with_tokenizer=False, seed=3)
    from transformers import AutoModelForCausalLM
    ref = AutoModelForCausalLM.from_pretrained(tmp / "hf", dtype=torch.float32, experts_implementation="eager",
                                               attn_implementation="eager")
    out = ref.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    return tmp, out[0, len(PROMPT):].tolist()


def _tokens(path, monkeypatch, kernel: bool) -> tuple[list[int], Counting | None]:
    # the slots' path on every device (the CPU device would compute int8 experts where they sit in RAM)
    eng = engine_with_slots(path, slots_per_bank=3, ram_blocks=4, cpu_experts="off")
    try:
        experts = eng.runner.experts.compute
        counting = None
        if kernel:
            chosen = experts.prefill_kernel if eng.runner.is_cuda else PrefillKernel(CPU_CONFIG)
            assert chosen is not None, "the runner did not pick the prefill kernel on this GPU"
            experts.prefill_kernel = counting = Counting(chosen)
        else:
            experts.prefill_kernel = None                       # the torch loop
        return token_ids(eng, PROMPT, NEW_TOKENS), counting
    finally:
        eng.close()


def test_prefill_kernel_gives_transformers_tokens_while_streaming(olmoe, monkeypatch):
    tmp, expected = olmoe
    path = repack(tmp / "hf", tmp / "sluice-bf16", quant="bf16")
    tokens, counting = _tokens(path, monkeypatch, kernel=True)
    assert tokens == expected
    assert len(counting.calls) > 3 and max(counting.calls) <= 3      # several calls a layer, one bank's worth each


def test_prefill_kernel_on_int8_experts_gives_the_torch_paths_tokens(olmoe, monkeypatch):
    """int8 experts (the benchmarks' format): the kernel multiplies the weights the torch path dequantises."""
    tmp, _ = olmoe
    path = repack(tmp / "hf", tmp / "sluice-int8", quant="int8")
    with_kernel, counting = _tokens(path, monkeypatch, kernel=True)
    assert with_kernel == _tokens(path, monkeypatch, kernel=False)[0] and counting.calls


@pytest.mark.parametrize("quant", ["nvfp4", "mxfp4"])
def test_prefill_kernel_on_fp4_experts_gives_transformers_tokens(olmoe, monkeypatch, quant):
    """nvfp4 / mxfp4 experts (the formats huge checkpoints ship in): the kernel dequantises in registers to
    the very weights transformers holds after the same quantisation round trip."""
    tmp, _ = olmoe
    path = repack(tmp / "hf", tmp / f"sluice-{quant}", quant=quant)
    tokens, counting = _tokens(path, monkeypatch, kernel=True)
    assert tokens == reference_greedy(load_reference(tmp / "hf", quant), PROMPT, NEW_TOKENS)
    assert len(counting.calls) > 3
