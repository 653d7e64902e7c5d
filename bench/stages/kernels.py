"""Batch-1 expert decode kernels at each family's expert shapes, per format: error against the torch reference,
the best of a config sweep in a CUDA graph as a share of HBM copy bandwidth, eager and torch times, and a last
table of each one's best.
With --dense, the int8 dense linear against bf16 through cuBLAS. With --ptxas (no GPU needed), each launch of the
default config compiled for --arch offline: its registers and SASS instructions a weight byte in its hottest loop.

    python -m bench kernels [--models olmoe-1b-7b,gpt-oss-120b] [--formats int8,mxfp4] [--dense] [--ptxas]
"""
from __future__ import annotations

import argparse

from bench.common import save_json

# (expert intermediate, hidden, experts a token) of each family's experts
SHAPES = {"olmoe-1b-7b": (1024, 2048, 8), "qwen3-30b-a3b": (768, 2048, 8), "gpt-oss-120b": (2880, 2880, 4),
          "gpt-oss-20b": (2880, 2880, 4),     # the same experts as 120b's (fewer of them)
          "qwen3.5-35b-a3b": (512, 2048, 8), "deepseek-v2-lite": (1408, 2048, 6),
          "deepseek-v4-flash": (2048, 4096, 6)}
FORMATS = ("int8", "fp8", "nvfp4", "mxfp4", "bf16")
# [out, in] of the dense weights a decode step reads: attention and heads of OLMoE and Qwen3; Qwen3.8-Flash-Next's
# DeltaNet qkv / z / out, QSA q / kv / o, indexer, shared expert up / down, hyper-connection mixer down / up, head
DENSE_SHAPES = {"olmoe-1b-7b": ((2048, 2048), (1024, 2048), (50304, 2048)),
                "qwen3-30b-a3b": ((4096, 4096), (151936, 2048)),
                "qwen3.8-flash-next": ((10240, 2560), (6144, 2560), (2560, 6144), (12288, 2560), (512, 2560),
                                       (640, 2560), (2560, 640), (320, 10240), (10240, 320), (248320, 2560))}
DENSE_CONFIGS = ((8, 512, 4), (4, 512, 4), (16, 256, 4), (8, 1024, 4), (4, 1024, 2), (16, 512, 8), (2, 1024, 2),
                 (16, 128, 4), (32, 128, 4), (32, 256, 8), (64, 64, 4))
L2_PAST_BYTES = 256 << 20           # weights rotated through at least this many bytes: each call reads HBM
DEFAULT_MODELS = "olmoe-1b-7b,qwen3-30b-a3b,gpt-oss-120b"
NUM_SETS = 64                      # rotating expert sets a graph replays: ~768 MB of slots, far past the L2


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", help=f"comma-separated, of {', '.join(SHAPES)} (default: {DEFAULT_MODELS}); with "
                   f"--dense, of {', '.join(DENSE_SHAPES)} (default: all)")
    p.add_argument("--formats", default="int8,fp8,nvfp4,mxfp4", help=f"comma-separated, of {', '.join(FORMATS)}")
    p.add_argument("--dense", action="store_true", help="the int8 dense linear instead of the expert kernels")
    p.add_argument("--ptxas", action="store_true", help="compile offline for --arch: registers, instructions a byte")
    p.add_argument("--arch", type=int, default=90, help="with --ptxas: the SM version (default 90)")
    p.add_argument("--default-only", action="store_true", help="time each format's default config, no sweep")


