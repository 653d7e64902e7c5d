"""The benchmark matrix (issue 37): each family's `sluice bench` (Engine.generate) in each memory regime, and
llama.cpp's llama-bench beside it on a GGUF of the same HF checkpoint, in one table.

    python -m bench matrix [FAMILY ...] [--regime R ...] [--llama-bench BIN] [--dry-run] [-- sluice bench flags]

FAMILY: one of bench/matrix_plan.py's FAMILIES (default: all). Each family runs its preset, or the most of its
layers whose files (HF checkpoint, Sluice's repack, the GGUF) fit --disk-limit; where its layers are fixed, the
peer runs a separate random draw of the same shapes instead (bench/matrix_plan.py, plan_family). The output says
which run a layer subset or a separate draw. Each regime's memory cap and VRAM budget are scaled to the family's
size (OLMoE's are the regimes' own).

Per regime, with a llama-bench and a family llama.cpp's converter takes:
  fits-ram, exceeds: Sluice at the regime's VRAM budget, then llama-bench over -ncmoe points around Sluice's
      driver-view VRAM, under the same cap; the fastest within that VRAM is the one to beat.
  fits-vram-ram: llama-bench first, -ncmoe points around the regime's VRAM budget under the cap; its fastest
      within that budget sets Sluice's VRAM budget (its driver-view VRAM), so the two compare at equal VRAM.
Without a llama-bench (or for a family llama.cpp cannot take: said in the output) the peer's columns say "not
run" and Sluice runs the preset written directly, at the regime's budget. `-- --copy-rate-gbps 25` runs Sluice on a
simulated slower PCIe link (its copies paced; the table's Sluice cells say so); llama.cpp's copies are not paced.

The table (family x regime: decodes, the ratio, warm and cold prefill against llama.cpp's pp, efficiency and the
longer wait of a decode token) is printed last; the results go to OUT/matrix.json, merged with what an earlier
call left there, so a session can fill the matrix a few families a call (--out on a folder that stays).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

from bench import llamacpp
from bench.common import save_json
from bench.matrix_plan import (NEW_TOKENS, PROMPT_TOKENS, REFERENCE_PRESET, RESERVED_DISK_BYTES, SAME, SEPARATE, Planned,
                               families, file_bytes, format_table, ncmoe_points, plan_family, scaled_regime,
                               sluice_vram_at)
from bench.origin import origin_lines, origin_projection
from bench.peer_runs import peer_lines, ratios, sweep
from bench.regimes import REGIMES, Regime, describe
from engine.errors import SluiceError
from engine.sizes import format_size, parse_size
from engine.tools.presets import hf_checkpoint_dir

PEER_VRAM = "PEER_VRAM"        # the dry run's stand-in for the VRAM of llama.cpp's best point


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("families", nargs="*", metavar="FAMILY", help="families to run (default: all)")
    p.add_argument("--regime", nargs="+", default=list(REGIMES), choices=list(REGIMES), help="default: all three")
    p.add_argument("--llama-bench", type=Path, help="llama.cpp's llama-bench (python -m bench peer build makes one)")
    p.add_argument("--llama-src", type=Path, default=llamacpp.default_src(),
                   help="llama.cpp source with convert_hf_to_gguf.py (default: peer/llama.cpp)")
    p.add_argument("--llama-threads", type=int, default=16, help="llama-bench -t (default 16)")
    p.add_argument("--llama-ncmoe", type=int, nargs="+",
                   help="llama-bench -ncmoe values (default: points predicted around the VRAM limit)")
    p.add_argument("--llama-timeout", type=float, help="seconds a llama-bench run (default: 240, 120 in exceeds)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--disk-limit", default="64GB", help="the disk the files must fit (default 64GB)")
    p.add_argument("--clean", action="store_true", help="delete a family's files once its regimes are done")
    p.add_argument("--no-cgroup", action="store_true", help="the caps as budgets only (no cgroup v2 memory.max)")
    p.add_argument("--keep-page-cache", action="store_true", help="do not drop the page cache before each run")
    p.add_argument("--dry-run", action="store_true", help="print every command and the files' sizes; run nothing")
    p.add_argument("--build-peer", action="store_true",
                   help="build --llama-bench from --llama-src where it is missing, in the background while the "
                        "files are written (its build folder: the binary's folder's parent)")
    p.add_argument("--prepare-only", action="store_true",
                   help="write each family's files (HF checkpoint, GGUF, Sluice's repack) and build the peer; "
                        "time nothing (a later call runs the same command without it)")


def run(args) -> int:
    from engine.tools.presets import PRESETS
    chosen = families(args.families)
    built = _start_peer_build(args) if args.build_peer and not args.dry_run else None
    if args.llama_bench and not args.dry_run and not built and not args.llama_bench.is_file():
        raise SluiceError(f"--llama-bench {args.llama_bench} is not a file: give the path of llama.cpp's llama-bench "
                          "(python -m bench peer build makes one), or leave it out.")
    with_peer = args.llama_bench is not None
    disk_limit = parse_size(args.disk_limit)
    plans = [plan_family(f, PRESETS, disk_limit, with_peer) for f in chosen]
    for plan in plans:
        PRESETS.setdefault(plan.preset, plan.config)      # a layer subset: the bench's children get it from here
    reference = file_bytes(_reference_config(), "int8").gguf_bytes
    if args.dry_run:
        print("\n".join(dry_run_lines(plans, args, reference)))
        return 0
    if args.prepare_only or built:
        for plan in plans:             # the files written while llama-bench builds
            _prepare(plan, args)
    if built:
        built()
    if args.prepare_only:
        return 0
    path = args.out / "matrix.json"
    matrix = _load(path)
    failed = 0
    for plan in plans:
        failed += run_family(plan, args, reference, matrix)
        if args.clean:
            _remove_files(plan, args.work_dir)
    print(format_table(matrix), flush=True)
    print(f"JSON: {path}")
    return 1 if failed else 0


def _start_peer_build(args):
    """A function that waits for llama-bench's build started here, or None where nothing is built."""
    if args.llama_bench is None:
        raise SluiceError("--build-peer needs --llama-bench: the path the build leaves it at (BUILD/bin/llama-bench).")
    from bench.stages.peer import build
    build_dir = args.llama_bench.parent.parent
    if llamacpp.bench_binary(build_dir) != args.llama_bench:
        raise SluiceError(f"--llama-bench {args.llama_bench} is not a build's bin/llama-bench: give "
                          "BUILD/bin/llama-bench, or build it with `python -m bench peer build`.")
    return build(argparse.Namespace(out=args.out, src=args.llama_src, build_dir=build_dir,
                                    jobs=os.cpu_count() or 16, cpu_only=False), wait=False)


