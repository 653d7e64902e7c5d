"""The one runtime (streaming experts, speculative prefetch, the decode step), run on whatever
device there is, must produce transformers' greedy tokens with budgets that force experts to stream.
On the CPU it runs torch math and synchronous copies; on a GPU the Triton kernels, the copy stream
and the CUDA graphs (float32 compute)."""
import pytest
import torch

from engine.format.file_table import FileTable
from engine.model.model import Model
from engine.options import Options
from engine.runtime.attach import attached_kernels
from engine.tools.demo import build_hf_model
from engine.format.repack import repack

from tests.streaming.sized import engine_with_slots, token_ids

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 1, 300]
NEW_TOKENS = 16


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral", "olmoe", "qwen2_moe", "gpt_oss"])
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
    return engine_with_slots(path, slots_per_bank, ram_blocks, **kw)


def test_greedy_tokens_equal_transformers_while_streaming(family_model):
    path, expected = family_model
    eng = _streaming_model(path)
    try:
        assert token_ids(eng, PROMPT, NEW_TOKENS) == expected
        snap = eng.telemetry()
    finally:
        eng.close()
    spec = eng.spec
    total_blocks = len(spec.moe_layers) * spec.num_experts
    assert eng.plan.slots_per_bank == 3 and eng.runner.cache.num_slots == 4 < total_blocks
    assert snap["disk"]["reads"] > total_blocks            # experts really streamed (re-read after eviction)
    assert snap["speculation"]["predicted"] > 0 and snap["prefetch"]["issued"] > 0


def _prefetch_ab(path, expected, option: str, ram_blocks: int) -> tuple[dict, dict]:
    """Telemetry of the same generation with the prefetch `option` at the best guess only, then at every guess;
    the tokens must stay transformers' in both."""
    snaps = []
    for value in (1, 1000):
        eng = _streaming_model(path, ram_blocks=ram_blocks, options=Options(**{option: value}))
        try:
            assert token_ids(eng, PROMPT, NEW_TOKENS) == expected
            snaps.append(eng.telemetry())
        finally:
            eng.close()
    return snaps[0], snaps[1]


def test_reading_ahead_for_fewer_guesses_reads_less_from_disk(family_model):
    """Reading ahead for every guess of the next layer reads more from the disk (the wrong guesses)
    than for the best one only (a GPU's default is the better half)."""
    best, every = _prefetch_ab(*family_model, "prefetch_reads", ram_blocks=6)
    assert best["prefetch"]["issued"] < every["prefetch"]["issued"]
    assert best["disk"]["reads"] <= every["disk"]["reads"]


def test_copying_ahead_for_fewer_guesses_copies_less(family_model):
    """RAM hits copied ahead into the other bank for every guess of the next layer copy more over the
    link (the wrong guesses) than for the best one (the default is the better half)."""
    best, every = _prefetch_ab(*family_model, "prefetch_copies", ram_blocks=12)
    assert best["prefetch"]["issued"] < every["prefetch"]["issued"]
    assert best["h2d"]["bytes"] < every["h2d"]["bytes"]


