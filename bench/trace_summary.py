"""Where a decode token's time goes, from a torch.profiler Chrome trace (`python -m bench profile --mode trace`).

Prints, over the decode tokens of the trace (after the first host sync that follows the prompt):
  - each GPU stream's busy time a token (kernels, copies by direction) and the copy stream's idle gaps;
  - the host's CUDA runtime calls by total time (a layer's host sync shows as the stream synchronize
    behind its `tolist`), and the syncs' waits;
  - one token's layers as a timeline: when the decode thread's sync returned, when it issued the layer's
    copies and graph launches, and when the copy engine ran them.
Usage: python -m bench.trace_summary TRACE.json[.gz] [tokens shown, default 1] [host syncs a token, default 17]
"""
from __future__ import annotations

import gzip
import json
import sys
from collections import defaultdict

BIG_COPY = 1 << 20          # bytes: an expert block (smaller copies are index rows, the token, logits)


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


class Decode:
    """The decode part of a trace: the GPU's and the decode thread's events from the first decode sync on."""

    def __init__(self, events: list[dict], syncs_per_token: int = 17):
        self.gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        self.calls = _decode_thread([e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")])
        syncs = sorted((e for e in self.calls if "Synchronize" in e["name"]), key=lambda e: e["ts"])
        self.start = syncs[len(syncs) * 15 // 100]["ts"]      # the decode: the last 85% of the syncs, not the prompt
        self.window = max(e["ts"] + e["dur"] for e in self.gpu) - self.start
        self.syncs = [e for e in syncs if e["ts"] >= self.start]
        self.tokens = max(1, round(len(self.syncs) / syncs_per_token))   # MoE layers' syncs + the token's own

    def header(self) -> str:
        launches = sum(1 for e in self.calls if e["name"] == "cudaGraphLaunch" and e["ts"] >= self.start)
        return (f"decode window {self.window / 1e3:.1f} ms, ~{self.tokens} tokens ({len(self.syncs)} host syncs, "
                f"{launches} graph launches): {self.window / self.tokens / 1e3:.2f} ms a token")


def _decode_thread(runtime: list[dict]) -> list[dict]:
    """The CUDA calls of the thread that syncs most: the decode thread."""
    sync_tids = [e["tid"] for e in runtime if "Synchronize" in e["name"]]
    if not sync_tids:
        sys.exit("no host syncs in the trace")
    main_tid = max(set(sync_tids), key=sync_tids.count)
    return [e for e in runtime if e["tid"] == main_tid]


def _kind(e: dict) -> str:
    """A kernel, a memset, or a copy by direction ("Memcpy HtoD (...)" -> "HtoD")."""
    if e["cat"] != "gpu_memcpy":
        return e["cat"]
    return e["name"].split()[1] if " " in e["name"] else e["name"]


def stream_lines(d: Decode) -> list[str]:
    """Each GPU stream's busy time a token by kind (kernels, copies by direction)."""
    by_stream = defaultdict(lambda: defaultdict(float))
    for e in d.gpu:
        if e["ts"] >= d.start:
            by_stream[e.get("args", {}).get("stream", e["tid"])][_kind(e)] += e["dur"]
    return ["GPU streams, us a token:"] + [
        f"  stream {stream}: " + ", ".join(f"{k} {v / d.tokens:.0f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
        for stream, kinds in sorted(by_stream.items(), key=lambda kv: -sum(kv[1].values()))]


def copy_lines(d: Decode) -> list[str]:
    """The expert copies: how many a token, their rate, how busy the copy engine was and its gaps."""
    copies = sorted((e for e in d.gpu if e["ts"] >= d.start and e["cat"] == "gpu_memcpy"
                     and e.get("args", {}).get("bytes", 0) >= BIG_COPY), key=lambda e: e["ts"])
    if not copies:
        return []
    busy = sum(e["dur"] for e in copies)
    gaps = [g for g in (b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(copies, copies[1:])) if g > 5]
    mb = sum(e["args"]["bytes"] for e in copies) / len(copies) / 1e6
    return [f"expert copies: {len(copies) / d.tokens:.1f} a token of {mb:.2f} MB, {busy / len(copies):.0f} us each "
            f"({mb * 1e6 / (busy / len(copies)) / 1e3:.1f} GB/s); the copy engine busy {busy / d.window:.0%} of the "
            f"decode; gaps between copies: {len(gaps) / d.tokens:.1f} a token over 5 us, {sum(gaps) / d.tokens:.0f} us a token"]


def call_lines(d: Decode) -> list[str]:
    """The decode thread's CUDA calls by total time, and its syncs' waits."""
    totals = defaultdict(lambda: [0, 0.0])
    for e in d.calls:
        if e["ts"] >= d.start:
            totals[e["name"]][0] += 1
            totals[e["name"]][1] += e["dur"]
    waits = sorted(e["dur"] for e in d.syncs)
    return (["the decode thread's CUDA calls, a token (count, us):"]
            + [f"  {dur / d.tokens:8.0f} us  {count / d.tokens:6.1f}x  {name}"
               for name, (count, dur) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:14]]
            + [f"host syncs: {len(waits) / d.tokens:.1f} a token, waiting {sum(waits) / d.tokens:.0f} us a token; "
               f"median {waits[len(waits) // 2]:.0f} us, p90 {waits[len(waits) * 9 // 10]:.0f} us"])


def launched(gpu: list[dict]) -> dict:
    """Correlation id -> the GPU work it launched (a graph: the span of all its kernels)."""
    spans = {}
    for e in gpu:
        c = e.get("args", {}).get("correlation")
        if c is None:
            continue
        first = spans.get(c, e)
        begin, stop = min(first["ts"], e["ts"]), max(first["ts"] + first["dur"], e["ts"] + e["dur"])
        spans[c] = {**first, "ts": begin, "dur": stop - begin}
    return spans


def _issued(e: dict, spans: dict, t0: float) -> str | None:
    """What a copy or graph launch issued, and when it ran; None for small copies and plain kernel launches."""
    dev, what = spans.get(e.get("args", {}).get("correlation")), e["name"]
    if dev is not None and dev["cat"] == "gpu_memcpy":
        if dev.get("args", {}).get("bytes", 0) < BIG_COPY:
            return None
        what = f"copy {dev['args']['bytes'] / 1e6:.1f} MB"
    elif what.startswith("cudaLaunch"):
        return None
    ran = f"; ran {dev['ts'] - t0:8.0f} .. {dev['ts'] + dev['dur'] - t0:8.0f}" if dev is not None else ""
    return f"issued {what}{ran}"


def timeline_lines(d: Decode, shown: int) -> list[str]:
    """One stretch of tokens mid-decode: host syncs returning, copies and graph launches issued and run."""
    spans = launched(d.gpu)
    mid = d.syncs[len(d.syncs) // 2]["ts"]
    t0 = next(e for e in d.syncs if e["ts"] >= mid)["ts"]
    t1 = t0 + shown * d.window / d.tokens
    rows = []
    for e in (e for e in d.calls if t0 <= e["ts"] < t1):
        if "Synchronize" in e["name"]:
            rows.append((e["ts"] + e["dur"], f"host sync returned (waited {e['dur']:.0f} us)"))
        elif e["name"].startswith(("cudaMemcpy", "cudaLaunch")) or e["name"] == "cudaGraphLaunch":
            text = _issued(e, spans, t0)
            if text:
                rows.append((e["ts"], text))
    return ([f"one stretch of {shown} token(s), us from a host sync's start (host times; 'ran': on the GPU):"]
            + [f"  {ts - t0:8.0f}  {text}" for ts, text in sorted(rows)])


def main() -> None:
    d = Decode(load(sys.argv[1]), int(sys.argv[3]) if len(sys.argv) > 3 else 17)
    shown = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    for part in ([d.header()], stream_lines(d), copy_lines(d), call_lines(d), timeline_lines(d, shown)):
        if part:
            print("\n".join(part) + "\n")


if __name__ == "__main__":
    main()
