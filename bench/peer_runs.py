"""Runs of the peer (llama.cpp's llama-bench) in one of the bench's memory regimes: a sweep over `-ncmoe`,
each run in a fresh cgroup cap (page cache dropped first), the best run whose driver-view VRAM fits the
regime's VRAM budget (the one to beat), and Sluice's speed as a multiple of it.
"""
from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

from bench.cgroup import CgroupUnavailable, MemoryCap, drop_page_cache
from bench.llamacpp import RUN_SETTINGS, VramPoller, llama_bench_argv, parse_llama_bench, summarize
from bench.regimes import Regime, vram_budget_bytes


def _read_lines(stream, lines: list, times: list) -> None:
    for line in stream:
        lines.append(line)
        times.append(time.perf_counter())


def run_once(argv: list[str], timeout_s: float, cap: MemoryCap | None, stderr) -> dict:
    """One llama-bench process: its output, when each line came, whether it was stopped at the timeout,
    and the peak VRAM the driver showed for it."""
    start = time.perf_counter()
    proc = subprocess.Popen(cap.command(argv) if cap else argv, stdout=subprocess.PIPE, stderr=stderr, text=True)
    lines, times = [], []
    stopped = None
    reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines, times), daemon=True)
    reader.start()
    with VramPoller(proc.pid) as vram:
        try:
            proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            stopped = time.perf_counter()
            proc.kill()
            proc.wait()
            timed_out = True
    reader.join(timeout=5)
    end = time.perf_counter()
    return {"text": "".join(lines), "line_times": [t - start for t in times], "elapsed_s": end - start,
            "stopped_s": (stopped or end) - start,
            "timed_out": timed_out, "returncode": proc.returncode,
            "vram_driver_bytes": vram.peak_process_bytes, "vram_all_processes_bytes": vram.peak_all_bytes}


def decode_bound(raw: dict, rows: list[dict], n_gen: int, reps: int) -> float | None:
    """For a run stopped after its prefill test but before its decode test finished: the decode speed it
    stayed below (the tokens it had to generate over the time it had for them, from the prefill's line to the stop)."""
    done = summarize(rows)
    if not raw["timed_out"] or done["decode_tok_s"] is not None or done["prefill_tok_s"] is None:
        return None
    return n_gen * reps / max(raw["stopped_s"] - raw["line_times"][-1], 1e-9)


def run_peer(binary: Path, gguf: Path, ncmoe: int, regime: Regime, *, n_prompt: int, threads: int = 16,
             n_gen: int | None = None, reps: int | None = None, timeout_s: float | None = None,
             use_cgroup: bool = True, drop_cache: bool = True, log_dir: Path | None = None) -> dict:
    """One llama-bench run of `-ncmoe ncmoe` in `regime`: a JSON row for the report."""
    s = {**RUN_SETTINGS["default"], **RUN_SETTINGS.get(regime.name, {})}
    n_gen, reps, timeout_s = n_gen or s["n_gen"], reps or s["reps"], timeout_s or s["timeout_s"]
    cap, cap_note = None, None
    if regime.memory_cap_bytes and use_cgroup:
        try:
            cap = MemoryCap.create(f"sluice-peer-{os.getpid()}-{ncmoe}", regime.memory_cap_bytes)
        except CgroupUnavailable as exc:
            cap_note = str(exc)
    dropped = drop_cache and drop_page_cache()
    argv = llama_bench_argv(binary, gguf, ncmoe, threads, n_prompt, n_gen, reps)
    with open(Path(log_dir or "/tmp") / f"llama-bench-{regime.name}-ncmoe{ncmoe}.log", "w") as err:
        raw = run_once(argv, timeout_s, cap, err)
    rows = parse_llama_bench(raw["text"])
    row = {"engine": "llama.cpp", "regime": regime.name, "ncmoe": ncmoe, **summarize(rows),
           "decode_tok_s_below": decode_bound(raw, rows, n_gen, reps), "n_gen": n_gen, "reps": reps,
           "timed_out": raw["timed_out"], "returncode": raw["returncode"], "elapsed_s": raw["elapsed_s"],
           "vram_driver_bytes": raw["vram_driver_bytes"], "vram_all_processes_bytes": raw["vram_all_processes_bytes"],
           "memory_cap_bytes": cap.limit_bytes if cap else None, "cgroup_peak_bytes": cap.peak_bytes() if cap else None,
           "memory_cap_note": cap_note, "page_cache_dropped": dropped, "argv": argv}
    if cap:
        cap.remove()
    return row


