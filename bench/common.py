"""What the stages share: results written under --out, the bench's models under --work-dir, and `sluice bench`
run as a child process (optionally inside a memory cap, or from another checkout)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from engine.errors import SluiceError

ROOT = Path(__file__).resolve().parents[1]


def save_json(out: Path, name: str, data) -> Path:
    path = out / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, default=str))
    return path


def append_log(out: Path, name: str, text: str) -> None:
    """One log file per kind of output: a device call brings back only a few files."""
    with open(out / name, "a") as log:
        log.write(text)


# the child installs this process's config of its preset first: one a test added, and in an A/B against an older
# tree, the same model in both
_CHILD = ("import json, sys; from engine.tools.presets import PRESETS; PRESETS.update(json.loads(sys.argv[1])); "
          "from engine.tools.cli import main; sys.exit(main(sys.argv[2:]))")


def bench_argv(bench_args: list[str], work: Path) -> list[str]:
    from engine.tools.presets import PRESETS
    name = bench_args[bench_args.index("--preset") + 1] if "--preset" in bench_args[:-1] else None
    preset = {name: PRESETS[name]} if name in PRESETS else {}
    return [sys.executable, "-c", _CHILD, json.dumps(preset), "bench", *bench_args, "--json", "--work-dir", str(work)]


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of a child run from `tree`: its engine first on the path (wheels in /tmp/site kept)."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), *paths])}


def run_sluice_bench(bench_args: list[str], work: Path, out: Path, *, cap=None, tree: Path = ROOT) -> dict:
    """`sluice bench ... --json` in a child process (inside `cap`, a MemoryCap, when given): its JSON result.
    Its progress lines go to out/bench.log; a failed run raises with the tail of what it printed."""
    argv = bench_argv(bench_args, work)
    proc = subprocess.run(cap.command(argv) if cap else argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, cwd=tree, env=tree_env(tree))
    append_log(out, "bench.log", f"===== sluice bench {' '.join(bench_args)}\n{proc.stderr[-20000:]}\n")
    if proc.returncode != 0:
        killed = " (killed: most likely the memory cap's out-of-memory killer)" if proc.returncode in (-9, 137) else ""
        raise SluiceError(f"sluice bench {' '.join(bench_args)} failed with exit {proc.returncode}{killed}: "
                          f"{proc.stderr.strip()[-1500:]}")
    return json.loads(proc.stdout)


def summary_line(r: dict) -> str:
    """One line a run, to compare runs at a glance: decode, its waits, memory, copies and hits."""
    per_token = r["decode_bytes_per_token"]
    return (f"decode {r['decode_tok_s']:.2f} tok/s ({r['decode_s_per_token'] * 1e3:.2f} ms, efficiency "
            f"{r['decode_efficiency']:.2f})"
            + (f", steady {st['tok_s']:.2f} tok/s (efficiency {st['efficiency']:.2f})" if (st := r.get("steady_decode")) else "")
            + f" | waited {r.get('decode_sync_wait_s_per_token', 0) * 1e3:.2f} ms, reads "
            f"{r.get('decode_read_wait_s_per_token', 0) * 1e3:.2f} ms | warm prefill "
            f"{r.get('warm_prefill_tok_s', 0):.0f} tok/s | {r['process_non_cache_anon_bytes'] / 2**20:.0f} MiB "
            f"anonymous | {r.get('decode_major_faults_per_token', 0):.1f} pages a token | h2d "
            f"{per_token['h2d'] / 1e9:.3f} GB, disk {per_token['disk'] / 1e9:.3f} GB a token | VRAM hits "
            f"{r['decode_hit_rate']['vram']:.1%}"
            f" | CPU {r['decode_cpu_per_token']['experts']:.1f} experts a token"
            f"{_placement_note(r.get('placement'))}"
            + (f" | copies paced to {r['copy_pacing']['rate_gbps']:g} GB/s" if r.get("copy_pacing") else ""))


def _placement_note(p: dict | None) -> str:
    """What the placement measured at load: an expert on the CPU against a block copy (paced, where simulated)."""
    if not p:
        return ""
    trial = p.get("trial")
    timed = (f"; timed {trial['with_share_s'] * 1e3:.2f} ms a token with it, {trial['without_s'] * 1e3:.2f} without: "
             f"{'kept' if trial['on'] else 'off'}" if trial else "")
    return (f" ({p['mode']}, share {'on' if p['active'] else 'off'}: an expert {p['cpu_expert_s'] * 1e6:.0f} us on "
            f"the CPU at load, a copy {p['copy_s'] * 1e6:.0f} us{timed})")


def bench_model(work: Path, preset: str = "olmoe-1b-7b", quant: str = "int8") -> Path:
    """The bench's model of `preset` in `work`, written on the GPU the first time (kept afterwards)."""
    from engine.tools.presets import write_sluice_dir
    return write_sluice_dir(preset, work / f"{preset}-{quant}", quant)


def sampled(max_new_tokens: int):
    """The bench's decode: temperature 1 over a random model's flat logits routes like real text."""
    from engine import GenerationParams
    return GenerationParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=0, ignore_eos=True)
