"""One decode token's attention kernel (kernels/decode_attention.py) against the models' torch path and its
self-check (the kernel on the models' path: tests/engine/test_attach.py)."""
import pytest
import torch

from kernels import selfcheck
from kernels.decode_attention import attention_ref, decode_attention, masked_attention, masked_attention_ref
from kernels.selfcheck import select_decode_attention, select_masked_attention


def _case(device, num_q_heads, num_kv_heads, head_dim, held, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(device) for shape in
            ((1, num_q_heads, head_dim), (held, num_kv_heads, head_dim), (held, num_kv_heads, head_dim))]


@pytest.mark.parametrize("num_q_heads,num_kv_heads,head_dim,window", [
    (16, 16, 64, None),          # OLMoE-like: no grouping
    (8, 2, 64, None),            # grouped heads
    (4, 1, 80, None),            # head dim not a power of two
    (8, 4, 64, 50),              # a sliding window
])
@pytest.mark.parametrize("position", [0, 63, 64, 199])
def test_attends_as_the_torch_path(device, num_q_heads, num_kv_heads, head_dim, window, position):
    q, k, v = _case(device, num_q_heads, num_kv_heads, head_dim, 200)
    where = torch.tensor([position], device=device)
    out = decode_attention(q, k, v, where, window)
    assert out.shape == (1, num_q_heads * head_dim)
    assert torch.allclose(out, attention_ref(q, k, v, where, window), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("split", [64, 128, 704])              # 704: every key in one program a head
@pytest.mark.parametrize("window", [None, 200])                 # a window that starts inside a split
@pytest.mark.parametrize("position", [127, 128, 383, 699])      # the last key of a split, the first of one
def test_a_long_context_split_over_programs_attends_as_the_torch_path(device, split, window, position):
    q, k, v = _case(device, 4, 2, 64, 700, seed=1)
    where = torch.tensor([position], device=device)
    out = decode_attention(q, k, v, where, window, split=split)
    assert torch.allclose(out, attention_ref(q, k, v, where, window), rtol=1e-4, atol=1e-5)


def test_keys_past_the_position_are_never_read(device):
    q, k, v = _case(device, 4, 2, 32, 400)
    k[140:], v[140:] = float("nan"), float("nan")                  # the buffer's unwritten rest: two splits on
    out = decode_attention(q, k, v, torch.tensor([139], device=device), None)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, attention_ref(q, k[:140], v[:140], torch.tensor([139], device=device), None),
                          rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("window", [None, 50])
@pytest.mark.parametrize("position", [0, 150, 299])             # the first, a middle and the last of the buffer
def test_sinks_attend_as_the_torch_path(device, window, position):
    q, k, v = _case(device, 8, 2, 64, 300, seed=2)               # groups of 4 query heads a kv head
    sinks = torch.randn(8, generator=torch.Generator().manual_seed(3)).to(device) * 2
    where = torch.tensor([position], device=device)
    out = decode_attention(q, k, v, where, window, sinks=sinks)
    torch.testing.assert_close(out, attention_ref(q, k, v, where, window, sinks=sinks), rtol=1e-4, atol=1e-5)
    q, k, v, sinks = (t.to(torch.bfloat16) for t in (q, k, v, sinks))     # the checkpoint's dtype, sinks too
    out = decode_attention(q, k, v, where, window, sinks=sinks)
    torch.testing.assert_close(out, attention_ref(q, k, v, where, window, sinks=sinks), rtol=2e-2, atol=2e-2)


def test_a_dominant_sink_takes_its_heads_attention_and_a_negligible_one_none(device):
    q, k, v = _case(device, 4, 2, 32, 200, seed=4)
    sinks = torch.tensor([30.0, -30.0, 30.0, -30.0], device=device)       # unscaled logits, as the checkpoint's
    where = torch.tensor([120], device=device)
    out = decode_attention(q, k, v, where, None, sinks=sinks).view(4, 32)
    assert out[0::2].abs().max() < 1e-6                                     # the sink's column holds ~all the weight
    torch.testing.assert_close(out[1::2], attention_ref(q, k, v, where, None).view(4, 32)[1::2], rtol=1e-4, atol=1e-5)


def test_selfcheck_passes_the_kernel_and_refuses_a_wrong_one(device, monkeypatch):
    monkeypatch.setattr(selfcheck, "_warnings", [])
    fn, verdict = select_decode_attention(8, 2, 32, torch.float32, None, device)
    assert verdict.ok and fn is decode_attention
    fn, verdict = select_decode_attention(8, 2, 32, torch.float32, 16, device,        # the window forgotten
                                          kernel=lambda q, k, v, where, window: decode_attention(q, k, v, where, None))
    assert not verdict.ok and fn is None


def test_selfcheck_with_sinks_passes_the_kernel_and_refuses_one_that_ignores_them(device, monkeypatch):
    monkeypatch.setattr(selfcheck, "_warnings", [])
    fn, verdict = select_decode_attention(8, 2, 32, torch.float32, 16, device, sinks=True)
    assert verdict.ok and fn is decode_attention
    ignores_sinks = lambda q, k, v, where, window, sinks: decode_attention(q, k, v, where, window)  # noqa: E731
    fn, verdict = select_decode_attention(8, 2, 32, torch.float32, None, device, sinks=True,  # another key: not cached
                                          kernel=ignores_sinks)
    assert not verdict.ok and fn is None


def test_the_models_attention_takes_the_kernel_for_one_token_only(device, monkeypatch):
    """kernels.decode_attention.attention (what engine/runtime/attach.py sets on an attention): one token whose
    keys lie as the state holds them through the kernel; a prompt, or keys in another layout, the reference."""
    import kernels.decode_attention as module
    ran = []
    monkeypatch.setattr(module, "decode_attention",
                        lambda *args, **kw: ran.append(args[0].shape[0]) or attention_ref(*args, **kw))
    q, k, v = _case(device, 4, 2, 16, 9)
    module.attention(q, k, v, torch.tensor([8], device=device), None)
    prompt = torch.randn(9, 4, 16).to(device)
    module.attention(prompt, k, v, torch.arange(9, device=device), None)
    strided = torch.randn(2, 9, 16).to(device).transpose(0, 1)                    # [S, Hkv, D], not contiguous
    module.attention(q, strided, strided, torch.tensor([8], device=device), None)
    assert ran == [1]


@pytest.mark.parametrize("keep,dropped", [(0.25, 0), (0.5, 130), (1.0, 0), (0.0, 0)])
def test_a_mask_of_gathered_rows_attends_as_the_torch_path(device, keep, dropped):
    """qwen4_exp's QSA: one query over the rows its indexer picked (gathered, a mask of those that count): sparse,
    whole splits dropped (no visible row in a program's 64), all, and only the query's own last row."""
    q, k, v = _case(device, 8, 2, 64, 200, seed=3)
    visible = torch.rand(1, 200, generator=torch.Generator().manual_seed(4)) < keep
    visible[0, :dropped], visible[0, -1] = False, True
    visible = visible.to(device)
    out = masked_attention(q, k, v, visible)
    assert torch.allclose(out, masked_attention_ref(q, k, v, visible), rtol=1e-4, atol=1e-5)
    assert not torch.isnan(out).any()
    if keep == 0.0:                                            # its own row alone: that row's values
        assert torch.allclose(out.view(8, 64), v[-1].repeat_interleave(4, dim=0), rtol=1e-5, atol=1e-6)


def test_selfcheck_of_the_mask_refuses_a_kernel_that_ignores_it(device, monkeypatch):
    monkeypatch.setattr(selfcheck, "_warnings", [])
    fn, verdict = select_masked_attention(8, 2, 64, torch.float32, device)
    assert verdict.ok and fn is masked_attention
    every_row = lambda q, k, v, visible: masked_attention(q, k, v, torch.ones_like(visible))    # noqa: E731
    fn, verdict = select_masked_attention(8, 2, 32, torch.float32, device, kernel=every_row)
    assert not verdict.ok and fn is None
