"""Top-k sampling over the vocabulary in chunks, on the host side (numpy; no Triton: the CPU app imports
it). The device gives each chunk's k largest logits (kernels/top_candidates.py, or `top_candidates_ref`
here, its reference); `survivors_among` finds top-k's survivors among them.

  V = vocabulary, C = CHUNK, P = ceil(V / C) chunks, k = the candidates a chunk gives (1..MAX_K)
  candidates [2, P * k] float32: row 0 the values, row 1 the ids (exact below 2**24); chunk p's k at
  [p * k, (p + 1) * k), best first (a tie: the lower id first). A chunk shorter than k pads with -inf.
"""
from __future__ import annotations

import numpy as np
import torch

CHUNK = 1024
MAX_K = 256            # a larger k: the host takes the whole row of logits


def top_candidates_ref(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The kernel's output computed on the host, returned where the logits are."""
    x = logits.reshape(-1).float().cpu().numpy()
    chunks = -(-x.size // CHUNK)
    padded = np.full(chunks * CHUNK, -np.inf, dtype=np.float32)
    padded[:x.size] = x
    rows = padded.reshape(chunks, CHUNK)
    order = np.argsort(-rows, axis=1, kind="stable")[:, :k]
    values = np.take_along_axis(rows, order, axis=1)
    ids = (order + np.arange(chunks)[:, None] * CHUNK).astype(np.float32)
    return torch.from_numpy(np.stack([values.reshape(-1), ids.reshape(-1)])).to(logits.device)


def survivors_among(candidates: np.ndarray, k: int, vocab: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The logits at least the k-th largest (ties included) and their ids, from each chunk's k largest; or
    None where those cannot tell: a chunk whose own k-th largest survives may hold more ties with it, and
    a k-th largest of -inf leaves no finite cut."""
    values, ids = candidates[0].reshape(-1, k), candidates[1].reshape(-1, k).astype(np.int64)
    flat = values.reshape(-1)
    kth = np.partition(flat, flat.size - k)[flat.size - k]
    full = np.minimum(CHUNK, vocab - np.arange(values.shape[0]) * CHUNK) >= k      # chunks with k real logits
    if not np.isfinite(kth) or np.any(values[full, k - 1] >= kth):
        return None
    keep = values >= kth
    return values[keep], ids[keep]


def survivors_in_row(logits: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The same from the whole row of logits, copied to the host."""
    row = logits.reshape(-1).float().cpu().numpy()
    kth = np.partition(row, row.size - k)[row.size - k]
    ids = np.flatnonzero(row >= kth)
    return row[ids], ids
