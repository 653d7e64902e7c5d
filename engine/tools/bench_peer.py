"""`sluice bench --llama-bench PATH`: llama.cpp's llama-bench right after Sluice, in the same regime (cap,
VRAM budget), on a GGUF of the same HF checkpoint, and Sluice's speed as a multiple of the best `-ncmoe`
that fits the same VRAM budget.
"""
from __future__ import annotations

from pathlib import Path

from engine.errors import SluiceError
from engine.tools.peer import peer_line, sweep
from engine.tools.regimes import REGIMES, Regime

# without a regime: the budgets as given, RAM free, fits-ram's -ncmoe list
AS_GIVEN = Regime("as-given", None, "4GB", REGIMES["fits-ram"].ncmoe, "budgets as given, RAM unconstrained")


def check_llama_options(opts) -> None:
    """Before anything is measured: the paths the peer run needs."""
    for flag, path in (("--llama-bench", opts.llama_bench), ("--llama-gguf", opts.llama_gguf)):
        if path and not Path(path).is_file():
            raise SluiceError(f"{flag} {path} is not a file: give the path of llama.cpp's "
                              + ("llama-bench (scripts/peer/llamacpp.py build makes one)." if flag == "--llama-bench"
                                 else "GGUF of this preset (scripts/peer/llamacpp.py convert makes one), or leave it out."))


def run_llama_side(sluice: dict, args, opts, reg: Regime | None, work: Path, log) -> dict:
    from engine.tools import llamacpp
    binary = Path(opts.llama_bench)
    gguf = Path(opts.llama_gguf) if opts.llama_gguf else llamacpp.convert_preset(
        args.preset, work, Path(opts.llama_src) if opts.llama_src else llamacpp.default_src(), args.device, log)
    # the same driver-view VRAM: Sluice's budget, or what the driver showed for Sluice where that was more
    vram_limit = max(sluice["vram_budget_bytes"], sluice.get("vram_driver_bytes") or 0)
    peer = sweep(binary, gguf, reg or AS_GIVEN, tuple(opts.llama_ncmoe) if opts.llama_ncmoe else None,
                 vram_budget=str(vram_limit), log=log, n_prompt=args.prompt_tokens,
                 threads=opts.llama_threads, use_cgroup=not opts.no_cgroup, drop_cache=not opts.keep_page_cache,
                 log_dir=work)
    peer["gguf"] = str(gguf)
    peer["ratio"] = ratios(sluice, peer)
    return peer


def ratios(sluice: dict, peer: dict) -> dict:
    """Sluice / llama.cpp: decode against the best -ncmoe within the VRAM limit (or, where every such run was
    stopped before its decode finished, a lower bound), prefill against the best pp within it."""
    fitting = [r for r in peer["runs"] if r["vram_driver_bytes"] is None or r["vram_driver_bytes"] <= peer["vram_limit_bytes"]]
    best, out = peer["best"], {"ncmoe": peer["best"]["ncmoe"] if peer["best"] else None}
    if best:
        out["decode"] = sluice["decode_tok_s"] / best["decode_tok_s"]
    elif bounds := [r["decode_tok_s_below"] for r in fitting if r["decode_tok_s_below"]]:
        out["decode_at_least"] = sluice["decode_tok_s"] / max(bounds)
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
    decode = f"{x['decode']:.2f}x" if "decode" in x else \
        (f">= {x['decode_at_least']:.1f}x" if "decode_at_least" in x else "n/a (no llama.cpp decode within the VRAM limit)")
    prefill = f"warm {x['warm_prefill_vs_pp']:.2f}x, cold {x['cold_prefill_vs_pp']:.2f}x" if "warm_prefill_vs_pp" in x else "n/a"
    return ([f"llama.cpp    {peer_line(run)}" for run in p["runs"]]
            + [f"vs llama.cpp Sluice / llama.cpp (best -ncmoe within {p['vram_limit_bytes'] / 1e9:.2f} GB: "
               f"{x['ncmoe']}): decode {decode}; prefill {prefill} of its pp{r['prompt_tokens']}"])
