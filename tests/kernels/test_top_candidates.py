"""Top-k sampling's candidates: the kernel (kernels/top_candidates.py) against its numpy reference, the
host's survivors from them against the whole row's, its self-check, and the draws it gives."""
import numpy as np
import pytest
import torch

from engine.params import GenerationParams
from engine.runtime.sampling import make_generator, sample
from kernels import selfcheck
from kernels.selfcheck import select_top_candidates
from kernels.top_candidates import top_candidates, top_candidates_ref
from kernels.vocab_chunks import CHUNK, survivors_among, survivors_in_row


def _tied_logits(vocab: int, seed: int = 0) -> torch.Tensor:
    """bf16 logits as a model gives them: many exact ties among the large ones."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(vocab, generator=g) * 4).to(torch.bfloat16).float()


def _same(table, ref):
    """Each chunk's k largest equal, and their ids wherever the value is a real logit (not the padding)."""
    table, ref = table.cpu(), ref.cpu()
    real = torch.isfinite(ref[0])
    assert torch.equal(table[0][real], ref[0][real]) and torch.equal(table[1][real], ref[1][real])
    assert (~torch.isfinite(table[0][~real])).all()


@pytest.mark.parametrize("vocab,k", [(5000, 40), (5000, 1), (2 * CHUNK, 64), (CHUNK + 30, 50)])
def test_chunks_give_their_k_largest_best_first(device, vocab, k):
    logits = _tied_logits(vocab).to(device)
    _same(top_candidates(logits, k), top_candidates_ref(logits, k))


def test_the_survivors_are_the_rows_with_ties_at_the_kth_kept():
    row = torch.tensor([3.0, 5.0, 5.0, 1.0, 5.0, 2.0])              # k = 2: all three fives survive
    values, ids = survivors_in_row(row, 2)
    assert sorted(ids.tolist()) == [1, 2, 4] and (values == 5.0).all()
    for seed in range(5):
        logits = _tied_logits(20000, seed)
        values, ids = survivors_among(top_candidates_ref(logits, 40).numpy(), 40, logits.numel())
        whole_values, whole_ids = survivors_in_row(logits, 40)
        assert np.array_equal(np.sort(ids), np.sort(whole_ids)) and len(ids) >= 40


def test_a_chunk_that_may_hold_more_ties_sends_the_host_to_the_whole_row():
    logits = _tied_logits(5000)
    logits[:100] += 50.0                                             # the top 100 all in chunk 0
    assert survivors_among(top_candidates_ref(logits, 40).numpy(), 40, logits.numel()) is None
    logits = torch.full((5000,), float("-inf"))                      # no finite cut
    logits[7] = 1.0
    assert survivors_among(top_candidates_ref(logits, 3).numpy(), 3, logits.numel()) is None


def test_selfcheck_passes_the_kernel_and_refuses_a_wrong_one(device, monkeypatch):
    monkeypatch.setattr(selfcheck, "_warnings", [])
    fn, verdict = select_top_candidates(5000, 40, device)
    assert verdict.ok and fn is top_candidates

    def ties_the_other_way(logits, k):              # a tie broken toward the higher id
        rows = np.full(-(-logits.numel() // CHUNK) * CHUNK, -np.inf, dtype=np.float32)
        rows[:logits.numel()] = logits.cpu().numpy()
        rows = rows.reshape(-1, CHUNK)
        cols = np.broadcast_to(np.arange(CHUNK), rows.shape)
        order = np.lexsort((-cols, -rows), axis=-1)[:, :k]
        ids = order + np.arange(rows.shape[0])[:, None] * CHUNK
        table = np.stack([np.take_along_axis(rows, order, 1).reshape(-1), ids.reshape(-1).astype(np.float32)])
        return torch.from_numpy(table).to(logits.device)
    fn, verdict = select_top_candidates(4000, 40, device, kernel=ties_the_other_way)     # another key: no cached verdict
    assert not verdict.ok and fn is None


def test_draws_through_the_kernel_are_the_draws_from_the_whole_row(device):
    """The same seed gives the same tokens whichever way the survivors were found: only the cut differs
    in where it is computed, and the host finishes the draw the same way."""
    params = GenerationParams(temperature=0.8, top_k=40, top_p=0.9)
    logits = [_tied_logits(5000, seed).to(device) for seed in range(12)]
    through = make_generator(3, torch.device(device))
    whole = make_generator(3, torch.device(device))
    ours = [sample(x, params, through, top_candidates) for x in logits]
    assert ours == [sample(x, params, whole, None) for x in logits]
    assert all(int(torch.topk(x, 40).values[-1] <= x[t]) for x, t in zip(logits, ours))
