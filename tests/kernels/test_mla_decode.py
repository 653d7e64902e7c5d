"""MLA's one decode token kernel (kernels/mla_decode.py) against its torch reference, the latent attention of
MlaAttention.attend_absorbed, and its self-check (the kernel on the models' path: tests/engine/test_attach.py)."""
import pytest
import torch

from kernels import selfcheck
from kernels.attention_ref import mla_decode_ref
from kernels.mla_decode import mla_decode
from kernels.selfcheck import select_mla_decode


def _case(device, num_heads, rank, rope_dim, held, dtype=torch.float32, seed=0):
    """q_latent [H, r], q_rope [H, dr], kv_latent [S, r], k_rope [S, dr]."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(device, dtype) for shape in
            ((num_heads, rank), (num_heads, rope_dim), (held, rank), (held, rope_dim))]


@pytest.mark.parametrize("num_heads,rank,rope_dim", [
    (16, 64, 16),        # one full head block
    (20, 48, 24),        # heads past a block, r and dr not powers of two
    (3, 40, 8),          # fewer heads than a block, dr under tl.dot's least width
])
@pytest.mark.parametrize("position", [0, 150, 299])             # the first, a middle and the last of the buffer
def test_attends_as_the_torch_path(device, num_heads, rank, rope_dim, position):
    q_latent, q_rope, kv_latent, k_rope = _case(device, num_heads, rank, rope_dim, 300)
    where, scale = torch.tensor([position], device=device), (rank + rope_dim) ** -0.5
    out = mla_decode(q_latent, q_rope, kv_latent, k_rope, where, scale, split=64)
    assert out.shape == (num_heads, rank) and out.dtype == torch.float32
    torch.testing.assert_close(out, mla_decode_ref(q_latent, q_rope, kv_latent, k_rope, where, scale),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("position", [0, 150, 299])
def test_half_precision_attends_as_the_torch_path(device, dtype, position):
    q_latent, q_rope, kv_latent, k_rope = _case(device, 20, 48, 24, 300, dtype=dtype, seed=1)
    where, scale = torch.tensor([position], device=device), 72 ** -0.5
    out = mla_decode(q_latent, q_rope, kv_latent, k_rope, where, scale, split=64)
    assert out.dtype == dtype
    ref = mla_decode_ref(q_latent, q_rope, kv_latent, k_rope, where, scale)
    assert selfcheck.rel_error(out, ref) < 1e-2


@pytest.mark.parametrize("split", [32, 128, 320])               # 320: every key in one program a head block
@pytest.mark.parametrize("position", [31, 32, 255, 299])        # the last key of a split, the first of one
def test_splits_merge_as_one_softmax(device, split, position):
    q_latent, q_rope, kv_latent, k_rope = _case(device, 4, 32, 16, 300, seed=2)
    where = torch.tensor([position], device=device)
    out = mla_decode(q_latent, q_rope, kv_latent, k_rope, where, 0.2, split=split)
    torch.testing.assert_close(out, mla_decode_ref(q_latent, q_rope, kv_latent, k_rope, where, 0.2),
                               rtol=1e-4, atol=1e-5)


def test_keys_past_the_position_change_nothing(device):
    q_latent, q_rope, kv_latent, k_rope = _case(device, 20, 48, 24, 400, seed=3)
    where = torch.tensor([139], device=device)
    out = mla_decode(q_latent, q_rope, kv_latent, k_rope, where, 0.1, split=64)
    kv_latent[140:], k_rope[140:] = 1e30, -1e30                  # the buffer's unwritten rest, in the same splits too
    poisoned = mla_decode(q_latent, q_rope, kv_latent, k_rope, where, 0.1, split=64)
    assert torch.isfinite(poisoned).all()
    torch.testing.assert_close(poisoned, out, rtol=0, atol=0)
    torch.testing.assert_close(out, mla_decode_ref(q_latent, q_rope, kv_latent[:140], k_rope[:140], where, 0.1),
                               rtol=1e-4, atol=1e-5)


def test_rows_of_a_wider_buffer_are_read_by_their_stride(device):
    q_latent, q_rope, kv_latent, k_rope = _case(device, 5, 24, 8, 100, seed=4)
    wide = torch.randn(100, 40).to(device)
    wide[:, :24], wide[:, 24:32] = kv_latent, k_rope             # [S, r + dr + 8]: views with a row stride of 40
    where = torch.tensor([77], device=device)
    out = mla_decode(q_latent, q_rope, wide[:, :24], wide[:, 24:32], where, 0.3)
    torch.testing.assert_close(out, mla_decode_ref(q_latent, q_rope, kv_latent, k_rope, where, 0.3),
                               rtol=1e-4, atol=1e-5)


def test_selfcheck_passes_the_kernel_and_refuses_a_wrong_one(device, monkeypatch):
    monkeypatch.setattr(selfcheck, "_warnings", [])
    fn, verdict = select_mla_decode(20, 48, 24, torch.float32, device)
    assert verdict.ok and fn is mla_decode
    fn, verdict = select_mla_decode(20, 48, 24, torch.bfloat16, device)
    assert verdict.ok and fn is mla_decode
    sees_one_more = lambda q_latent, q_rope, kv_latent, k_rope, where, scale: mla_decode(  # noqa: E731
        q_latent, q_rope, kv_latent, k_rope, where + 1, scale)
    fn, verdict = select_mla_decode(20, 48, 16, torch.float32, device, kernel=sees_one_more)   # another key
    assert not verdict.ok and fn is None