@pytest.mark.parametrize("defer", [True, False])
@pytest.mark.parametrize("ram_blocks", [2, 4])
def test_prefetch_deferred_behind_the_next_mixer_gives_the_same_tokens(family_model, defer, ram_blocks):
    """On a GPU a decode step's prefetch for layer L+1 is issued after L+1's mixer is enqueued (the GPU
    computes it meanwhile); the same tokens and guesses either way, and the order is the promised one.
    With 2 RAM blocks the wrong guesses' reads must settle before the layer's own reads need a block."""
    path, expected = family_model
    eng = _streaming_model(path, slots_per_bank=2, ram_blocks=ram_blocks)
    runner, experts = eng.runner, eng.runner.experts
    runner.defer_prefetch = defer                       # the GPU's default, here on whatever device there is
    order = []
    run_layer, prefetch = runner.step.run_layer, experts._prefetch
    runner.step.run_layer = lambda layer: (order.append(("mixer", layer)), run_layer(layer))[1]
    experts._prefetch = lambda layer, guesses: (order.append(("prefetch", layer)), prefetch(layer, guesses))[1]
    calls, counted = [], []                            # every layer's call, and its use counts (deferred or not)
    run, note_used = experts.run, experts.banks.note_used
    experts.run = lambda layer, *a, **k: (calls.append(layer), run(layer, *a, **k))[1]
    experts.banks.note_used = lambda layer, routed: (counted.append(len(set(routed))), note_used(layer, routed))[1]
    try:
        assert token_ids(eng, PROMPT, NEW_TOKENS) == expected
        snap = eng.telemetry()
    finally:
        eng.close()
    assert snap["speculation"]["predicted"] > 0 and snap["prefetch"]["issued"] > 0
    # the accounting a deferred step leaves for later is all done: each call's uses, hits and misses counted
    assert len(counted) == len(calls) and snap["vram"]["hits"] + snap["vram"]["misses"] == sum(counted)
    # deferred, each prefetch of layer L comes right after L's mixer; else during the layer before it
    prefetched = [(i, layer) for i, (what, layer) in enumerate(order) if what == "prefetch"]
    assert [order[i - 1] == ("mixer", layer) for i, layer in prefetched] == [defer] * len(prefetched)


def test_deferred_bookkeeping_of_layers_without_misses_scores_the_same(family_model):
    """Deferred (a GPU's decode), a layer whose experts all sit in VRAM launches straight after its sync and
    leaves its RAM-side bookkeeping (speculation scored, finished copies unlocked) to the deferred work: with
    every block resident the tokens and the guesses scored are those of the undeferred run."""
    path, expected = family_model
    snaps = []
    for defer in (False, True):
        eng = _streaming_model(path, slots_per_bank=16, ram_blocks=8)       # 8 experts, 3 layers: room for all
        eng.runner.defer_prefetch = defer
        try:
            assert token_ids(eng, PROMPT, NEW_TOKENS) == expected
            snaps.append(eng.telemetry())
        finally:
            eng.close()
    # (misses and prefetches used depend on when background reads land, so they may differ by one between runs)
    assert snaps[1]["vram"]["hits"] > 0 and snaps[1]["speculation"]["predicted"] > 0
    assert snaps[1]["speculation"] == snaps[0]["speculation"]


def test_hybrid_cpu_experts_give_the_same_tokens(family_model):
    """Every RAM-resident expert of a decode step computed by the CPU from its RAM block (on a GPU
    beside the kernels' share): the partial sums still give transformers' tokens."""
    path, expected = family_model
    eng = _streaming_model(path, ram_blocks=12, cpu_experts="all")
    try:
        assert token_ids(eng, PROMPT, NEW_TOKENS) == expected
        snap = eng.telemetry()
    finally:
        eng.close()
    assert snap["cpu"]["experts"] > 0 and snap["cpu"]["bytes"] == snap["cpu"]["experts"] * eng.model.layout.block_bytes
    assert snap["disk"]["reads"] > 0 and snap["vram"]["hits"] > 0



def test_hybrid_prefill_of_a_few_tokens_gives_the_same_tokens(family_model):
    """A prompt of 3 tokens after a first one (its experts now in RAM): the prefill is small enough for the
    CPU's share, with several tokens an expert."""
    path, _ = family_model
    tokens = {}
    for mode in ("off", "all"):
        eng = _streaming_model(path, ram_blocks=12, cpu_experts=mode)
        try:
            token_ids(eng, PROMPT, 2)
            tokens[mode] = token_ids(eng, PROMPT[:3], 6)
            cpu = eng.telemetry()["cpu"]["experts"]
        finally:
            eng.close()
    assert tokens["all"] == tokens["off"] and cpu > 0