def run(args) -> int:
    from engine.errors import SluiceError
    known = DENSE_SHAPES if args.dense else SHAPES
    models = args.models.split(",") if args.models else list(DENSE_SHAPES) if args.dense else DEFAULT_MODELS.split(",")
    formats = args.formats.split(",")
    if bad := [m for m in models if m not in known] + [f for f in formats if f not in FORMATS]:
        raise SluiceError(f"Unknown {', '.join(bad)}: models are {', '.join(known)}; formats {', '.join(FORMATS)}.")
    if args.ptxas and args.dense:
        from bench.ptxas_decode import dense_report
        dense_report(args.arch)
        return 0
    if args.dense:
        rows = [dict(dense_row(n, k), model=m) for m in models for n, k in DENSE_SHAPES[m]]
        save_json(args.out, "kernels-dense", rows)
        print("\n| model | [out, in] | int8 | GB/s of codes | bf16 (torch) | config |\n|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['model']} | {r['shape']} | {r['int8_us']:.1f} us | {r['codes_gbps']:.0f} | {r['bf16_us']:.1f} us "
                  f"| {r['config']} |", flush=True)
        return 0
    if args.ptxas:
        from bench.ptxas_decode import report
        report(models, formats, args.arch)
        return 0
    hbm = kernel_env()
    rows = []
    for model in models:
        for fmt in formats:
            rows.append(expert_row(model, SHAPES[model], fmt, hbm, args.default_only))
            save_json(args.out, "kernels", rows)
    print_table(rows)
    return 0


def kernel_env() -> float:
    """Print the device, its copy bandwidths and the host sync time; returns the HBM copy rate (bytes/s)."""
    import torch
    from triton.testing import do_bench

    from engine.plan.bandwidth import h2d_bps, hbm_copy_bps
    from kernels.selfcheck import device_fingerprint
    hbm, h2d = hbm_copy_bps(), h2d_bps()
    ids = torch.randint(0, 128, (1, 16), device="cuda")
    sync_us = do_bench(lambda: ids.tolist(), return_mode="median") * 1e3
    print(f"{device_fingerprint('cuda')}: HBM copy {hbm / 1e12:.2f} TB/s, h2d {h2d / 1e9:.1f} GB/s, "
          f"host sync (16 expert ids) {sync_us:.1f} us", flush=True)
    return hbm


def sweep(fmt: str) -> list:
    """Configs tried for a format: a wide sweep for one-byte weights, a grid of rows x tile x warps for fp4."""
    from kernels.moe_decode import DecodeConfig as C, default_config
    if fmt in ("fp8", "int8"):
        return [default_config(fmt), C(8, 4, 1024, 4), C(8, 4, 1024, 4, True), C(8, 8, 1024, 4, True),
                C(4, 4, 2048, 4, True), C(16, 8, 512, 4, True), C(8, 16, 512, 4, True), C(4, 8, 1024, 2, True),
                C(4, 4, 1024, 2, True), C(16, 16, 256, 4), C(8, 8, 2048, 8, True), C(2, 8, 2048, 4, True),
                C(4, 16, 2048, 8, True), C(8, 16, 512, 4, True, num_stages=1), C(2, 4, 1024, 2, True),
                C(4, 4, 2048, 2, True), C(2, 2, 1024, 1, True), C(4, 4, 1024, 1, True), C(2, 4, 2048, 2, True),
                C(8, 4, 1024, 2, True), C(4, 4, 512, 2, True)]
    if fmt in ("nvfp4", "mxfp4"):
        grid = [C(r, r, k, w, True) for r in (4, 8, 16) for k in (512, 1024) for w in (1, 2, 4)
                if (r, w) not in ((4, 4), (16, 1))]
        return list(dict.fromkeys([default_config(fmt), *grid, C(8, 16, 1024, 2, True), C(16, 8, 1024, 4, True),
                                   C(8, 8, 512, 2)]))
    return [default_config(fmt), C(16, 8, 512, 4), C(16, 8, 512, 4, True), C(8, 4, 1024, 4, True),
            C(8, 8, 512, 4, True), C(4, 8, 512, 2, True)]


