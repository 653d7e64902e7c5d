"""One decode token's attention kernel (kernels/decode_attention.py) against the models' torch path, its
self-check, and the switch that puts it on the models' path (SLUICE_ATTN_KERNEL=1)."""
import pytest
import torch

from engine.model import layers
from kernels import selfcheck
from kernels.decode_attention import attention_ref, decode_attention
from kernels.selfcheck import select_decode_attention


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


def test_selfcheck_passes_the_kernel_and_refuses_a_wrong_one(device, monkeypatch):
    monkeypatch.setattr(selfcheck, "_warnings", [])
    fn, verdict = select_decode_attention(8, 2, 32, torch.float32, None, device)
    assert verdict.ok and fn is decode_attention
    fn, verdict = select_decode_attention(8, 2, 32, torch.float32, 16, device,        # the window forgotten
                                          kernel=lambda q, k, v, where, window: decode_attention(q, k, v, where, None))
    assert not verdict.ok and fn is None


def test_the_models_attention_takes_the_kernel_unless_switched_off(monkeypatch):
    asked = []

    def select(*key):
        asked.append(key[:3])
        return (lambda q, k, v, where, window: torch.full((1, 8), 7.0)), None
    monkeypatch.setattr(selfcheck, "select_decode_attention", select)
    monkeypatch.setattr(layers, "_CHECKED", {})
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))      # as on a GPU
    q, k, v = torch.randn(1, 2, 4), torch.randn(5, 1, 4), torch.randn(5, 1, 4)
    where = torch.tensor([3])
    monkeypatch.setenv("SLUICE_ATTN_KERNEL", "0")
    assert not (layers.attention(q, k, v, where, None) == 7.0).all() and asked == []
    monkeypatch.delenv("SLUICE_ATTN_KERNEL", raising=False)                 # the default: on
    assert (layers.attention(q, k, v, where, None) == 7.0).all() and asked == [(2, 1, 4)]
