"""Random MoE kernel inputs shared by the kernel tests."""
import torch

from kernels.formats import make_offsets, random_bank


def moe_case(fmt, device, num_tokens, top_k, num_slots, intermediate, hidden, seed, x_dtype=torch.float32,
             bias=False):
    """A bank of random blocks (with bias fields if `bias`), x, each token's top_k distinct slots and their
    routing weights: the MoE kernels' positional arguments (x, bank, slots, weights, fmt, offsets, intermediate)."""
    g = torch.Generator().manual_seed(seed)
    offsets, block_bytes = make_offsets(fmt, intermediate, hidden, bias=bias)
    bank = random_bank(num_slots, block_bytes, fmt, offsets, intermediate, hidden, device=device, generator=g)
    x = torch.randn(num_tokens, hidden, generator=g).to(device, x_dtype)
    slots = torch.stack([torch.randperm(num_slots, generator=g)[:top_k] for _ in range(num_tokens)]).int().to(device)
    weights = torch.rand(num_tokens, top_k, generator=g).to(device)
    return x, bank, slots, weights, fmt, offsets, intermediate
