"""The (token, choice) pairs of one MoE layer sorted by expert, for the grouped-GEMM prefill kernel
(moe_prefill.py). Plain torch, no Triton: the engine builds it without importing a kernel.

  T = tokens, K = choices a token, P = T * K pairs (pair p = t * K + k), BM = rows a kernel block
The experts form groups in the caller's order (on the engine: resident experts first, then each batch
as it is brought in, so that each batch is a contiguous run of groups). Each group's rows are its
pairs in routing order, padded to a multiple of BM with -1, so a kernel block belongs to one expert.
The host already knows the routed ids (the layer's one sync), so it sorts the pairs itself (numpy, ~4k
pairs a layer) and sends the rows table through pinned memory: no device sort or scatter (their CUDA
modules hold host memory for the process's life) and no host sync.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch


@dataclass
class Routing:
    rows: torch.Tensor              # [R] int32 on the device: the pair of each row, -1 for padding
    experts: list[int]              # group -> expert, in compute order
    block_ends: list[int]           # group -> (cumulative) blocks up to the group's end
    num_tokens: int
    top_k: int
    block_m: int
    group_of: dict[int, int] = field(default_factory=dict)      # expert -> group

    def run(self, experts) -> tuple[int, int]:
        """The groups [g0, g1) of a set of experts, which must be a contiguous run of the order."""
        try:
            groups = sorted(self.group_of[e] for e in experts)
        except KeyError as exc:
            raise ValueError(f"expert {exc.args[0]} is not in this routing's order") from None
        if not groups or groups != list(range(groups[0], groups[0] + len(groups))):
            raise ValueError(f"experts {sorted(experts)} are not a contiguous run of the routing's order {self.experts}")
        return groups[0], groups[-1] + 1

    def blocks(self, g0: int, g1: int) -> tuple[int, int]:
        """The kernel blocks [b0, b1) of groups [g0, g1)."""
        return (self.block_ends[g0 - 1] if g0 else 0), (self.block_ends[g1 - 1] if g1 > g0 else 0)


def route_pairs(routed: list[int], routed_dev: torch.Tensor, experts: Sequence[int], top_k: int,
                block_m: int) -> Routing:
    """routed: the flat [P] expert ids on the host; routed_dev: the same ids where the tokens are (the rows
    go to its device); experts: the group order, every routed expert exactly once (an expert with no
    pairs gets an empty group)."""
    counts = Counter(routed)
    if len(set(experts)) != len(experts) or not counts.keys() <= set(experts):
        raise ValueError(f"the group order {list(experts)} must name each routed expert "
                         f"{sorted(counts)} exactly once")
    group_of = {e: g for g, e in enumerate(experts)}
    rank = [0] * (max(experts, default=-1) + 1)          # expert -> group (only routed ids are looked up)
    shift, block_ends, start, padded = [], [], 0, 0      # shift: sorted position -> padded row, per group
    for g, expert in enumerate(experts):
        rank[expert] = g
        shift.append(padded - start)
        start += counts.get(expert, 0)
        padded += -(-counts.get(expert, 0) // block_m) * block_m
        block_ends.append(padded // block_m)
    rows = np.full(padded, -1, dtype=np.int32)
    if routed:
        key = np.asarray(rank)[np.asarray(routed)]                                    # [P] group of each pair
        order = np.argsort(key, kind="stable")                                       # [P] pairs by group
        rows[np.arange(len(routed)) + np.asarray(shift)[key[order]]] = order         # [P] padded row
    return Routing(int32_on(routed_dev.device, rows), list(experts), block_ends, len(routed) // top_k, top_k,
                   block_m, group_of)


def int32_on(device: torch.device, values) -> torch.Tensor:
    """A small int32 table on the device. On CUDA through pinned memory, asynchronously: a pageable
    copy would wait for the whole stream. torch's pinned-memory cache keeps the host buffer until the
    copy has run (it records an event on the stream), so it is not reused early."""
    host = torch.from_numpy(values) if isinstance(values, np.ndarray) else torch.tensor(values, dtype=torch.int32)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
