"""Predicted vs measured decode speed on a GPU machine (issue 4: 'the speed estimate checked against reality').

    python3 tests/setup/check_estimate_gpu.py WORK_DIR        (needs CUDA; builds the bench presets in WORK_DIR)

For each scenario: `sluice bench` measures decode tok/s under budgets that force streaming; the
estimate predicts it from the preset's config.json alone plus this machine's probed bandwidths
(engine.plan.hardware.probe: O_DIRECT disk on WORK_DIR, pinned H2D, device copy), with (a) the default
uniform-routing hit rates and (b) the hit rates the bench measured. Prints one JSON line per scenario.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# preset, quant, VRAM budget, RAM cache: model size / (VRAM + RAM) >= ~3, so experts really stream
SCENARIOS = [("olmoe-1b-7b", "fp8", "2GB", "1GB"), ("olmoe-1b-7b", "nvfp4", "2GB", "1GB"),
             ("qwen3-30b-a3b", "fp8", "6GB", "4GB")]


def main(work: Path) -> None:
    from engine.plan.estimate import Machine, estimate
    from engine.tools.presets import preset_config
    from engine.plan.hardware import probe
    from engine.hub.download import free_disk_bytes
    from engine.sizes import parse_size

    work.mkdir(parents=True, exist_ok=True)
    hw = probe(work, disk_test_bytes=1 << 30)
    machine = Machine.from_hardware(hw, free_disk_bytes(work), "cuda")
    print(json.dumps({"probe": {"gpu": hw.gpus[0].name, "disk_gbps": hw.disk_read_bps / 1e9,
                                "pcie_gbps": hw.pcie_bps / 1e9, "gpu_mem_gbps": hw.gpu_mem_bw_bps / 1e9,
                                "ram_gib": hw.ram_total_bytes / 2**30}}), flush=True)
    for preset, quant, vram, ram in SCENARIOS:
        cmd = [sys.executable, "-m", "engine.tools.cli", "bench", "--preset", preset, "--quant", quant, "--vram-budget", vram,
               "--ram-cache", ram, "--prompt-tokens", "128", "--new-tokens", "48", "--json", "--work-dir", str(work)]
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
        if run.returncode != 0:
            print(json.dumps({"scenario": [preset, quant, vram, ram], "bench_failed": run.stderr[-2000:]}), flush=True)
            continue
        r = json.loads(run.stdout)
        config = preset_config(preset)
        kw = dict(vram_budget=parse_size(vram), ram_cache=parse_size(ram))
        uniform = estimate(config, 0, machine, quant, **kw)
        hits = (r["decode_hit_rate"]["vram"], r["decode_hit_rate"]["ram"])
        measured_hits = estimate(config, 0, machine, quant, hit_rates=hits, **kw)
        measured = r["decode_tok_s"]
        print(json.dumps({
            "scenario": [preset, quant, vram, ram], "measured_tok_s": measured,
            "predicted_tok_s": uniform.tok_s, "predicted_over_measured": uniform.tok_s / measured,
            "predicted_with_measured_hits_tok_s": measured_hits.tok_s,
            "hits_predicted": [uniform.slot_hit, uniform.ram_hit], "hits_measured": hits,
            "bytes_per_token_predicted": {"disk": uniform.disk_bytes_per_token, "h2d": uniform.h2d_bytes_per_token},
            "bytes_per_token_measured": r["decode_bytes_per_token"], "bench_bandwidth_gbps": r["bandwidth_gbps"],
            "bench_roofline_tok_s": 1 / r["decode_roofline_s_per_token"], "slots_per_bank": r["slots_per_bank"],
            "block_bytes_predicted": uniform.block_bytes}), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/sluice-bench"))
