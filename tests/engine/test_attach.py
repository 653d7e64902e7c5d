"""Kernels attached to a loaded model in one place (engine/runtime/attach.py): every piece that can run one gets
its checked kernel, the pieces then run it, the tokens stay transformers', and eager attaches none. On a GPU as
the engine runs; without one the kernels run in Triton's interpreter on the CPU (tests/conftest.py sets
TRITON_INTERPRET), attached as on a GPU and checked by the real self-check."""
import pytest
import torch

import engine
from engine.format.repack import repack
from engine.options import Options
from engine.runtime import attach, runner
from engine.runtime.attach import attach_kernels, attached_kernels
from engine.tools.demo import build_hf_model
import kernels.selfcheck
from tests.engine.reference import load_reference, reference_greedy
from tests.families.hybrid_models import build_hybrid
from tests.families.qwen4_models import build_qwen4
from tests.streaming.sized import token_ids

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROMPT = [5, 17, 42, 99, 3, 250, 7, 64]
NEW_TOKENS = 6
# What each family's pieces take: OLMoE norms q and k over the projection; gpt-oss's attention takes the kernel
# with its sinks, its router the top-k softmax one; Qwen3-Next's (1 + w) norms the grouped norm's kernel (one group),
# its gated attention both kernels, its DeltaNets (qwen4_exp's too) the fused decode step; MLA's latent norms theirs
# and its decode token the latent attention kernel, its grouped router the grouped one; qwen4_exp's hyper-connections
# their steps' kernels.
EXPECTED = {
    "olmoe": {"RmsNorm.kernel", "Attention.rope_kernel", "Attention.attention_kernel", "Router.kernel"},
    "gpt_oss": {"RmsNorm.kernel", "Attention.rope_kernel", "Attention.attention_kernel", "TopKSoftmaxRouter.kernel"},
    "qwen3_next": {"GatedAttention.rope_kernel", "GatedAttention.attention_kernel", "Router.kernel",
                   "OffsetRmsNorm.kernel", "GatedDeltaNet.decode_kernel"},
    "deepseek_v3": {"RmsNorm.kernel", "MlaAttention.decode_kernel", "RouterPiece.kernel"},
    "qwen4_exp_text": {"Router.kernel", "GroupedNorm.kernel", "OffsetRmsNorm.kernel", "DeltaNet.decode_kernel",
                       "IndexedAttention.masked_kernel",          # QSA: its one token over its picks
                       "MixSteps.kernel"},
}
# the kernel functions the self-checks hand out, counted where the pieces call them
KERNELS = {"RmsNorm.kernel": ("kernels.rms_norm", "rms_norm_kernel"), "rope_kernel": ("kernels.rope", "rope_pair"),
           "GroupedNorm.kernel": ("kernels.rms_norm", "grouped_norm_kernel"),
           "MixSteps.kernel": ("kernels.hyper_mix", "gated_mean"),
           "OffsetRmsNorm.kernel": ("kernels.rms_norm", "grouped_norm_kernel"),
           "attention_kernel": ("kernels.decode_attention", "decode_attention"),
           "Router.kernel": ("kernels.router", "router_kernel"),
           "TopKSoftmaxRouter.kernel": ("kernels.router", "router_kernel"),
           "RouterPiece.kernel": ("kernels.router", "grouped_router_kernel"),
           "decode_kernel": ("kernels.mla_decode", "mla_decode"),
           "masked_kernel": ("kernels.decode_attention", "masked_attention"),
           "GatedDeltaNet.decode_kernel": ("kernels.deltanet_decode", "deltanet_decode"),
           "DeltaNet.decode_kernel": ("kernels.deltanet_decode", "deltanet_decode")}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def model_dir(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "qwen3_next":
        build_hybrid(request.param, tmp / "hf", seed=3)
    elif request.param == "qwen4_exp_text":
        build_qwen4(tmp / "hf", seed=3)
    else:
        build_hf_model(request.param, tmp / "hf", num_layers=2, with_tokenizer=False, seed=3)
    repack(tmp / "hf", tmp / "sluice", quant="bf16")
    return tmp


@pytest.fixture
def attach_on_cpu(monkeypatch, tmp_path):
    """engine.load attaches the pieces' kernels on the CPU as it does on a GPU; verdicts in a private cache."""
    monkeypatch.setenv("SLUICE_DATA_DIR", str(tmp_path))                 # fresh verdicts
    real = attach.attach_kernels

    def attach_here(model, weights, device, dtype, options, warn):
        with monkeypatch.context() as m:
            m.setattr(attach, "attaches", lambda options, device: not options.eager)
            real(model, weights, device, dtype, options, warn)
    monkeypatch.setattr(runner, "attach_kernels", attach_here)


def _count_calls(monkeypatch) -> dict[str, int]:
    """Calls of each kernel function but the self-checks' own (on a GPU the decode graphs' warm-up runs the
    pieces' python once, their replays not at all)."""
    import importlib

    from kernels import selfcheck
    calls, checking = {name: 0 for name in KERNELS}, []

    def run_check(*args, real=selfcheck._run):
        checking.append(True)
        try:
            return real(*args)
        finally:
            checking.pop()
    monkeypatch.setattr(selfcheck, "_run", run_check)
    for name, (module_name, attr) in KERNELS.items():
        module = importlib.import_module(module_name)

        def counted(*args, real=getattr(module, attr), name=name, **kw):
            calls[name] += not checking
            return real(*args, **kw)
        monkeypatch.setattr(module, attr, counted)
    return calls


def test_attached_kernels_run_and_give_transformers_tokens(model_dir, attach_on_cpu, monkeypatch):
    calls = _count_calls(monkeypatch)
    eng = engine.load(model_dir / "sluice", device=DEVICE, dtype="float32", max_context=32)
    try:
        ours = token_ids(eng, PROMPT, NEW_TOKENS)
        attached = attached_kernels(eng.runner.model)
        routers = [block.router for block in eng.runner.model.blocks if getattr(block, "router", None) is not None]
    finally:
        eng.close()
    assert set(attached) == EXPECTED[eng.spec.family]
    for kind in attached:
        assert calls[kind if kind in KERNELS else kind.split(".")[1]], kind     # the pieces ran what was attached
    assert all(router.best_first for router in routers)        # the decode step's guesses need no sort
    assert ours == reference_greedy(load_reference(model_dir / "hf", "bf16"), PROMPT, NEW_TOKENS)


def test_eager_attaches_nothing_and_a_failed_check_keeps_torch(model_dir, monkeypatch, tmp_path):
    eng = engine.load(model_dir / "sluice", device=DEVICE, dtype="float32", max_context=32)
    eng.close()
    model = eng.runner.model
    _detach(model)
    attach_kernels(model, {}, torch.device("cuda"), torch.float32, Options(eager=True), print)
    assert attached_kernels(model) == {}                            # eager returns before touching any GPU
    import kernels.router
    monkeypatch.setattr(kernels.router, "router_kernel", lambda h, w, k, renormalize, **kw: kernels.router.router_ref(
        h, w, k, not renormalize))                  # a router kernel that renormalises wrongly (and ignores top-k first)
    monkeypatch.setenv("SLUICE_DATA_DIR", str(tmp_path))                 # fresh verdicts
    monkeypatch.setattr(attach, "attaches", lambda options, device: True)
    warnings = []
    attach_kernels(model, {}, torch.device(DEVICE), torch.float32, Options(), warnings.append)
    expected = EXPECTED[eng.spec.family]
    routers = {"Router.kernel", "TopKSoftmaxRouter.kernel"}
    assert set(attached_kernels(model)) == expected - routers
    assert any(w.startswith("Router kernel disabled") for w in warnings) == bool(routers & expected)


def _detach(model) -> None:
    for piece in attach._pieces(model):
        for name in ("kernel", "rope_kernel", "attention_kernel", "decode_kernel", "masked_kernel"):
            if hasattr(piece, name):
                setattr(piece, name, None)


def test_ungated_expert_blocks_take_no_expert_kernel(monkeypatch):
    """Nemotron-H's blocks have no gate field, which the GPU expert kernels read: its experts keep torch."""
    from types import SimpleNamespace

    from engine.format.layout import block_layout
    from kernels.activation import RELU2
    monkeypatch.setattr(attach, "attaches", lambda options, device: True)
    monkeypatch.setattr(kernels.selfcheck, "select_moe_decode", lambda *args, **kw: pytest.fail("a kernel checked"))
    model, layout = SimpleNamespace(expert_kernel=RELU2), block_layout(32, 64, "int8", gated=False)
    assert attach.expert_kernels(model, layout, 2, torch.device(DEVICE), torch.float32, Options(), print) == \
        (None, None, None)
