"""The grouped-GEMM prefill kernel (kernels/moe_prefill.py) for one layer of a 512-token prompt, in a few configs,
against the torch path's per-expert loop; with --ptxas, compiled offline for an NVIDIA target (no GPU needed) with
each launch's registers and spills.

    python -m bench prefill-kernel [--formats int8,mxfp4] [--models olmoe-1b-7b,gpt-oss-120b]
    python -m bench prefill-kernel --ptxas [--arch 90]
"""
from __future__ import annotations

import argparse

from bench.common import save_json

# ((expert intermediate, hidden, experts a token), experts in the layer)
SHAPES = {"olmoe-1b-7b": ((1024, 2048, 8), 64), "gpt-oss-120b": ((2880, 2880, 4), 128)}
NUM_TOKENS = 512


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--formats", default="int8,fp8,bf16,nvfp4,mxfp4", help="comma-separated expert formats")
    p.add_argument("--models", default="olmoe-1b-7b,gpt-oss-120b", help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--ptxas", action="store_true", help="compile for --arch offline and print registers and spills")
    p.add_argument("--arch", type=int, default=90, help="with --ptxas: the SM version (default 90)")


def run(args) -> int:
    formats = args.formats.split(",")
    if args.ptxas:
        from bench.ptxas_prefill import report
        report(formats, args.arch)
        return 0
    results = {}
    for model in args.models.split(","):
        for fmt in formats:
            results.setdefault(model, {})[fmt] = layer_times(PrefillCase(model, fmt))
            save_json(args.out, "prefill-kernel", results)
    return 0


class PrefillCase:
    """Every expert of one layer resident in one bank, bf16 activations, random routing of NUM_TOKENS tokens."""

    def __init__(self, model: str, fmt: str):
        import torch

        from kernels.formats import make_offsets, random_bank
        from kernels.moe_prefill import moe_prefill_ref
        (self.inter, self.hidden, self.top_k), num_experts = SHAPES[model]
        self.model, self.fmt = model, fmt
        self.offsets, block_bytes = make_offsets(fmt, self.inter, self.hidden)
        gen = torch.Generator().manual_seed(3)
        self.bank = random_bank(num_experts, block_bytes, fmt, self.offsets, self.inter, self.hidden, device="cuda",
                                generator=gen)
        self.x = torch.randn(NUM_TOKENS, self.hidden, generator=gen).to("cuda", torch.bfloat16)
        slots = torch.stack([torch.randperm(num_experts, generator=gen)[:self.top_k] for _ in range(NUM_TOKENS)]).cuda()
        self.weights = torch.rand(NUM_TOKENS, self.top_k, generator=gen).cuda()
        self.routed, self.routed_dev = slots.flatten().tolist(), slots.flatten()
        self.experts = sorted(set(self.routed))
        self.ref = moe_prefill_ref(self.x, self.bank, slots, self.weights, fmt, self.offsets, self.inter)
        self.out = torch.zeros(NUM_TOKENS, self.hidden, device="cuda")

    def kernel_call(self, kernel, routing):
        return lambda: kernel(self.x, self.bank, routing, {e: e for e in self.experts}, self.weights, self.fmt,
                              self.offsets, self.inter, self.out.zero_())

    def torch_path(self) -> None:
        """What the engine runs without the kernel: dequantise each expert, its SwiGLU, index_add_ into the output."""
        from engine.model.model import swiglu_expert
        from engine.runtime.token_groups import token_groups
        from kernels.formats import dequantize_block
        import torch
        groups = token_groups(self.routed, self.routed_dev, self.top_k)
        self.out.zero_()
        for expert in self.experts:
            token_idx, k_idx = groups[expert]
            w = dequantize_block(self.bank[expert], self.fmt, self.offsets, self.inter, self.hidden, torch.bfloat16)
            y = swiglu_expert(self.x[token_idx], w)
            self.out.index_add_(0, token_idx, (y * self.weights[token_idx, k_idx, None]).float())


def layer_times(case: PrefillCase) -> dict:
    """Each config's kernel time (routing made before) and routing time, and the torch path's time."""
    from triton.testing import do_bench

    from kernels.moe_prefill import PrefillConfig as C, PrefillKernel
    from kernels.selfcheck import rel_error
    rows = []
    for cfg in (C(), C(64, 64, 64, 4), C(32, 64, 64, 4), C(32, 64, 64, 8), C(64, 128, 64, 8), C(128, 64, 64, 8),
                C(64, 64, 128, 8), C(64, 64, 64, 8, 2), C(64, 64, 64, 8, 4), C(16, 64, 128, 4)):
        kernel = PrefillKernel(cfg)
        route = lambda: kernel.route(case.routed, case.routed_dev, case.experts, case.top_k)      # noqa: E731
        try:
            call = case.kernel_call(kernel, route())
            row = {"config": cfg.__dict__, "rel_err": rel_error(call(), case.ref),
                   "kernel_us": do_bench(call, return_mode="median") * 1e3,
                   "route_us": do_bench(route, return_mode="median") * 1e3}
        except Exception as exc:          # noqa: BLE001 - a config the GPU refuses: report it, try the next
            print(f"prefill kernel {case.fmt} {case.model} {cfg}: FAILED {type(exc).__name__}: {str(exc)[:200]}")
            continue
        rows.append(row)
        print(f"prefill kernel {case.fmt} {case.model} {cfg}: {row['kernel_us']:8.1f} us a layer (+ routing "
              f"{row['route_us']:6.1f} us), err {row['rel_err']:.1e}", flush=True)
    torch_us = do_bench(case.torch_path, return_mode="median") * 1e3
    best = min(rows, key=lambda r: r["kernel_us"], default=None)
    print(f"prefill {case.fmt}, {case.model} layer of {NUM_TOKENS} tokens: torch path {torch_us:.0f} us, "
          + (f"best kernel {best['kernel_us']:.0f} us + routing {best['route_us']:.0f} us" if best else "no config ran"))
    return {"configs": rows, "torch_path_us": torch_us}
