"""llama.cpp as the bench's peer (DESIGN.md, "Benchmark protocol"): build `llama-bench` with CUDA, convert
the bench's HF checkpoint of a preset to a Q8_0 GGUF, and run `llama-bench -ngl 99 -ncmoe N` (the experts
of the first N layers stay in RAM and are computed on the CPU) in the same memory regime as Sluice: each
run in a fresh cgroup v2 cap with the page cache dropped first, the VRAM the driver shows for it polled.
How the issue's figures were measured: ../shared/peer/LLAMACPP.md.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from engine.errors import SluiceError

REPO_ROOT = Path(__file__).resolve().parents[1]
CMAKE_FLAGS = ("-DCMAKE_CUDA_ARCHITECTURES=90", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF", "-DCMAKE_BUILD_TYPE=Release")
# llama-bench's settings per regime: where it decodes at < 0.3 tok/s (exceeds) fewer tokens, one repetition
RUN_SETTINGS = {"default": dict(n_gen=64, reps=2, timeout_s=240), "exceeds": dict(n_gen=16, reps=1, timeout_s=120)}


def default_src() -> Path:
    """The trimmed source tree bench/fetch_llamacpp.sh leaves in the repo's ignored peer/ folder."""
    return REPO_ROOT / "peer" / "llama.cpp"


def bench_binary(build_dir: Path) -> Path:
    return Path(build_dir) / "bin" / "llama-bench"


def build_script(src: Path, build_dir: Path, jobs: int, cuda: bool = True) -> str:
    flags = ("-DGGML_CUDA=ON" if cuda else "-DGGML_CUDA=OFF",) + CMAKE_FLAGS
    return (f"cmake -S {shlex.quote(str(src))} -B {shlex.quote(str(build_dir))} {' '.join(flags)} && "
            f"cmake --build {shlex.quote(str(build_dir))} --target llama-bench -j{jobs}")


def start_build(src: Path, build_dir: Path, jobs: int, log_path: Path, cuda: bool = True) -> subprocess.Popen | None:
    """Configure and build llama-bench in the background (its output to `log_path`); None when built already."""
    if bench_binary(build_dir).is_file():
        return None
    if not (Path(src) / "CMakeLists.txt").is_file():
        raise SluiceError(f"No llama.cpp source tree in {src}: run bench/fetch_llamacpp.sh first.")
    log = open(log_path, "w")
    return subprocess.Popen(["sh", "-c", build_script(src, build_dir, jobs, cuda)], stdout=log, stderr=subprocess.STDOUT)


def gguf_path(work: Path, preset: str, outtype: str = "q8_0") -> Path:
    return Path(work) / f"{preset}-{outtype}.gguf"


def convert_preset(preset: str, work: Path, src: Path, device: str, log=print, outtype: str = "q8_0") -> Path:
    """The GGUF of the HF checkpoint the bench builds for `preset` (`sluice bench --via-repack` runs the same
    one), written once and kept in `work`."""
    from engine.tools.presets import hf_checkpoint_dir, write_hf_checkpoint
    out = gguf_path(work, preset, outtype)
    if out.is_file():
        return out
    hf_dir = write_hf_checkpoint(preset, hf_checkpoint_dir(work, preset), device=device, progress=log)
    partial = out.with_name(out.name + ".partial")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "bench.gguf_convert", str(src), str(hf_dir), str(partial),
                           "--outtype", outtype], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))})
    if proc.returncode != 0:
        raise SluiceError(f"llama.cpp's converter failed on {hf_dir} (exit {proc.returncode}): "
                          f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'no message'}")
    partial.rename(out)
    log(f"{out.name}: {out.stat().st_size / 2**30:.2f} GiB, converted in {time.perf_counter() - start:.0f} s")
    return out


def llama_bench_argv(binary: Path, gguf: Path, ncmoe: int, threads: int, n_prompt: int, n_gen: int, reps: int) -> list[str]:
    """jsonl: one line per finished test, flushed, so a run stopped at its timeout still gives its prefill.
    `-lzm on`: a tensor llama.cpp can read by row (Qwen3.8-Flash-Next's n-gram table; no other family's) is read from
    disk as Sluice reads it, as llama.cpp does by itself for the real model's 54 GB table (its auto mode: above 4 GiB;
    a preset's 1/20 of the rows stays under that)."""
    return [str(binary), "-m", str(gguf), "-ngl", "99", "-ncmoe", str(ncmoe), "-lzm", "on", "-t", str(threads),
            "-p", str(n_prompt), "-n", str(n_gen), "-r", str(reps), "-o", "jsonl"]


def parse_llama_bench(text: str) -> list[dict]:
    """The test objects in llama-bench's `-o json` (an array) or `-o jsonl` output; an unfinished tail is
    dropped."""
    text = text.strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            text = text[1:].replace("\n  },\n", "\n  }\n")       # a run stopped mid-array: read it object by object
    rows, decoder, pos = [], json.JSONDecoder(), 0
    while (start := text.find("{", pos)) >= 0:
        try:
            row, pos = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            break
        rows.append(row)
    return rows


def summarize(rows: list[dict]) -> dict:
    """Prefill (pp) and decode (tg) tok/s of one llama-bench run, with the settings it reports."""
    pp = next((r for r in rows if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0), None)
    tg = next((r for r in rows if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0), None)
    first = pp or tg or {}
    return {"prefill_tok_s": pp["avg_ts"] if pp else None, "prefill_tokens": pp["n_prompt"] if pp else None,
            "decode_tok_s": tg["avg_ts"] if tg else None, "decode_stddev_tok_s": tg["stddev_ts"] if tg else None,
            "n_cpu_moe": first.get("n_cpu_moe"), "model_size_bytes": first.get("model_size"),
            "gpu_info": first.get("gpu_info"), "build_commit": first.get("build_commit")}


def parse_compute_apps(text: str, pid: int) -> tuple[int | None, int]:
    """(bytes of process `pid`, bytes of all processes) from `nvidia-smi --query-compute-apps=pid,used_memory
    --format=csv,noheader,nounits` (MiB)."""
    mine, total = None, 0
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 2 or not fields[0].isdigit() or not fields[1].isdigit():
            continue                                                  # "[N/A]", a header, an empty line
        used = int(fields[1]) << 20
        total += used
        if int(fields[0]) == pid:
            mine = used
    return mine, total


class VramPoller:
    """The peak VRAM the driver shows for one process (and for all processes), polled with nvidia-smi."""

    def __init__(self, pid: int, interval_s: float = 0.25):
        self.pid, self.interval_s = pid, interval_s
        self.peak_process_bytes: int | None = None
        self.peak_all_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            try:
                out = subprocess.run(query, capture_output=True, text=True, timeout=5).stdout
            except (OSError, subprocess.TimeoutExpired):
                return                                                # no nvidia-smi: nothing to report
            mine, total = parse_compute_apps(out, self.pid)
            if mine is not None:
                self.peak_process_bytes = max(self.peak_process_bytes or 0, mine)
            self.peak_all_bytes = max(self.peak_all_bytes, total)
            self._stop.wait(self.interval_s)
