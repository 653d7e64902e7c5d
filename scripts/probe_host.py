"""Host-side facts for the hybrid CPU+GPU placement (issue #10), printed as a short table:
CPU model, expert-MLP time on the CPU per storage form and thread count (OLMoE-1B-7B shapes, one
token), and the process's own memory after importing torch and initialising CUDA."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F


def rss_breakdown() -> str:
    fields = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if parts[0] in ("Rss:", "Anonymous:", "Pss_File:", "Pss_Anon:"):
                fields[parts[0][:-1]] = int(parts[1]) / 2**20
    return " ".join(f"{k}={v:.2f}GiB" for k, v in fields.items())


def timed(fn, n=40) -> float:
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def expert_forms(hidden: int, inter: int):
    g = torch.Generator().manual_seed(0)
    wi8 = torch.randint(-127, 127, (2 * inter, hidden), dtype=torch.int8, generator=g)
    si8 = torch.rand(2 * inter, generator=g).bfloat16() / 100
    di8 = torch.randint(-127, 127, (hidden, inter), dtype=torch.int8, generator=g)
    dsi8 = torch.rand(hidden, generator=g).bfloat16() / 100
    wbf = torch.randn(2 * inter, hidden, generator=g).bfloat16()
    dbf = torch.randn(hidden, inter, generator=g).bfloat16()

    def int8(x):
        gu = torch.ops.aten._weight_int8pack_mm(x, wi8, si8)
        return torch.ops.aten._weight_int8pack_mm((F.silu(gu[:, :inter]) * gu[:, inter:]).contiguous(), di8, dsi8)

    def bf16(x):
        gu = F.linear(x, wbf)
        return F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], dbf)

    return {"int8": (int8, 3 * inter * hidden), "bf16": (bf16, 6 * inter * hidden)}


def streamed(hidden: int, inter: int, count: int = 96, busy_gpu: bool = False, worker: bool = False) -> dict:
    """us per expert over `count` distinct experts (DRAM, not L3), as the engine runs them: on a
    worker thread, optionally while the main thread keeps launching and syncing small CUDA work."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    g = torch.Generator().manual_seed(1)
    experts = [(torch.randint(-127, 127, (2 * inter, hidden), dtype=torch.int8, generator=g),
                torch.rand(2 * inter, generator=g).bfloat16() / 100,
                torch.randint(-127, 127, (hidden, inter), dtype=torch.int8, generator=g),
                torch.rand(hidden, generator=g).bfloat16() / 100) for _ in range(count)]
    x = torch.randn(1, hidden).bfloat16()

    def one(e):
        wi8, si8, di8, dsi8 = e
        gu = torch.ops.aten._weight_int8pack_mm(x, wi8, si8)
        return torch.ops.aten._weight_int8pack_mm((F.silu(gu[:, :inter]) * gu[:, inter:]).contiguous(), di8, dsi8)

    def run_all():
        with torch.inference_mode():
            start = time.perf_counter()
            for _ in range(3):
                for e in experts:
                    one(e)
            return (time.perf_counter() - start) / (3 * count)

    stop = threading.Event()
    if busy_gpu and torch.cuda.is_available():
        def launcher():
            a = torch.randn(64, 2048, device="cuda")
            while not stop.is_set():
                (a * 2).sum().item()
        threading.Thread(target=launcher, daemon=True).start()
    run_all()
    if worker:
        with ThreadPoolExecutor(1) as pool:
            s = pool.submit(run_all).result()
    else:
        s = run_all()
    stop.set()
    return s


def main() -> None:
    print(subprocess.run("lscpu | grep -E 'Model name|^CPU\\(s\\)|Flags' | cut -c1-200", shell=True,
                         capture_output=True, text=True).stdout)
    print("after import torch:", rss_breakdown())
    hidden, inter = 2048, 1024
    rows = []
    for threads in (1, 4, 8, 15, 16):
        torch.set_num_threads(threads)
        for name, (fn, nbytes) in expert_forms(hidden, inter).items():
            for tokens in (1, 8):
                x = torch.randn(tokens, hidden).bfloat16()
                s = timed(lambda: fn(x))
                rows.append((name, threads, tokens, s * 1e6, nbytes / s / 1e9))
    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")
        print("after CUDA init:", rss_breakdown())
        a = torch.randn(4096, 4096, device="cuda")
        (a @ a).sum().item()
        print("after cublas:", rss_breakdown())
        host = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
        dev = torch.empty_like(host, device="cuda")
        torch.cuda.synchronize()
        s = timed(lambda: (dev.copy_(host, non_blocking=True), torch.cuda.synchronize()), 10)
        print(f"pinned H2D 256 MiB: {host.numel() / s / 1e9:.1f} GB/s")
    torch.set_num_threads(15)
    big = torch.ones(1 << 28, dtype=torch.int64)                 # 2 GiB: DRAM, not L3
    for threads in (4, 8, 15):
        torch.set_num_threads(threads)
        s = timed(lambda: big.sum(), 5)
        print(f"DRAM read, {threads} threads (int64 sum of 2 GiB): {big.numel() * 8 / s / 1e9:.1f} GB/s")
    del big
    torch.set_num_threads(15)
    for label, kw in (("int8, 96 distinct experts", {}), ("int8, 96 experts, worker thread", {"worker": True}),
                      ("int8, 96 experts, worker + busy CUDA main thread", {"worker": True, "busy_gpu": True})):
        s = streamed(hidden, inter, **kw)
        print(f"{label}: {s * 1e6:.0f} us/expert, {3 * inter * hidden / s / 1e9:.1f} GB/s")
    print("| form | threads | tokens | us/expert | GB/s of weights |")
    for name, threads, tokens, us, gbs in rows:
        print(f"| {name} | {threads} | {tokens} | {us:.0f} | {gbs:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
