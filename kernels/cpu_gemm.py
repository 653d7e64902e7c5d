"""int8 weights times many float32 tokens on the CPU (a prompt's experts), through MKL's GEMM.

  T = tokens, I = in features, O = out features
  x [..., I] float32, q int8 [O, I], scale bf16 [O] (one per row), scratch float32 [>= I] (reused)
  -> x @ (q * scale).T   [..., O] float32

The reference is kernels.cpu_linear.int8_linear_ref: the weight dequantised (q * scale) into a fresh float32
copy, then x @ W.T. Here the codes are converted to float32 a tile of rows at a time into `scratch` (exact:
|q| <= 127), MKL multiplies the tile by the tokens, and each output row takes its scale after its sum
(W = diag(scale) q, so x @ W.T = (x @ q.T) * scale: one rounding more, float32's). Why: the reference's fresh
8 MB copy of an expert projection is faulted in at every call, its q * scale is a broadcast multiply, and
x @ W.T makes MKL pack the weight for a few dozen tokens; tile @ x.T packs the tokens instead (about twice as
fast at 16-64 tokens on the 2-core dev machine). Other dtypes take kernels.cpu_linear.packed_linear.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .cpu_linear import packed_linear

TILE_BYTES = 4 << 20    # one tile of float32 rows: within the L3, and an expert's projection in one or two tiles
# MKL's GEMM runs at its speed for a multiple of this many tokens (9 tokens as 16 padded with zeros takes about
# what 16 do; 15 unpadded took nearly three times as long on AVX-512).
TOKEN_MULTIPLE = 8


def scratch() -> torch.Tensor:
    """A tile buffer for int8_linear (float32, TILE_BYTES); its owner uses it from one thread at a time."""
    return torch.empty(TILE_BYTES // 4)


def int8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, tile: torch.Tensor) -> torch.Tensor:
    """x [..., I] @ (q * scale).T -> [..., O]: float32 activations on the CPU through int8_gemm (tile: scratch()),
    anything else through packed_linear."""
    if x.dtype != torch.float32 or x.device.type != "cpu":
        return packed_linear(x, {"w": q, "scale": scale}, "int8")
    return int8_gemm(x, q, scale, tile)


def int8_gemm(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, tile: torch.Tensor) -> torch.Tensor:
    """x [..., I] float32 @ (q * scale).T -> [..., O] float32, the codes converted into `tile` rows by rows."""
    num_out, num_in = q.shape
    rows = min(num_out, tile.numel() // num_in)
    if rows < 1:
        raise ValueError(f"a tile of {tile.numel()} floats cannot hold a row of {num_in}")
    flat = x.reshape(-1, num_in)                                                         # [T, I]
    num_tokens = flat.shape[0]
    padding = -num_tokens % TOKEN_MULTIPLE
    flat = F.pad(flat, (0, 0, 0, padding)) if padding else flat.contiguous()             # [Tp, I], rows in memory
    out_t = torch.empty(num_out, num_tokens + padding)                                   # [O, Tp]
    for r in range(0, num_out, rows):
        n = min(rows, num_out - r)
        codes = tile[:n * num_in].view(n, num_in).copy_(q[r:r + n])                      # [n, I] float32
        torch.mm(codes, flat.t(), out=out_t[r:r + n])
    out_t.mul_(scale[:, None])
    return out_t[:, :num_tokens].t().contiguous().reshape(*x.shape[:-1], num_out)