def best_run(rows: list[dict], vram_limit_bytes: int) -> dict | None:
    """The fastest decode among runs whose driver-view VRAM stayed within the limit (a run whose VRAM
    could not be read counts as within it, and says so with vram_driver_bytes None)."""
    fitting = [r for r in rows if r["decode_tok_s"] is not None
               and (r["vram_driver_bytes"] is None or r["vram_driver_bytes"] <= vram_limit_bytes)]
    return max(fitting, key=lambda r: r["decode_tok_s"], default=None)


def sweep(binary: Path, gguf: Path, regime: Regime, ncmoe: tuple[int, ...] | None = None, vram_budget: str | None = None,
          log=print, **kw) -> dict:
    """llama-bench for each `-ncmoe` value in `regime`, and the best one within the regime's VRAM budget."""
    rows = []
    for n in ncmoe or regime.ncmoe:
        rows.append(run_peer(binary, gguf, n, regime, **kw))
        log(peer_line(rows[-1]))
    limit = vram_budget_bytes(regime, vram_budget)
    return {"regime": regime.name, "vram_limit_bytes": limit, "runs": rows, "best": best_run(rows, limit)}


def peer_line(r: dict) -> str:
    gib = lambda n: f"{n / 2**30:.2f} GiB" if n else "n/a"                       # noqa: E731
    decode = f"{r['decode_tok_s']:.2f}" if r["decode_tok_s"] is not None else \
        (f"< {r['decode_tok_s_below']:.2f}" if r["decode_tok_s_below"] else "n/a")
    prefill = f"{r['prefill_tok_s']:.1f}" if r["prefill_tok_s"] is not None else "n/a"
    cap = f", cgroup peak {gib(r['cgroup_peak_bytes'])} of {gib(r['memory_cap_bytes'])}" if r["memory_cap_bytes"] else ""
    return (f"llama.cpp {r['regime']} -ncmoe {r['ncmoe']}: decode {decode} tok/s, pp{r['prefill_tokens'] or ''} "
            f"{prefill} tok/s, driver VRAM {gib(r['vram_driver_bytes'])}{cap}"
            + (" (stopped at the timeout)" if r["timed_out"] else "")
            + (f" (exit {r['returncode']})" if r["returncode"] not in (0, None) and not r["timed_out"] else ""))


def steady_decode_tok_s(sluice: dict) -> float:
    """Sluice's decode to set beside llama-bench's: its second reply's, after the RAM fill (llama-bench times its
    runs after a warm-up run, the GGUF read whole at load), or the first reply's where a run has no second."""
    return (sluice.get("steady_decode") or {}).get("tok_s") or sluice["decode_tok_s"]


def ratios(sluice: dict, peer: dict) -> dict:
    """Sluice / llama.cpp: decode against the best -ncmoe within the VRAM limit (or, where every such run was
    stopped before its decode finished, a lower bound), prefill against the best pp within it."""
    fitting = [r for r in peer["runs"] if r["vram_driver_bytes"] is None or r["vram_driver_bytes"] <= peer["vram_limit_bytes"]]
    best, out = peer["best"], {"ncmoe": peer["best"]["ncmoe"] if peer["best"] else None}
    decode = steady_decode_tok_s(sluice)
    if best:
        out["decode"] = decode / best["decode_tok_s"]
        out["first_reply_decode"] = sluice["decode_tok_s"] / best["decode_tok_s"]
    elif bounds := [r["decode_tok_s_below"] for r in fitting if r["decode_tok_s_below"]]:
        out["decode_at_least"] = decode / max(bounds)
    pp = max((r["prefill_tok_s"] for r in fitting if r["prefill_tok_s"]), default=None)
    if pp:
        out["warm_prefill_vs_pp"] = sluice.get("warm_prefill_tok_s", sluice["prefill_tok_s"]) / pp
        out["cold_prefill_vs_pp"] = sluice["prefill_tok_s"] / pp
    return out


def peer_lines(r: dict) -> list[str]:
    p = r.get("llama_cpp")
    if not p:
        return []
    x = p["ratio"]
    decode = f"{x['decode']:.2f}x steady, {x['first_reply_decode']:.2f}x the first reply" if "decode" in x else \
        (f">= {x['decode_at_least']:.1f}x" if "decode_at_least" in x else "n/a (no llama.cpp decode within the VRAM limit)")
    prefill = f"warm {x['warm_prefill_vs_pp']:.2f}x, cold {x['cold_prefill_vs_pp']:.2f}x" if "warm_prefill_vs_pp" in x else "n/a"
    return ([f"llama.cpp    {peer_line(run)}" for run in p["runs"]]
            + [f"vs llama.cpp Sluice / llama.cpp (best -ncmoe within {p['vram_limit_bytes'] / 1e9:.2f} GB: "
               f"{x['ncmoe']}): decode {decode}; prefill {prefill} of its pp{r['prompt_tokens']}"])
