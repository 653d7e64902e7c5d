"""Which (token, top-k slot) pairs of a step were routed to each expert."""
from __future__ import annotations

from collections import Counter

import torch


def token_groups(routed: list[int], routed_dev: torch.Tensor, top_k: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """expert -> (token rows, top-k columns) of the pairs routed to it, in routing order. `routed` is the
    flat [T*K] expert ids on the host, `routed_dev` the same ids where the tokens are: the groups are
    slices of one stable sort there, so no index list is copied per expert (on CUDA a pageable
    host-to-device copy waits for the whole stream, which would serialise a prefill)."""
    order = torch.argsort(routed_dev, stable=True)
    rows, cols = order // top_k, order % top_k
    groups, start = {}, 0
    for expert, count in sorted(Counter(routed).items()):
        groups[expert] = (rows[start:start + count], cols[start:start + count])
        start += count
    return groups