def _prepare(plan: Planned, args) -> None:
    """A family's files as its cells will read them: the GGUF (with its HF checkpoint) and Sluice's model."""
    from engine.tools.bench import build_apart
    if not plan.fits:
        _progress(f"{plan.family.name}: {_over_disk(plan)}")
        return
    gguf, no_peer = _gguf(plan, args)
    _progress(f"{plan.family.name}: GGUF {gguf or no_peer}")
    model_dir, _ = build_apart(plan.preset, plan.family.quant, args.work_dir, gguf is not None and plan.layout == SAME,
                               args.device, True)
    _progress(f"{plan.family.name}: Sluice's model {model_dir}")


def _reference_config() -> dict:
    from engine.tools.presets import preset_config
    return preset_config(REFERENCE_PRESET)


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {"families": {}}


# ---- one family ------------------------------------------------------------------------------------------------

def family_regimes(plan: Planned, names: list[str], reference_bytes: int) -> list[Regime]:
    return [scaled_regime(REGIMES[n], plan.model_bytes, reference_bytes) for n in names]


def why_no_peer(plan: Planned, args) -> str | None:
    if args.llama_bench is None:
        return "no --llama-bench"
    if plan.family.no_gguf:
        return f"llama.cpp cannot take it: {plan.family.no_gguf}"
    if plan.peer_left_out:
        return (f"its HF checkpoint and GGUF beside Sluice's files (~{plan.files.peak(SEPARATE) / 1e9:.0f} GB at "
                f"once) would not fit the disk")
    return None


