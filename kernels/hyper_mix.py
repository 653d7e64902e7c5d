"""qwen4_exp's hyper-connection steps, each one Triton launch where torch runs two to five (their references:
kernels/hyper_ref.py, the models' path). Every step computes in float32 and rounds to the compute dtype where the
torch ops do: after `/ n`, after the sigmoid or silu, after the product, after the sum. `/ n` is a product by the
float32 1 / n, as torch's CUDA division by a scalar is; a mean is the float32 sum in stream order times 1 / n,
rounded once, as torch's CUDA mean is.

  scaled_silu:    d [T, R] -> silu(d / n) [T, R]
  gated_mean:     u, normed [T, n * H] -> mean_k(sigmoid(u)[k] * normed[k]) [T, H]   (a program a token and H block)
  stream_weights: i [T, n] -> 2 * sigmoid(i / n) [T, n]
  inject:         x [T, n * H], out [T, H], weights [T, n] -> x + out * weights[k] per stream k [T, n * H]
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .hyper_ref import HyperSteps, gated_mean_ref, inject_ref, scaled_silu_ref, stream_weights_ref  # noqa: F401

KERNEL_VERSION = 1     # bump on any change to the kernels below: cached self-check verdicts are keyed on it
BLOCK = 1024           # elements a program: a decode token's steps are one program each but gated_mean's and inject's


@triton.jit
def _rounded(v, like_ptr):
    """v rounded to the compute dtype (like_ptr's), back in float32 for the next op."""
    return v.to(like_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _sigmoid(v):
    return 1.0 / (1.0 + tl.exp(-v))


@triton.jit
def _scaled_kernel(x_ptr, out_ptr, numel, inv_n, IS_SILU: tl.constexpr, BLOCK: tl.constexpr):
    # IS_SILU: silu(x / n); else 2 * sigmoid(x / n)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    scaled = _rounded(tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32) * inv_n, x_ptr)
    if IS_SILU:
        y = scaled / (1.0 + tl.exp(-scaled))                       # torch's silu: x / (1 + exp(-x))
    else:
        y = 2.0 * _rounded(_sigmoid(scaled), x_ptr)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _gated_mean_kernel(u_ptr, normed_ptr, out_ptr, H, inv_n, COUNT: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < H
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for k in tl.static_range(COUNT):                               # stream k: row token, columns k * H + cols
        at = (token * COUNT + k) * H + cols
        gate = _rounded(_sigmoid(tl.load(u_ptr + at, mask=ok, other=0.0).to(tl.float32)), u_ptr)
        total += _rounded(gate * tl.load(normed_ptr + at, mask=ok, other=0.0).to(tl.float32), u_ptr)
    tl.store(out_ptr + token * H + cols, (total * inv_n).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _inject_kernel(x_ptr, out_ptr, w_ptr, res_ptr, H, COUNT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)                            # token * n + stream
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < H
    weight = tl.load(w_ptr + row).to(tl.float32)
    out = tl.load(out_ptr + (row // COUNT) * H + cols, mask=ok, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row * H + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(res_ptr + row * H + cols, (x + _rounded(out * weight, x_ptr)).to(res_ptr.dtype.element_ty), mask=ok)


def _scaled(x: torch.Tensor, count: int, is_silu: bool) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    _scaled_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), 1.0 / count, IS_SILU=is_silu, BLOCK=BLOCK)
    return out


def scaled_silu(d: torch.Tensor, count: int) -> torch.Tensor:
    return _scaled(d, count, is_silu=True)


def stream_weights(i: torch.Tensor, count: int) -> torch.Tensor:
    return _scaled(i, count, is_silu=False)


def gated_mean(u: torch.Tensor, normed: torch.Tensor, count: int) -> torch.Tensor:
    assert u.shape == normed.shape and u.dtype == normed.dtype, (u.shape, normed.shape, u.dtype, normed.dtype)
    u, normed = u.contiguous(), normed.contiguous()
    hidden = u.shape[-1] // count
    out = torch.empty(*u.shape[:-1], hidden, dtype=u.dtype, device=u.device)
    grid = (u.numel() // u.shape[-1], triton.cdiv(hidden, BLOCK))
    _gated_mean_kernel[grid](u, normed, out, hidden, 1.0 / count, COUNT=count, BLOCK=BLOCK)
    return out


def inject(x: torch.Tensor, out: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    assert x.dtype == out.dtype == weights.dtype, (x.dtype, out.dtype, weights.dtype)
    x, out, weights = x.contiguous(), out.contiguous(), weights.contiguous()
    count, hidden = weights.shape[-1], out.shape[-1]
    result = torch.empty_like(x)
    _inject_kernel[(weights.numel(), triton.cdiv(hidden, BLOCK))](x, out, weights, result, hidden, COUNT=count,
                                                                  BLOCK=BLOCK)
    return result
