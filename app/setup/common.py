"""Qt-free helpers shared by the setup wizard pages: where things go, the machine, human numbers."""
from __future__ import annotations

import re
import threading
from pathlib import Path

DOWNLOADS_SUBDIR = ".downloads"      # raw hub snapshots, hidden from the model picker
DISK_TEST_BYTES = 128 * 2**20        # the O_DIRECT self-test size: ~0.2 s on an NVMe drive
VERDICT_COLORS = {"fits fast": "#1a7f37", "fits but slow": "#9a6700", "will not run": "#cf222e",
                  "unavailable": "#6e7781"}

_machine_lock = threading.Lock()
_machines: dict[str, object] = {}


def snapshot_dir(models_dir: Path, repo_id: str) -> Path:
    return Path(models_dir) / DOWNLOADS_SUBDIR / repo_id.replace("/", "--")


def unfinished_downloads(models_dir: Path) -> list[tuple[str, str, int]]:
    """(repo_id, revision, bytes on disk) of downloads that were stopped before the end, newest first."""
    import json
    from engine.setup import STATE_DIR
    found = []
    for manifest_path in (Path(models_dir) / DOWNLOADS_SUBDIR).glob(f"*/{STATE_DIR}/manifest.json"):
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError):
            continue
        if not manifest.get("parts"):
            continue
        snapshot = manifest_path.parent.parent
        on_disk = sum(p.stat().st_size for p in snapshot.rglob("*") if p.is_file() and p.name != "manifest.json")
        found.append((manifest_path.stat().st_mtime, manifest["repo_id"], manifest["revision"], on_disk))
    return [(repo_id, revision, size) for _, repo_id, revision, size in sorted(found, reverse=True)]


def model_dir_name(source_name: str, quant: str) -> str:
    base = source_name.split("--")[-1] if "--" in source_name else source_name
    safe = re.sub(r"[^\w.]+", "-", base).strip("-")
    return f"{safe}-{quant}"


def machine_for(models_dir: Path, device: str | None = None):
    """engine.plan.estimate.Machine for this computer, its disk measured on the models folder (once per run);
    device None = the GPU if there is one."""
    from engine.setup import Machine
    from engine.setup import probe
    from engine.setup import free_disk_bytes
    models_dir = Path(models_dir)
    key = str(models_dir.resolve())
    with _machine_lock:
        if key not in _machines:
            hw = probe(models_dir, disk_test_bytes=DISK_TEST_BYTES)
            _machines[key] = hw
        hw = _machines[key]
    if device == "cuda" and not hw.has_gpu:
        device = "cpu"
    return Machine.from_hardware(hw, free_disk_bytes(models_dir), device), hw


def engine_options(parent) -> dict:
    """device / vram_budget / ram_cache / dense_quant as the app will load the model: from the main window's
    settings when the wizard has one as parent (the estimate then matches what the engine will do)."""
    from engine import SluiceError
    from engine import parse_size
    settings = getattr(parent, "settings", None)
    options = {"device": None, "vram_budget": None, "ram_cache": None, "dense_quant": None}
    if settings is None:
        return options
    options["dense_quant"] = "int8" if getattr(settings, "dense_weights", "stored") == "int8" else None
    device = getattr(settings, "device", "auto")
    options["device"] = device if device in ("cpu", "cuda") else None
    for key in ("vram_budget", "ram_cache"):
        try:
            options[key] = parse_size(getattr(settings, key, "") or None)
        except SluiceError:
            pass                      # the main window reports a bad size when it loads the model
    return options


def describe_machine(hw) -> str:
    from engine import format_size
    gpu = (f"{hw.gpus[0].name} with {format_size(hw.gpus[0].vram_total_bytes)}" if hw.gpus else "no GPU")
    disk = f"disk reads {format_rate(hw.disk_read_bps)}" if hw.disk_read_bps else "disk speed unknown"
    return f"This computer: {format_size(hw.ram_total_bytes)} RAM, {gpu}, {disk} (measured)."


def format_rate(bps: float) -> str:
    from engine import format_size
    return f"{format_size(bps)}/s"


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "estimating time left"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s left"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s left"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min left"


def format_speed(tok_s: float) -> str:
    return f"{tok_s:.1f} tok/s" if tok_s >= 1 else f"{tok_s:.2f} tok/s"
