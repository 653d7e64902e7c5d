"""Where a decode token's time goes, from a torch.profiler Chrome trace (`python -m bench profile --mode trace`).

Prints, over the decode tokens of the trace (after the first host sync that follows the prompt):
  - each GPU stream's busy time a token (kernels, copies by direction) and the copy stream's idle gaps;
  - the host's CUDA runtime calls by total time (a layer's host sync shows as the stream synchronize
    behind its `tolist`), and the syncs' waits;
  - one token's layers as a timeline: when the decode thread's sync returned, when it issued the layer's
    copies and graph launches, and when the copy engine ran them.
Usage: python -m bench.trace_summary TRACE.json[.gz] [tokens=2 shown]
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


def main() -> None:
    events = load(sys.argv[1])
    shown = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    syncs = sorted((e for e in runtime if "Synchronize" in e["name"]), key=lambda e: e["ts"])
    if not syncs:
        sys.exit("no host syncs in the trace")
    main_tid = max({e["tid"] for e in syncs}, key=lambda t: sum(1 for e in syncs if e["tid"] == t))
    syncs = [e for e in syncs if e["tid"] == main_tid]
    # the decode: from the first sync after the longest gap-free prompt phase; simply: the last 85% of syncs
    start = syncs[len(syncs) * 15 // 100]["ts"]
    end = max(e["ts"] + e["dur"] for e in gpu)
    window = end - start
    heads = [e for e in runtime if e["tid"] == main_tid and e["name"] == "cudaGraphLaunch" and e["ts"] >= start]
    graph_launches = len(heads)
    d_syncs = [e for e in syncs if e["ts"] >= start]
    tokens = max(1, round(len(d_syncs) / 17))           # 16 MoE layers' syncs + the token's own (OLMoE)
    print(f"decode window {window / 1e3:.1f} ms, ~{tokens} tokens ({len(d_syncs)} host syncs, {graph_launches} graph "
          f"launches): {window / tokens / 1e3:.2f} ms a token")

    by_stream = defaultdict(lambda: defaultdict(float))
    copies = []
    for e in gpu:
        if e["ts"] < start:
            continue
        stream = e.get("args", {}).get("stream", e["tid"])
        kind = e["cat"] if e["cat"] != "gpu_memcpy" else e["name"].split()[1] if " " in e["name"] else e["name"]
        by_stream[stream][kind] += e["dur"]
        if e["cat"] == "gpu_memcpy" and e.get("args", {}).get("bytes", 0) >= BIG_COPY:
            copies.append(e)
    print("\nGPU streams, us a token:")
    for stream, kinds in sorted(by_stream.items(), key=lambda kv: -sum(kv[1].values())):
        print(f"  stream {stream}: " + ", ".join(f"{k} {v / tokens:.0f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])))
    if copies:
        copies.sort(key=lambda e: e["ts"])
        busy = sum(e["dur"] for e in copies)
        gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(copies, copies[1:])]
        mb = sum(e["args"]["bytes"] for e in copies) / len(copies) / 1e6
        print(f"\nexpert copies: {len(copies) / tokens:.1f} a token of {mb:.2f} MB, {busy / len(copies):.0f} us each "
              f"({mb * 1e6 / (busy / len(copies)) / 1e3:.1f} GB/s); the copy engine busy {busy / window:.0%} of the decode; "
              f"gaps between copies: {sum(1 for g in gaps if g > 5) / tokens:.1f} a token over 5 us, "
              f"{sum(g for g in gaps if g > 5) / tokens:.0f} us a token")

    totals = defaultdict(lambda: [0, 0.0])
    for e in runtime:
        if e["tid"] == main_tid and e["ts"] >= start:
            totals[e["name"]][0] += 1
            totals[e["name"]][1] += e["dur"]
    print("\nthe decode thread's CUDA calls, a token (count, us):")
    for name, (count, dur) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:14]:
        print(f"  {dur / tokens:8.0f} us  {count / tokens:6.1f}x  {name}")
    waits = sorted(e["dur"] for e in d_syncs)
    print(f"host syncs: {len(waits) / tokens:.1f} a token, waiting {sum(waits) / tokens:.0f} us a token; median "
          f"{waits[len(waits) // 2]:.0f} us, p90 {waits[len(waits) * 9 // 10]:.0f} us")

    # one token's timeline: host syncs returning, H2D copies issued (host) and run (copy engine), graph launches
    corr = {}                   # correlation id -> the GPU work it launched (a graph: all its kernels' span)
    for e in gpu:
        c = e.get("args", {}).get("correlation")
        if c is None:
            continue
        if c in corr:
            first = corr[c]
            stop = max(first["ts"] + first["dur"], e["ts"] + e["dur"])
            corr[c] = {**first, "ts": min(first["ts"], e["ts"]), "dur": stop - min(first["ts"], e["ts"])}
        else:
            corr[c] = e
    mid = d_syncs[len(d_syncs) // 2]["ts"]
    t0 = next(e for e in d_syncs if e["ts"] >= mid)["ts"]
    t1 = t0 + shown * window / tokens
    rows = []
    for e in runtime:
        if e["tid"] != main_tid or not t0 <= e["ts"] < t1:
            continue
        name = e["name"]
        if "Synchronize" in name:
            rows.append((e["ts"] + e["dur"], f"host sync returned (waited {e['dur']:.0f} us)"))
        elif name.startswith("cudaMemcpy") or name == "cudaGraphLaunch" or name.startswith("cudaLaunch"):
            dev = corr.get(e.get("args", {}).get("correlation"))
            what = name
            if dev is not None and dev["cat"] == "gpu_memcpy":
                size = dev.get("args", {}).get("bytes", 0)
                if size < BIG_COPY:
                    continue
                what = f"copy {size / 1e6:.1f} MB"
            elif name.startswith("cudaLaunch"):
                continue
            ran = f"; ran {dev['ts'] - t0:8.0f} .. {dev['ts'] + dev['dur'] - t0:8.0f}" if dev is not None else ""
            rows.append((e["ts"], f"issued {what}{ran}"))
    print(f"\none stretch of {shown} token(s), us from a host sync's start (host times; 'ran': on the GPU):")
    for ts, text in sorted(rows):
        print(f"  {ts - t0:8.0f}  {text}")


if __name__ == "__main__":
    main()