def run_family(plan: Planned, args, reference_bytes: int, matrix: dict) -> int:
    """Every regime of one family into `matrix` (saved after each); the number of cells that failed."""
    name = plan.family.name
    record = matrix["families"].setdefault(name, {"regimes": {}})
    record.update(preset=plan.preset, layers=plan.num_layers, full_layers=plan.family.full_layers,
                  layers_note=plan.layers_note(), layout=plan.layout, layout_note=plan.layout_note(),
                  files=asdict(plan.files))
    _progress(f"=== {name}: preset {plan.preset}, {plan.layers_note()}")
    if not plan.fits:
        record["regimes"].update({r: {"sluice": {"error": _over_disk(plan)}} for r in args.regime})
        save_json(args.out, "matrix", matrix)
        return len(args.regime)
    gguf, no_peer = _gguf(plan, args)
    record["peer"] = no_peer or str(gguf)
    failed = 0
    for reg in family_regimes(plan, args.regime, reference_bytes):
        _progress(describe(reg, capped=not args.no_cgroup and reg.memory_cap_bytes is not None))
        cell = run_cell(plan, reg, gguf, no_peer, args)
        record["regimes"][reg.name] = cell
        save_json(args.out, "matrix", matrix)
        failed += "error" in cell["sluice"]
        print(f"--- {name} {reg.name}", flush=True)
        print("\n".join(cell_lines(cell)), flush=True)
    return failed


def _gguf(plan: Planned, args) -> tuple[Path | None, str | None]:
    """(the family's GGUF, None), or (None, why the peer does not run)."""
    why = why_no_peer(plan, args)
    if why:
        return None, why
    try:
        gguf = llamacpp.convert_preset(plan.preset, args.work_dir, args.llama_src, args.device, _progress)
    except SluiceError as exc:
        return None, f"conversion failed: {exc}"
    if plan.layout == SEPARATE:                 # room for Sluice's model, written directly
        shutil.rmtree(hf_checkpoint_dir(args.work_dir, plan.preset), ignore_errors=True)
    return gguf, None


def sluice_flags(plan: Planned, regime_name: str, args) -> list[str]:
    return ["--preset", plan.preset, "--quant", plan.family.quant, "--dense-quant", "int8", "--prompt-tokens",
            str(PROMPT_TOKENS), "--new-tokens", str(max(NEW_TOKENS[regime_name], plan.family.min_new_tokens)),
            "--device", args.device,
            *args.bench_args]


def run_cell(plan: Planned, reg: Regime, gguf: Path | None, no_peer: str | None, args) -> dict:
    """Sluice and the peer in one regime, in the order the module's docstring gives."""
    from bench.stages.regime import parse_bench_args, sluice_in_regime
    flags, peer = sluice_flags(plan, reg.name, args), None
    n_prompt = parse_bench_args(flags).prompt_tokens          # the peer's pp: Sluice's prompt, as the user set it
    if gguf and reg.name == "fits-vram-ram":
        peer = peer_sweep(plan, reg, gguf, parse_size(reg.vram_budget), n_prompt, args)
        flags += ["--vram-budget", sluice_vram_at(peer["best"], reg.vram_budget)]
    try:
        sluice = sluice_in_regime(reg, flags, args, via_repack=gguf is not None and plan.layout == SAME)
    except SluiceError as exc:                     # one cell failing leaves the others to run
        return {"sluice": {"error": str(exc)}, "peer": peer or {"not_run": no_peer or "Sluice failed"}}
    sluice["origin"] = origin_projection(sluice)  # a model the project's origin ran: its speed there, computed
    if gguf and peer is None:
        limit = max(sluice["vram_budget_bytes"], sluice.get("vram_driver_bytes") or 0)
        peer = peer_sweep(plan, reg, gguf, limit, n_prompt, args)
    if peer:
        peer["ratio"] = ratios(sluice, peer)
    return {"sluice": sluice, "peer": peer or {"not_run": no_peer}}


