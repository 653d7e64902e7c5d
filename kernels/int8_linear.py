"""y = x @ W.T for a dense weight kept as int8 codes with one bf16 scale per output row (the int8 block
format's projection: W = q * scale[:, None], rounded to the compute dtype as the reference rounds it).

  T = tokens, N = out features, K = in features
  x [..., K] (compute dtype), q [N, K] int8, scale [N] bf16 -> [..., N] in x's dtype

int8_linear_kernel: a decode step's few tokens, one Triton launch, grid (N / BLOCK_N, T): each program
reads BLOCK_N rows of codes once, accumulates their products with one token in float32 and applies each
row's scale once, to the sum. Half the bytes of a bf16 weight, and no dequantised copy in memory. The
reference rounds each weight (q * scale) to the compute dtype first; in float32 the two differ only in
rounding order, in bf16 by well under one unit in the last place of the output (the self-check's
tolerance). Scaling each element cost ~40% more instructions a code byte in a loop that is issue-bound
(`python -m bench kernels --ptxas --dense`).
Its reference, kernels.cpu_linear.int8_linear_ref (no Triton there: the CPU app installs without it), takes
the same dequantised weights a slab of rows at a time through torch's matmul: prompts (more than
MAX_KERNEL_TOKENS, compute-bound: the GEMM reads the codes once), eager mode, and any GPU where the
kernel fails its self-check.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .cpu_linear import int8_linear_ref

KERNEL_VERSION = 3     # bump on any change to the kernel below: cached self-check verdicts are keyed on it
MAX_KERNEL_TOKENS = 8  # more tokens than this (prompts) take the reference


@dataclass(frozen=True)
class LinearConfig:
    """Defaults: the best or within 3% of it of 7 configs at OLMoE's and Qwen3's shapes on an H200
    (~1.9 TB/s of codes: `python -m bench kernels --dense`)."""
    block_n: int = 4        # output rows per program
    block_k: int = 512      # reduction tile (input elements)
    num_warps: int = 4


@triton.jit
def _int8_linear_kernel(x_ptr, q_ptr, s_ptr, y_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    token = tl.program_id(1)
    row_ok = rows < N
    scale = tl.load(s_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        codes = tl.load(q_ptr + rows[:, None].to(tl.int64) * K + cols[None, :],
                        mask=row_ok[:, None] & col_ok[None, :], other=0)
        x = tl.load(x_ptr + token * K + cols, mask=col_ok, other=0.0).to(tl.float32)
        acc += codes.to(tl.float32) * x[None, :]
    tl.store(y_ptr + token * N + rows, (tl.sum(acc, axis=1) * scale).to(y_ptr.dtype.element_ty), mask=row_ok)


def int8_linear_kernel(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                       config: LinearConfig = LinearConfig()) -> torch.Tensor:
    if x.numel() > MAX_KERNEL_TOKENS * x.shape[-1]:
        return int8_linear_ref(x, q, scale)
    flat = x.reshape(-1, x.shape[-1]).contiguous()                                   # [T, K]
    num_tokens, (n, k) = flat.shape[0], q.shape
    y = torch.empty(num_tokens, n, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(n, config.block_n), num_tokens)
    _int8_linear_kernel[grid](flat, q, scale, y, n, k, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                              num_warps=config.num_warps)
    return y.reshape(*x.shape[:-1], n)


@dataclass(frozen=True)
class GemmConfig:
    """A prompt's tiles (untuned: already faster than cuBLAS under a memory cap, where its freed host memory
    goes to the caches)."""
    block_t: int = 64       # tokens per program
    block_n: int = 64       # output rows per program
    block_k: int = 64       # reduction tile
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _int8_gemm_kernel(x_ptr, q_ptr, s_ptr, y_ptr, T, N, K, IEEE: tl.constexpr, BLOCK_T: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    tokens = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    t_ok, r_ok = tokens < T, rows < N
    scale = tl.load(s_ptr + rows, mask=r_ok, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        c_ok = cols < K
        x = tl.load(x_ptr + tokens[:, None].to(tl.int64) * K + cols[None, :], mask=t_ok[:, None] & c_ok[None, :],
                    other=0.0)
        codes = tl.load(q_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], mask=r_ok[:, None] & c_ok[None, :],
                        other=0)
        # the reference's weight element: q * scale rounded once to the compute dtype
        w = (codes.to(tl.float32) * scale[:, None]).to(x_ptr.dtype.element_ty)
        if IEEE:                                                   # float32 compute: no TF32 rounding
            acc += tl.dot(x, tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))
    tl.store(y_ptr + tokens[:, None].to(tl.int64) * N + rows[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=t_ok[:, None] & r_ok[None, :])


def int8_gemm_kernel(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, config: GemmConfig = GemmConfig()
                     ) -> torch.Tensor:
    """A prompt's tokens through int8 codes (one Triton launch, tensor cores): no dequantised copy and no
    cuBLAS (whose CUDA module holds ~81 MiB of host memory once loaded)."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()                                   # [T, K]
    num_tokens, (n, k) = flat.shape[0], q.shape
    y = torch.empty(num_tokens, n, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(n, config.block_n), triton.cdiv(num_tokens, config.block_t))
    _int8_gemm_kernel[grid](flat, q, scale, y, num_tokens, n, k, IEEE=x.dtype == torch.float32,
                            BLOCK_T=config.block_t, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                            num_warps=config.num_warps, num_stages=config.num_stages)
    return y.reshape(*x.shape[:-1], n)


def int8_linear_any(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """int8_linear_kernel for a decode step's tokens, int8_gemm_kernel for a prompt's."""
    if x.numel() > MAX_KERNEL_TOKENS * x.shape[-1]:
        return int8_gemm_kernel(x, q, scale)
    return int8_linear_kernel(x, q, scale)
