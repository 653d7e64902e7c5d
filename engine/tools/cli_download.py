"""`sluice download REPO_ID [--revision R] [--dir D]`: fetch a hub model headless, with a progress bar.

engine.tools.cli parses the options (args.repo_id, args.revision, args.dst_dir) and calls `run(args)`.
Rerunning the same command after an interruption (Ctrl-C, a crash, a lost network) fetches only
the missing bytes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.errors import SluiceError
from engine.tools.user_models import user_models_dir


def default_download_dir(repo_id: str) -> Path:
    """Beside the installed models, hidden so the model picker does not list raw snapshots."""
    return user_models_dir() / ".downloads" / repo_id.replace("/", "--")


def run(args: argparse.Namespace) -> int:
    """Returns 0, or 130 after Ctrl-C; raises SluiceError (engine.tools.cli prints it, exit code 2)."""
    from tqdm import tqdm

    from engine.hub.search import parse_repo_ref, repo_info
    from engine.hub.download import download
    from engine.sizes import format_size

    try:
        repo_id, revision = parse_repo_ref(args.repo_id)
        info = repo_info(repo_id, args.revision or revision)
        if not info.is_supported:
            raise SluiceError(f"{repo_id} is a '{info.family}' model, which Sluice cannot run "
                              f"(it runs {', '.join(_families())}); nothing was downloaded.")
        dst = Path(args.dst_dir) if args.dst_dir else default_download_dir(repo_id)
        files = info.model_files()
        total = sum(f.size for f in files)
        print(f"{repo_id} @ {info.revision[:12]}: {info.family}, {len(files)} files, "
              f"{format_size(total)} -> {dst}", file=sys.stderr)
        for line in _estimate_lines(info, total, dst):
            print(line, file=sys.stderr)
        with tqdm(total=sum(f.size for f in files), unit="B", unit_scale=True, unit_divisor=1024,
                  file=sys.stderr, desc="download", dynamic_ncols=True) as bar:
            def on_progress(p):
                bar.update(p.bytes_done - bar.n)
                if p.current_file:
                    bar.set_postfix_str(p.current_file, refresh=False)
            download(info, dst, files=files, progress=on_progress)
    except KeyboardInterrupt:
        print("Stopped. Run the same command again to continue where it stopped.", file=sys.stderr)
        return 130
    print(dst)
    return 0


def _estimate_lines(info, download_bytes: int, dst: Path) -> list[str]:
    """What the wizard shows before downloading: parameters, and per quant size and predicted speed here."""
    from engine.plan.estimate import QUANTS, Machine, estimate, format_params, model_shape
    from engine.plan.hardware import probe
    from engine.hub.download import free_disk_bytes
    from engine.sizes import format_size
    shape = model_shape(info.config)
    hw = probe(dst.parent if not dst.exists() else dst, disk_test_bytes=64 << 20)
    machine = Machine.from_hardware(hw, free_disk_bytes(dst))
    lines = [f"{format_params(shape.total_params)} parameters, {format_params(shape.active_params)} active per token; "
             f"predicted on this machine ({machine.device}, disk {format_size(hw.disk_read_bps)}/s):"]
    for quant in QUANTS:
        est = estimate(info.config, download_bytes, machine, quant)
        if est.verdict == "unavailable":
            lines.append(f"  {quant:>5}: unavailable: {est.reason}")
            continue
        lines.append(f"  {quant:>5}: {format_size(est.repacked_bytes)} repacked, "
                     f"{format_size(est.bytes_per_token)} moved per token, {est.tok_s:.1f} tok/s: {est.verdict}")
    return lines


def _families() -> tuple[str, ...]:
    from engine.hub.search import supported_families
    return supported_families()