class ExpertCase:
    """One family's expert shapes in one format: a bank of ~768 MB of random valid blocks on the GPU, rotating
    expert sets, one token."""

    def __init__(self, shape: tuple, fmt: str):
        import torch

        from kernels.formats import make_offsets, random_bank
        self.inter, self.hidden, self.top_k = shape
        self.fmt = fmt
        self.offsets, block_bytes = make_offsets(fmt, self.inter, self.hidden)
        small = random_bank(16, block_bytes, fmt, self.offsets, self.inter, self.hidden,
                            generator=torch.Generator().manual_seed(1))
        self.num_slots = max(16, (768 << 20) // block_bytes // 16 * 16)
        self.bank = small.cuda().repeat(self.num_slots // 16, 1)
        self.block_bytes = block_bytes
        self.gen = torch.Generator().manual_seed(2)
        self.sets = [self.slot_rows(1) for _ in range(NUM_SETS)]
        self.weights = torch.rand(1, self.top_k, device="cuda")
        self.x = torch.randn(1, self.hidden, device="cuda", dtype=torch.bfloat16)

    def slot_rows(self, tokens: int):
        import torch
        return torch.stack([torch.randperm(self.num_slots, generator=self.gen)[:self.top_k]
                            for _ in range(tokens)]).int().cuda()

    def call(self, config=None, reference: bool = False):
        """A function of i: the kernel (or its torch reference) on expert set i."""
        from kernels.moe_decode import moe_decode, moe_decode_ref
        if reference:
            return lambda i: moe_decode_ref(self.x, self.bank, self.sets[i], self.weights, self.fmt, self.offsets,
                                            self.inter)
        return lambda i: moe_decode(self.x, self.bank, self.sets[i], self.weights, self.fmt, self.offsets,
                                    self.inter, config=config)

    def errors(self) -> list[float]:
        """Relative error against the torch reference on fresh data, for 1 and 4 tokens."""
        import torch

        from kernels.moe_decode import moe_decode, moe_decode_ref
        from kernels.selfcheck import rel_error
        errs = []
        for tokens in (1, 4):
            xs = torch.randn(tokens, self.hidden, device="cuda")
            rows, ws = self.slot_rows(tokens), torch.rand(tokens, self.top_k, device="cuda")
            args = (xs, self.bank, rows, ws, self.fmt, self.offsets, self.inter)
            errs.append(rel_error(moe_decode(*args), moe_decode_ref(*args)))
        return errs

    def weight_bytes(self) -> int:
        import torch

        from kernels.formats import part_specs, proj_shapes
        per_expert = sum(torch.Size(shape).numel() * torch.empty((), dtype=dt).element_size()
                         for out_f, in_f in proj_shapes(self.inter, self.hidden).values()
                         for _, dt, shape in part_specs(self.fmt, out_f, in_f))
        return self.top_k * per_expert


def expert_row(model: str, shape: tuple, fmt: str, hbm: float, default_only: bool = False) -> dict:
    """Correctness, the config sweep, eager and torch times, the self-check's verdict, and for fp4 the previous
    tiles' best time."""
    from triton.testing import do_bench

    from kernels.selfcheck import select_moe_decode
    case = ExpertCase(shape, fmt)
    errs, weight_bytes = case.errors(), case.weight_bytes()
    cfg, t_graph = best_config(case, f"{model} {fmt}", weight_bytes / hbm,
                              sweep(fmt)[:1] if default_only else sweep(fmt))
    turn = iter(range(10 ** 9))
    t_eager = do_bench(lambda: case.call(cfg)(next(turn) % NUM_SETS), return_mode="median") * 1e-3
    t_torch = do_bench(lambda: case.call(reference=True)(next(turn) % NUM_SETS), return_mode="median") * 1e-3
    _, verdict = select_moe_decode(fmt, case.offsets, case.block_bytes, case.inter, case.hidden, case.top_k, "cuda")
    row = {"model": model, "fmt": fmt, "rel_err_T1": errs[0], "rel_err_T4": errs[1], "best_config": cfg.__dict__,
           "weight_bytes": weight_bytes, "graph_us": t_graph * 1e6, "eager_us": t_eager * 1e6,
           "torch_ref_us": t_torch * 1e6, "graph_frac_of_hbm_copy": weight_bytes / t_graph / hbm,
           "selfcheck": {"ok": verdict.ok, "reason": verdict.reason}}
    print(f"{model:18s} {fmt:6s} err {errs[0]:.1e}/{errs[1]:.1e}  {weight_bytes / 1e6:6.1f} MB  graph "
          f"{t_graph * 1e6:7.1f} us ({row['graph_frac_of_hbm_copy']:.0%} of HBM copy)  eager {t_eager * 1e6:7.1f} us  "
          f"torch {t_torch * 1e6:8.1f} us  best {config_name(cfg)}", flush=True)
    return row


def best_config(case: ExpertCase, label: str, copy_s: float, configs: list):
    """(config, seconds) of the fastest config by CUDA-graph replay time; configs that do not compile or disagree with
    the torch reference (relative error over 1e-4 on one expert set) are skipped."""
    from kernels.selfcheck import rel_error
    reference = case.call(reference=True)(0)
    best = None
    for cfg in configs:
        try:
            err = rel_error(case.call(cfg)(0), reference)
            t = graph_time(case.call(cfg), NUM_SETS) if err < 1e-4 else None
        except Exception as exc:      # noqa: BLE001 - a config that does not compile is skipped
            print(f"  {label} {config_name(cfg)}: failed {type(exc).__name__}")
            continue
        if t is None:
            print(f"  {label} {config_name(cfg)}: WRONG, error {err:.1e} against the torch reference")
            continue
        print(f"  {label} {config_name(cfg)}: {t * 1e6:.1f} us ({copy_s / t:.0%}), err {err:.1e}")
        if best is None or t < best[1]:
            best = (cfg, t)
    return best


def print_table(rows: list[dict]) -> None:
    """Last: each row's best time, its share of HBM copy and its config."""
    from kernels.moe_decode import DecodeConfig
    print("\n| shapes | format | time | share of HBM copy | config |\n|---|---|---|---|---|")
    for r in rows:
        cfg = config_name(DecodeConfig(**r["best_config"]))
        print(f"| {r['model']} | {r['fmt']} | {r['graph_us']:.1f} us | {r['graph_frac_of_hbm_copy']:.0%} | {cfg} |",
              flush=True)


def config_name(cfg) -> str:
    return f"{cfg.block_i}/{cfg.block_h}/{cfg.block_k}/w{cfg.num_warps}{'/split' if cfg.split_down else ''}"


def graph_time(call, n: int) -> float:
    """Seconds a call: n calls captured in one CUDA graph, the median of 10 replays."""
    import torch
    for i in range(n):
        call(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n):
            call(i)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / n)
    return sorted(times)[len(times) // 2]


def dense_row(n: int, k: int) -> dict:
    """The int8 dense linear at one token against the bf16 weight through torch, both in a CUDA graph, each call on
    the next of enough weight copies that the L2 never holds the one it reads (as in a decode step)."""
    import torch

    from kernels.cpu_linear import int8_linear_ref
    from kernels.int8_linear import LinearConfig, int8_linear_kernel
    from kernels.selfcheck import rel_error
    copies = max(1, -(-L2_PAST_BYTES // (n * k)))
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8).cuda()
    scale = (torch.rand(n, generator=gen) / k ** 0.5 / 64).to("cuda", torch.bfloat16)
    qs = [q] + [q.clone() for _ in range(copies - 1)]
    xs = [torch.randn(1, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    w16 = [(q.float() * scale.float()[:, None]).bfloat16()]
    w16 += [w16[0].clone() for _ in range(max(1, -(-L2_PAST_BYTES // (2 * n * k))) - 1)]
    t_bf16 = graph_time(lambda i: torch.nn.functional.linear(xs[i % copies], w16[i % len(w16)]), len(w16))
    del w16
    best = None
    for cfg in [LinearConfig(*c) for c in DENSE_CONFIGS]:
        try:
            err = rel_error(int8_linear_kernel(xs[0], q, scale, cfg), int8_linear_ref(xs[0], q, scale))
            t = graph_time(lambda i, cfg=cfg: int8_linear_kernel(xs[i], qs[i], scale, cfg), copies)
        except Exception as exc:      # noqa: BLE001 - a config that does not compile is skipped
            print(f"  {n}x{k} {cfg}: failed {type(exc).__name__}")
            continue
        best = min(best or (cfg, t, err), (cfg, t, err), key=lambda b: b[1])
    print(f"int8 linear {n}x{k}: {best[1] * 1e6:.1f} us ({n * k / best[1] / 1e9:.0f} GB/s of codes, {best[0]}) "
          f"against bf16 through torch {t_bf16 * 1e6:.1f} us; err {best[2]:.1e}", flush=True)
    return {"shape": [n, k], "bf16_us": t_bf16 * 1e6, "int8_us": best[1] * 1e6, "codes_gbps": n * k / best[1] / 1e9,
            "err": best[2], "config": str(best[0])}