def peer_sweep(plan: Planned, reg: Regime, gguf: Path, vram_limit_bytes: int, n_prompt: int, args) -> dict:
    log_dir = args.out / "llama-bench" / plan.family.name
    log_dir.mkdir(parents=True, exist_ok=True)
    peer = sweep(args.llama_bench, gguf, reg, _points(plan, reg, vram_limit_bytes, args),
                 vram_budget=str(vram_limit_bytes), log=_progress, n_prompt=n_prompt, threads=args.llama_threads,
                 timeout_s=args.llama_timeout, use_cgroup=not args.no_cgroup, drop_cache=not args.keep_page_cache,
                 log_dir=log_dir)
    peer["gguf"] = str(gguf)
    return peer


def _points(plan: Planned, reg: Regime, vram_limit_bytes: int, args) -> tuple[int, ...]:
    if args.llama_ncmoe:
        return tuple(args.llama_ncmoe)
    return ncmoe_points(plan.files, plan.num_layers, plan.num_moe_layers, vram_limit_bytes, reg.name == "exceeds")


def cell_lines(cell: dict) -> list[str]:
    """A cell as the regime stage prints it: the bench's report (its placement and wait lines), then the peer's."""
    from bench.stages.regime import regime_lines
    from engine.tools.bench import report
    s, peer = cell["sluice"], cell["peer"]
    if "error" in s:
        return [f"Sluice failed: {s['error']}"]
    lines = [*regime_lines(s), report(s), *origin_lines(s)]
    if "not_run" in peer:
        return lines + [f"llama.cpp    not run: {peer['not_run']}"]
    return lines + peer_lines({**s, "llama_cpp": peer})


def _over_disk(plan: Planned) -> str:
    return (f"its files (~{plan.files.peak(plan.layout) / 1e9:.0f} GB) would not fit --disk-limit "
            f"{plan.disk_limit_bytes / 1e9:.0f} GB less {RESERVED_DISK_BYTES / 1e9:.0f} GB for the system")


def _family_paths(plan: Planned, work: Path) -> list[Path]:
    from engine.tools.bench import _model_paths
    repacked, hf = _model_paths(plan.preset, plan.family.quant, work, via_repack=True)
    direct, _ = _model_paths(plan.preset, plan.family.quant, work, via_repack=False)
    return [hf, repacked, direct, llamacpp.gguf_path(work, plan.preset)]


def _remove_files(plan: Planned, work: Path) -> None:
    for path in _family_paths(plan, work):
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- the dry run -----------------------------------------------------------------------------------------------

def dry_run_lines(plans: list[Planned], args, reference_bytes: int) -> list[str]:
    """Every command the matrix would run, the files' estimated sizes against the disk, llama-bench's worst case."""
    limit = plans[0].disk_limit_bytes if plans else parse_size(args.disk_limit)
    peer = f"llama-bench {args.llama_bench}" if args.llama_bench else "no --llama-bench: the peer's columns say \"not run\""
    lines = [f"matrix: {len(plans)} families x {len(args.regime)} regimes; {peer}; disk {limit / 1e9:.0f} GB "
             f"({RESERVED_DISK_BYTES / 1e9:.0f} GB kept for the system); {PEER_VRAM} = the driver-view VRAM of "
             f"llama.cpp's fastest -ncmoe within the regime's budget"]
    worst_s, disk_sum = 0.0, 0
    for plan in plans:
        lines += _family_lines(plan, args)
        disk_sum += plan.files.peak(plan.layout)
        for reg in family_regimes(plan, args.regime, reference_bytes):
            regime_lines, seconds = _regime_lines(plan, reg, args)
            lines += regime_lines
            worst_s += seconds
    lines += ["", f"files of all {len(plans)} families together: ~{disk_sum / 1e9:.0f} GB"
              + (" (more than the disk: pass --clean, or run a few families a call)" if disk_sum > limit and not args.clean
                 else ""),
              f"llama-bench at most {worst_s / 60:.0f} min (every run to its timeout); each Sluice run builds its model "
              "once, then a load, a prefill and the decode"]
    return lines