def test_embedding_table_read_from_the_file_gives_the_same_tokens(family_model):
    """An untied table stays in the model's file: the decode step starts from the row read there (int8 dense
    weights: quantised row by row), prefill reads its rows there. Tokens unchanged."""
    path, expected = family_model
    eng = _streaming_model(path)
    try:
        model = eng.runner.model
        untied = model.lm_head is not model.embed_tokens
        in_file = untied and type(model).embed is Model.embed
        assert isinstance(model.embed_tokens, FileTable) == in_file == model.embed_in_ram
        assert (eng.runner.step.x_in is not None) == in_file
        assert token_ids(eng, PROMPT, NEW_TOKENS) == expected
    finally:
        eng.close()


def test_eager_switch_gives_the_same_tokens(family_model):
    path, expected = family_model
    eng = _streaming_model(path, slots_per_bank=2, ram_blocks=2, options=Options(eager=True))
    try:
        compute = eng.runner.experts.compute
        assert not eng.runner.step.use_graphs and compute.kernel is None and compute.prefill_kernel is None
        assert not attached_kernels(eng.runner.model)               # no piece asks for a kernel on its own
        assert token_ids(eng, PROMPT, NEW_TOKENS) == expected
    finally:
        eng.close()


@pytest.mark.gpu
def test_engine_on_cuda_uses_the_gpu_path_and_matches_transformers(family_model):
    """engine.load(device="cuda") runs the Triton kernels and CUDA graphs and still gives the
    reference tokens in float32, within its VRAM budget."""
    import engine
    from engine.params import GenerationParams
    import gc
    path, expected = family_model
    gc.collect()
    before = torch.cuda.memory_allocated()           # other tests' leftovers in this process
    eng = engine.load(path, device="cuda", dtype="float32", vram_budget=None, ram_cache=None)
    try:
        assert eng.runner.step.use_graphs
        # the Triton kernels cover the families that declare their experts' activation (gpt-oss's clamped SwiGLU too)
        assert (eng.runner.experts.compute.kernel is not None) == (eng.runner.model.expert_kernel is not None)
        ids = [ev.token_id for ev in eng.generate(PROMPT, GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0))]
        assert ids == expected
        assert eng.telemetry()["vram"]["peak_bytes"] - before <= eng.plan.vram_budget_bytes
    finally:
        eng.close()


class _TrackedRead:
    """A store read whose result() the decode thread has (or has not yet) waited for."""

    def __init__(self, future):
        self.future, self.waited = future, False

    def result(self, timeout=None):
        self.waited = True
        return self.future.result(timeout)

    def __getattr__(self, name):          # done, cancel, exception: as the future's
        return getattr(self.future, name)


def _reads_ahead_before_the_layer_waited(eng) -> int:
    """Wrap the engine's store: count the next layer's reads that started while a read of the running
    layer was still not waited for."""
    experts, running, own, early = eng.runner.experts, [None], [], [0]
    submit, run = experts.store.submit, experts.run

    def tracked_submit(layer, expert, buf):
        read = _TrackedRead(submit(layer, expert, buf))
        if layer == running[0]:
            own.append(read)
        elif any(not r.waited for r in own):
            early[0] += 1
        return read

    def tracked_run(layer, *args, **kwargs):
        running[0] = layer
        own.clear()
        return run(layer, *args, **kwargs)
    experts.store.submit, experts.run = tracked_submit, tracked_run
    return early


def test_early_read_ahead_starts_before_the_layer_waits_and_gives_the_same_tokens(family_model):
    """The next layer's read-ahead is queued right behind the running layer's own reads, before the decode
    thread waits for them (the disk is not left idle at the layer's end); a prompt reads no layer ahead. The
    tokens stay transformers'."""
    path, expected = family_model
    eng = _streaming_model(path, ram_blocks=6)
    early = _reads_ahead_before_the_layer_waited(eng)
    try:
        assert token_ids(eng, PROMPT, 1) == expected[:1]
        assert early[0] == 0                                    # a prompt's pass: no guesses, no reads ahead
        assert token_ids(eng, PROMPT, NEW_TOKENS) == expected
        assert early[0] > 0
    finally:
        eng.close()
