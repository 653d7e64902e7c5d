"""Manifold-constrained hyper-connections: the residual is n streams x [T, n, H].

Before a block the streams collapse into its input (weights `pre`); after it the block output is
spread back (`post`) and added to the streams mixed by a doubly-stochastic `comb` (Sinkhorn).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.model.dsv4.norms import unweighted_rms_norm


@dataclass(frozen=True)
class HyperWeights:
    fn: torch.Tensor          # [(2 + n) * n, n * H] float32
    base: torch.Tensor        # [(2 + n) * n]
    scale: torch.Tensor       # [3]: pre, post, comb


def hyper_collapse(x: torch.Tensor, w: HyperWeights, sinkhorn_iters: int, hc_eps: float, norm_eps: float):
    """x [T, n, H] -> block input [T, H] (x's dtype), post [T, n] and comb [T, n, n] (float32)."""
    num_tokens, n, _ = x.shape
    mix = F.linear(unweighted_rms_norm(x.reshape(num_tokens, -1).float(), norm_eps), w.fn.float())  # [T, (2+n)n]
    pre_w, post_w, comb_w = mix.split([n, n, n * n], dim=-1)
    pre_b, post_b, comb_b = w.base.split([n, n, n * n])
    pre_s, post_s, comb_s = w.scale.unbind(0)
    pre = torch.sigmoid(pre_w * pre_s + pre_b) + hc_eps                                     # [T, n]
    post = 2 * torch.sigmoid(post_w * post_s + post_b)                                      # [T, n]
    comb = torch.softmax(comb_w.view(-1, n, n) * comb_s + comb_b.view(n, n), dim=-1) + hc_eps  # [T, n, n]
    comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
    for _ in range(sinkhorn_iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + hc_eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
    collapsed = (pre.unsqueeze(-1) * x).sum(dim=1).to(x.dtype)
    return collapsed, post, comb


def hyper_expand(x: torch.Tensor, out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """Streams after a block: x'[k] = post[k] * out + sum_j comb[j, k] * x[j]. x [T, n, H], out [T, H]."""
    dtype = x.dtype
    return post.to(dtype).unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb.to(dtype).transpose(-1, -2), x)


def hyper_head(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
               hc_eps: float, norm_eps: float) -> torch.Tensor:
    """Final collapse of the streams x [T, n, H] -> [T, H] (before the model's last norm)."""
    mix = F.linear(unweighted_rms_norm(x.flatten(1).float(), norm_eps), fn.float())           # [T, n]
    pre = torch.sigmoid(mix * scale.float() + base.float()) + hc_eps
    return (pre.unsqueeze(-1) * x).sum(dim=1).to(x.dtype)