def _family_lines(plan: Planned, args) -> list[str]:
    """A family's heading in the dry run: its preset and layers, its files against the disk, its GGUF conversion."""
    f, no_peer = plan.files, why_no_peer(plan, args)
    sluice_gb = f"Sluice {plan.family.quant} {f.sluice_bytes / 1e9:.1f} GB"
    files = {SAME: f"HF checkpoint {f.hf_bytes / 1e9:.1f} GB + {sluice_gb} + GGUF {f.gguf_bytes / 1e9:.1f} GB",
             SEPARATE: f"HF checkpoint {f.hf_bytes / 1e9:.1f} GB + GGUF {f.gguf_bytes / 1e9:.1f} GB, then the "
                       f"checkpoint deleted and {sluice_gb} written directly"}.get(plan.layout,
                                                                                 f"{sluice_gb}, written directly")
    over = "" if plan.fits else f"  OVER THE DISK LIMIT ({_over_disk(plan)})"
    lines = ["", f"== {plan.family.name}: preset {plan.preset}, {plan.layers_note()}",
             f"   files ~{f.peak(plan.layout) / 1e9:.1f} GB at most ({files}){over}"]
    if plan.layout_note():
        lines.append(f"   {plan.layout_note()}")
    if no_peer:
        lines.append(f"   llama.cpp: not run ({no_peer})")
    else:
        hf = hf_checkpoint_dir(args.work_dir, plan.preset)
        lines.append("   " + shlex.join(["python", "-m", "bench.gguf_convert", str(args.llama_src), str(hf),
                                         str(llamacpp.gguf_path(args.work_dir, plan.preset)), "--outtype", "q8_0"])
                     + "   # after writing the HF checkpoint")
    return lines


def _regime_lines(plan: Planned, reg, args) -> tuple[list[str], float]:
    """One regime's commands in the order the matrix runs them, and llama-bench's worst case in seconds."""
    from bench.stages.regime import parse_bench_args, regime_flags
    with_gguf = why_no_peer(plan, args) is None
    capped = not args.no_cgroup and reg.memory_cap_bytes is not None
    lines = [f"   -- {reg.name}: VRAM budget {format_size(parse_size(reg.vram_budget))}, "
             + (f"cap {format_size(reg.memory_cap_bytes)}" if reg.memory_cap_bytes else "RAM free")
             + (" (cgroup v2 memory.max, page cache dropped before each run)" if capped else "")]
    flags = sluice_flags(plan, reg.name, args)
    peer_first = with_gguf and reg.name == "fits-vram-ram"
    if peer_first:
        flags += ["--vram-budget", PEER_VRAM]
    repack = with_gguf and plan.layout == SAME
    sluice = ["sluice", "bench", *regime_flags(parse_bench_args(flags), reg, flags, repack, capped),
              "--json", "--work-dir", str(args.work_dir)]
    runs, worst_s = [], 0.0
    if with_gguf:
        limit_bytes = parse_size(reg.vram_budget)
        points = _points(plan, reg, limit_bytes, args)
        s = {**llamacpp.RUN_SETTINGS["default"], **llamacpp.RUN_SETTINGS.get(reg.name, {})}
        worst_s = (args.llama_timeout or s["timeout_s"]) * len(points)
        runs = ["   " + shlex.join(llamacpp.llama_bench_argv(args.llama_bench, llamacpp.gguf_path(
            args.work_dir, plan.preset), n, args.llama_threads, parse_bench_args(flags).prompt_tokens,
            s["n_gen"], s["reps"]))
            for n in points]
        within = f"{format_size(limit_bytes)}" if peer_first else "Sluice's driver-view VRAM"
        runs.append(f"   # -ncmoe {', '.join(map(str, points))}: the fastest within {within} "
                    f"(points predicted for {format_size(limit_bytes)})")
    return lines + [*(runs if peer_first else []), "   " + shlex.join(sluice), *([] if peer_first else runs)], worst_s
