"""`sluice bench`: a real architecture's dimensions with random weights, run under budgets, measured
against the roofline of bandwidths measured in the same run (and optionally against accelerate).

  roofline per decode token = disk bytes / disk bandwidth + host->device bytes / PCIe bandwidth
                              + bytes the GPU must read (dense + active experts + KV) / HBM bandwidth
  efficiency = roofline time / measured time (1.0 = as fast as the bytes allow; above 1 means the
  copies overlapped better than the sum assumes).
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

from engine.errors import SluiceError
from engine.model import dense_quant
from engine.runtime.memory import anonymous_by_mapping
from engine.runtime.placement import LIVE_FACTOR
from engine.runtime.store import READ_PIECES, reader_threads
from engine.runtime.telemetry import delta, phase_hit_rate, ratio, value_at
from engine.sizes import format_size
from engine.options import Options

WARM_PROMPTS = 3     # warm prefills timed after the generation; the bench reports their median
FILL_WAIT_MAX_S = 600.0   # the longest the steady decode waits for the RAM fill


def run(args) -> int:
    """`sluice bench` with the CLI's arguments (engine/tools/cli.py: _add_bench)."""
    from engine.tools.presets import PRESETS
    if args.regime or args.llama_bench:
        raise SluiceError("Memory regimes and the llama.cpp peer run from the repository's bench tree: "
                          "python -m bench regime --regime NAME -- [these sluice bench flags].")
    if args.preset not in PRESETS:
        raise SluiceError(f"Unknown preset '{args.preset}': choose one of {', '.join(PRESETS)}.")
    check_device(args.device)
    log = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
    work = Path(args.work_dir) if args.work_dir else _default_work_dir()
    args.via_repack = args.via_repack or args.baseline == "accelerate"
    model_dir, hf_dir = build_apart(args.preset, args.quant, work, args.via_repack, args.device, bool(args.json))
    result = measure(model_dir, args, log)
    if args.baseline == "accelerate":
        from engine.tools.baseline import run_accelerate
        result["baseline"] = run_accelerate(hf_dir, args.vram_budget, args.ram_cache, args.prompt_tokens,
                                            args.baseline_new_tokens, work / "offload", log)
        base = result["baseline"]["decode_tok_s"]
        result["speedup_vs_baseline"] = result["decode_tok_s"] / base if base else None
    print(json.dumps(result, indent=1) if args.json else report(result))
    return 0


def check_device(device: str) -> None:
    """A device the bench can run on, before anything is built: one sentence saying what to do otherwise."""
    import torch
    if device != "cpu" and device != "cuda" and not device.startswith("cuda:"):
        raise SluiceError(f"Unknown device '{device}': use --device cuda (a GPU) or --device cpu.")
    if device == "cpu" or torch.cuda.is_available():
        return
    if torch.version.cuda is None:
        raise SluiceError("This PyTorch is a CPU-only build, so sluice bench cannot use a GPU: add --device cpu to "
                          "run it on the CPU, or install the CUDA build of torch into .venv.")
    raise SluiceError("No CUDA GPU is visible to PyTorch (check the NVIDIA driver with nvidia-smi); "
                      "add --device cpu to run the bench on the CPU instead.")


def engine_options(args) -> Options:
    """The engine's options from `--eager`, `--copy-rate-gbps` and `--set KEY=VALUE` (a bad setting: one sentence)."""
    return Options.parse(args.settings, Options(eager=args.eager, copy_rate_gbps=args.copy_rate_gbps))


def _default_work_dir() -> Path:
    from kernels.selfcheck import cache_path
    return cache_path().parent / "bench"


def build_apart(preset: str, quant: str, work: Path, via_repack: bool, device: str, to_stderr: bool):
    """The bench's model, written in a child process where it does not exist yet: writing it leaves the writing
    process ~110 MiB more anonymous memory even after a trim, which the bench would count as the engine's."""
    import subprocess

    from engine.format.modeldir import MANIFEST
    from engine.tools.presets import HF_INDEX, PRESETS
    model_dir, hf_dir = _model_paths(preset, quant, work, via_repack)
    if (model_dir / MANIFEST).is_file() and (hf_dir is None or (hf_dir / HF_INDEX).is_file()):
        return model_dir, hf_dir
    job = json.dumps([preset, PRESETS[preset], quant, str(work), via_repack, device, to_stderr])
    path = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))      # the parent's imports, as a test has them
    done = subprocess.run([sys.executable, "-c", "import sys; from engine.tools.bench import _build_child; "
                           "sys.exit(_build_child(sys.argv[1]))", job], env={**os.environ, "PYTHONPATH": path})
    if done.returncode != 0:
        raise SluiceError(f"The bench's {preset} model could not be written into {work} (the line above says why); "
                          f"free the space or choose another --work-dir, then run the bench again.")
    return model_dir, hf_dir


def _build_child(job: str) -> int:
    """`_build` in the child process, with the parent's very preset (a test may have added one)."""
    from engine.tools.presets import PRESETS
    preset, config, quant, work, via_repack, device, to_stderr = json.loads(job)
    PRESETS[preset] = config
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if to_stderr else (lambda msg: print(msg, flush=True))
    try:
        _build(preset, quant, Path(work), via_repack, device, log)
    except (SluiceError, OSError) as e:
        from engine.errors import fs_error_sentence
        print(f"sluice: {(fs_error_sentence(e) if isinstance(e, OSError) else None) or e}", file=sys.stderr)
        return 1
    return 0


def _model_paths(preset: str, quant: str, work: Path, via_repack: bool) -> tuple[Path, Path | None]:
    """(the Sluice model folder, the HF checkpoint it is repacked from or None) the bench keeps in `work`."""
    from engine.tools.presets import hf_checkpoint_dir
    if via_repack:
        return work / f"{preset}-{quant}-repacked", hf_checkpoint_dir(work, preset)
    return work / f"{preset}-{quant}", None


def _build(preset: str, quant: str, work: Path, via_repack: bool, device: str, log):
    from engine.tools.presets import write_hf_checkpoint, write_sluice_dir
    from engine.format.repack import repack
    start = time.perf_counter()
    model_dir, hf_dir = _model_paths(preset, quant, work, via_repack)
    if via_repack:
        write_hf_checkpoint(preset, hf_dir, device=device, progress=log)
        if not (model_dir / "sluice.json").is_file():
            repack(hf_dir, model_dir, quant=quant, progress=lambda d, t, m: log(f"repack {d}/{t}: {m}") if d % 8 == 0 else None)
    else:
        write_sluice_dir(preset, model_dir, quant, device=device, progress=log)
    if hasattr(os, "sync"):        # its dirty pages out before anything is timed: a fresh checkpoint's write-back
        os.sync()                  # would compete with the first run's disk reads
    log(f"model ready in {time.perf_counter() - start:.1f} s: {model_dir}")
    return model_dir, hf_dir


def measure(model_dir: Path, args, log) -> dict:
    from engine.plan import bandwidth
    from engine.format.modeldir import EXPERTS_FILE, open_model_dir
    md = open_model_dir(model_dir)
    spec, block_bytes = md.spec, md.layout.block_bytes
    disk_bps = bandwidth.disk_read_bps(md.path / EXPERTS_FILE, block_bytes)
    is_cuda = args.device.startswith("cuda")
    options = engine_options(args)
    h2d_bps = bandwidth.h2d_bps(args.device, num_bytes=(256 << 20) if is_cuda else (32 << 20))
    hbm_bps = bandwidth.hbm_copy_bps(args.device, num_bytes=(2 << 30) if is_cuda else (64 << 20))
    log(f"bandwidths: disk {disk_bps / 1e9:.2f} GB/s (O_DIRECT, {reader_threads(READ_PIECES)} reads in flight), h2d {h2d_bps / 1e9:.1f} GB/s, "
        f"HBM copy {hbm_bps / 1e12:.2f} TB/s")
    if options.copy_rate_gbps is not None:     # the roofline's PCIe term is the simulated link's
        h2d_bps = min(h2d_bps, options.copy_rate_gbps * 1e9)
        log(f"copies paced to {options.copy_rate_gbps:g} GB/s (a simulated slower link): the roofline takes "
            f"h2d {h2d_bps / 1e9:.3g} GB/s")
    max_tokens = args.prompt_tokens + args.new_tokens
    from engine import GenerationParams
    from engine.engine import Engine
    if is_cuda:
        import torch
        torch.cuda.empty_cache()      # the probes' buffers: the driver-view VRAM below is the engine's own
    eng = Engine.load(md.path, device=args.device, vram_budget=args.vram_budget, ram_cache=args.ram_cache,
                      dtype=args.dtype, max_context=max_tokens, dense_quant=args.dense_quant,
                      options=options)
    rng = random.Random(0)
    prompt = [rng.randrange(spec.vocab_size) for _ in range(args.prompt_tokens)]
    # Sampled at temperature 1 (a random model's logits are nearly flat): varied tokens route to varied
    # experts, like real text; greedy decoding of random weights repeats itself, and so would its experts.
    params = GenerationParams(max_new_tokens=args.new_tokens, temperature=1.0, top_k=args.top_k, top_p=args.top_p,
                              seed=0, ignore_eos=True)
    try:
        t = timed_generate(eng, prompt, params)
        end = eng.telemetry()
        warm = _warm_prefill(eng, [[rng.randrange(spec.vocab_size) for _ in range(args.prompt_tokens)]
                                   for _ in range(WARM_PROMPTS)], end, params)
        steady = _steady_generation(eng, [rng.randrange(spec.vocab_size) for _ in range(args.prompt_tokens)], params,
                                    fill_wait_s=min(FILL_WAIT_MAX_S, 10 + 2 * eng.runner.plan.ram_cache_bytes / disk_bps))
    finally:
        eng.close()
    bps, embed_bytes = {"disk": disk_bps, "h2d": h2d_bps, "hbm_copy": hbm_bps}, _embed_bytes(eng.runner.model)
    return {**_summary(args, md, eng.runner.plan, eng.runner.kernel_verdict, t, end, bps, embed_bytes),
            "steady_decode": _steady_summary(md, eng.runner.plan, steady, bps, embed_bytes),
            "placement": steady[1].get("placement"),          # with the CPU share's trial verdict, where one ran
            **warm, "dense_quant": eng.dense_quant or "none", "kernel_warmup": eng.kernel_warmup,
            "sampling": {"temperature": 1.0, "top_k": args.top_k, "top_p": args.top_p}, "settings": args.settings}


def _embed_bytes(model) -> int:
    """The embedding table's bytes in the VRAM plan that a decode step does not read (it reads one row):
    none when the head reads the same table or the table stays in host RAM."""
    if model.embed_in_ram or model.embed_tokens is model.lm_head:
        return 0
    return dense_quant.nbytes(model.embed_tokens)


def _sampling_note(sampling: dict | None) -> str:
    """The decode's top-k / top-p, where the bench was asked for them (the app samples with both)."""
    cuts = [f"top-k {sampling['top_k']}" if sampling and sampling["top_k"] else "",
            f"top-p {sampling['top_p']:g}" if sampling and sampling["top_p"] < 1 else ""]
    return "".join(f", {cut}" for cut in cuts if cut)


def _warm_prefill(eng, prompts: list[list[int]], before: dict, params) -> dict:
    """New prompts of the same length, one after another, after the first generation left its experts in the
    caches: prefill from RAM (and VRAM) where the model fits, beside the cold one (TTFT) from disk. The median
    TTFT of WARM_PROMPTS (one pass swings by 10-20% on a busy host), the bytes a prompt on average. Each first
    token is drawn as the generation's were (with top-k the host finishes the draw; plain sampling on the GPU
    loads torch's sampling modules at its first use, ~0.2 s that a warm TTFT would otherwise count)."""
    ttfts = []
    for seed, prompt in enumerate(prompts, start=1):
        start = time.perf_counter()
        for _ in eng.generate(prompt, dataclasses.replace(params, max_new_tokens=1, seed=seed)):
            ttfts.append(time.perf_counter() - start)
    ttft = statistics.median(ttfts)
    return {"warm_ttft_s": ttft, "warm_prefill_tok_s": len(prompts[0]) / ttft,
            "warm_prefill_bytes": _tier_bytes(eng.telemetry(), before, len(prompts))}


def _tier_bytes(after: dict, before: dict, tokens: int) -> dict:
    """Expert bytes per token by tier: read from disk, copied host -> device, computed on the CPU where they
    sit in RAM (hybrid execution)."""
    d = lambda *path: delta(after, before, *path) / tokens                     # noqa: E731
    return {"disk": d("disk", "bytes_read"), "h2d": d("h2d", "bytes"), "cpu": d("cpu", "bytes")}


def _setup_fields(args, md, plan, verdict, bps: dict) -> dict:
    """What was run: the model, its budgets and kernels, and the bandwidths measured in the same run."""
    import torch
    expert_bytes, block_bytes = md.expert_bytes_total, md.layout.block_bytes
    return {
        "preset": args.preset, "quant": md.quant, "model_dir": str(md.path),
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "expert_bytes": expert_bytes, "vram_budget_bytes": plan.vram_budget_bytes,
        "ram_cache_bytes": plan.ram_cache_bytes, "slots_per_bank": plan.slots_per_bank,
        "kv_tokens": args.prompt_tokens + args.new_tokens, "device_slot_bytes": plan.device_slot_bytes,
        "dense_bytes": plan.dense_bytes, "workspace_bytes": plan.workspace_bytes,
        "streaming_factor": expert_bytes / (plan.vram_budget_bytes + plan.ram_cache_bytes),
        "expert_cache_factor": expert_bytes / (2 * plan.slots_per_bank * block_bytes + plan.ram_cache_bytes),
        "kernel": "triton" if verdict and verdict.ok else "torch",
        "cuda_graphs": args.device.startswith("cuda") and not args.eager,
        "bandwidth_gbps": {k: bps[k] / 1e9 for k in ("disk", "h2d", "hbm_copy")},
    }


def _steady_generation(eng, prompt: list[int], params, fill_wait_s: float) -> tuple:
    """A second reply, after the warm prompts and once the RAM fill has ended (filled at once, at most `fill_wait_s`):
    the decode a user sees from then on, and what a peer's warmed-up run is compared with (the first generation's
    decode runs while the fill still reads the rest of the model). -> (its timings, the telemetry at its end,
    seconds waited for the fill, whether the fill ended)."""
    start = time.perf_counter()
    filled = eng.wait_ram_filled(fill_wait_s)
    waited = time.perf_counter() - start
    t = timed_generate(eng, prompt, dataclasses.replace(params, seed=WARM_PROMPTS + 1))
    return t, eng.telemetry(), waited, filled


def _decode_figures(md, plan, t, end: dict, bps: dict, embed_bytes: int) -> dict:
    """A generation's decode against its roofline: deltas between the snapshot after its prefill and `end`."""
    spec, block_bytes = md.spec, md.layout.block_bytes
    before = t.after_prefill
    decoded = max(t.new_tokens - 1, 1)
    tiers = _tier_bytes(end, before, decoded)
    # blocks read ahead of need into free RAM slots (Experts.fill) are not a token's own reads
    fill_reads = delta(end, before, "ram_cache", "fill_reads")
    tiers["disk"] = max(tiers["disk"] - fill_reads * block_bytes / decoded, 0.0)
    ngram = _ngram_figures(end, before, decoded)
    disk_tok, h2d_tok = tiers["disk"] + ngram.get("bytes_read_per_token", 0.0), tiers["h2d"]
    # the GPU reads the dense weights (one embedding row), the KV cache and the active experts the CPU did not compute
    gpu_tok = (plan.dense_bytes - embed_bytes + spec.top_k * len(spec.moe_layers) * block_bytes - tiers["cpu"]
               + plan.kv_bytes // 2)
    roofline_s = disk_tok / bps["disk"] + h2d_tok / bps["h2d"] + gpu_tok / bps["hbm_copy"]
    return {"decoded": decoded, "tiers": tiers, "fill_reads": fill_reads, "ngram": ngram, "gpu_tok": gpu_tok,
            "roofline_s": roofline_s, "measured_s": t.decode_s / decoded}


def _steady_summary(md, plan, steady: tuple, bps: dict, embed_bytes: int) -> dict:
    t, end, waited, filled = steady
    f = _decode_figures(md, plan, t, end, bps, embed_bytes)
    per_token = lambda *path: delta(end, t.after_prefill, *path) / f["decoded"]      # noqa: E731
    return {"new_tokens": t.new_tokens, "tok_s": f["decoded"] / t.decode_s, "s_per_token": f["measured_s"],
            "roofline_s_per_token": f["roofline_s"], "efficiency": f["roofline_s"] / f["measured_s"],
            "bytes_per_token": {**f["tiers"], "gpu_reads": f["gpu_tok"]}, "fill_wait_s": waited, "ram_filled": filled,
            "hit_rate": {"vram": phase_hit_rate(end, t.after_prefill, "vram"),
                         "ram": phase_hit_rate(end, t.after_prefill, "ram_cache")},
            **_decode_times(per_token)}


def _summary(args, md, plan, verdict, t, end: dict, bps: dict, embed_bytes: int) -> dict:
    """The bench's JSON: decode-phase figures are deltas between the snapshot after prefill and the end."""
    spec, block_bytes = md.spec, md.layout.block_bytes
    disk_bps, h2d_bps = bps["disk"], bps["h2d"]
    before = t.after_prefill
    f = _decode_figures(md, plan, t, end, bps, embed_bytes)
    decoded, tiers, fill_reads, ngram, gpu_tok = f["decoded"], f["tiers"], f["fill_reads"], f["ngram"], f["gpu_tok"]
    roofline_s, measured_s = f["roofline_s"], f["measured_s"]
    d = lambda *path: delta(end, before, *path)                     # noqa: E731 - decode-phase delta
    prefill = _tier_bytes(before, {}, 1)                                    # prefill: the whole prompt, cold
    return {
        **_setup_fields(args, md, plan, verdict, bps),
        "prompt_tokens": args.prompt_tokens, "new_tokens": t.new_tokens,
        "ttft_s": t.prefill_s, "prefill_tok_s": args.prompt_tokens / t.prefill_s,
        "decode_tok_s": decoded / t.decode_s,
        "prefill_bytes": prefill,
        "prefill_max_reads_per_expert_per_layer": value_at(before, ("disk", "max_reads_per_expert_in_prefill")),
        "prefill_roofline_s": prefill["disk"] / disk_bps + prefill["h2d"] / h2d_bps,
        "decode_bytes_per_token": {**tiers, "gpu_reads": gpu_tok},
        "decode_fill_reads": fill_reads,
        "decode_hit_rate": {"vram": phase_hit_rate(end, before, "vram"),
                            "ram": phase_hit_rate(end, before, "ram_cache")},
        "placement": end.get("placement"),
        "copy_pacing": end["copy_pacing"] and {**end["copy_pacing"], "copied_gbps": end["h2d"]["gbps"]},
        **_decode_times(lambda *path: d(*path) / decoded),
        "speculation_recall": ratio(d("speculation", "correct"), d("speculation", "predicted")),
        "prefetch": {"issued": d("prefetch", "issued"), "used": d("prefetch", "used")},
        "decode_roofline_s_per_token": roofline_s, "decode_s_per_token": measured_s,
        "decode_efficiency": roofline_s / measured_s,
        **_memory_fields(end, before, plan.vram_budget_bytes),
        "decode_major_faults_per_token": t.decode_major_faults / decoded,
        "warnings": end["warnings"],
        **({"decode_ngram": ngram} if ngram else {}),
        **_full_model_scale(args.preset, spec, block_bytes, tiers["disk"], ngram),
    }


def _ngram_figures(end: dict, before: dict, decoded: int) -> dict:
    """A PLE model's n-gram rows over the decode ({} for other models): rows and bytes read a token, the RAM
    cache's hit rate, read amplification (bytes read / bytes of the rows)."""
    d = lambda key: delta(end, before, "ngram", key)                # noqa: E731
    if not d("tokens"):
        return {}
    return {"rows_per_token": d("rows") / decoded, "bytes_read_per_token": d("bytes_read") / decoded,
            "hit_rate": ratio(d("hits"), d("hits") + d("misses")),
            "read_amplification": ratio(d("bytes_read"), d("bytes_used")),
            "held_read_bytes": d("held_read_bytes")}          # the held tables' background read, over the decode


def _decode_times(per_token) -> dict:
    """Where a decode token's time went, per token: the CPU's experts, the waits at syncs and for reads."""
    return {"decode_cpu_per_token": {key: per_token("cpu", key) for key in ("experts", "bytes", "busy_s")},
            "decode_sync_wait_s_per_token": per_token("host", "sync_wait_s"),
            "decode_disk_active_s_per_token": per_token("disk", "active_s"),
            "decode_read_wait_s_per_token": per_token("host", "read_wait_s")}


def _memory_fields(end: dict, before: dict, vram_budget_bytes: int) -> dict:
    """VRAM and process memory: the larger of the two snapshots (after prefill, at the end)."""
    most = lambda tier, key: max(end[tier][key], before[tier][key])            # noqa: E731
    return {"vram_peak_bytes": end["vram"]["peak_bytes"],
            "vram_peak_within_budget": end["vram"]["peak_bytes"] <= vram_budget_bytes,
            "vram_driver_bytes": most("vram", "driver_bytes"), "process_rss_bytes": most("process", "rss_bytes"),
            "process_non_cache_bytes": most("process", "non_cache_bytes"),
            "process_non_cache_anon_bytes": most("process", "non_cache_anon_bytes"),
            "process_anonymous_by_mapping": anonymous_by_mapping()}


def _mapping_lines(r: dict) -> list[str]:
    where = r.get("process_anonymous_by_mapping")
    if not where:
        return []
    return ["anonymous    " + ", ".join(f"{name} {format_size(n)}" for name, n in where)]


def _pacing_lines(r: dict) -> list[str]:
    """Copies paced to a simulated slower link (Options.copy_rate_gbps): said before any figure measured with it."""
    p = r.get("copy_pacing")
    if not p:
        return []
    own = f" (this GPU's own: {p['device_gbps']:.1f} GB/s)" if p.get("device_gbps") else ""
    return [f"pacing       SIMULATED LINK: copies into the slots paced to {p['rate_gbps']:g} GB/s{own}, ran at "
            f"{p['copied_gbps']:.3g} GB/s, the roofline's copy term at {r['bandwidth_gbps']['h2d']:.3g} GB/s; no figure "
            f"here is this machine's own speed"]


def _placement_lines(r: dict) -> list[str]:
    p = r.get("placement")
    if not p:
        return []
    if not p.get("active", True):
        when = "an earlier load (kept for this machine)" if p.get("measured") == "earlier" else "load"
        return [f"placement    CPU share off ({p['mode']}): an expert took {p['cpu_expert_s'] * 1e6:.0f} us at {when} "
                f"(decoding takes ~{LIVE_FACTOR:g}x that), a block copy {p['copy_s'] * 1e6:.0f} us: copying is faster here"]
    busy = r["decode_cpu_per_token"]["busy_s"] / max(r["decode_cpu_per_token"]["experts"], 1e-9)
    kernel = p.get("cpu_kernel", "torch")
    other = (f" (torch {p['torch_expert_s'] * 1e6:.0f} us)" if kernel == "fused"
             else f" (fused {p['fused_expert_s'] * 1e6:.0f} us)" if "fused_expert_s" in p else "")
    return [f"placement    CPU share {p['mode']} on {p['threads']} threads, {kernel} kernel: an expert took "
            f"{p['cpu_expert_s'] * 1e6:.0f} us at load{other}, {busy * 1e6:.0f} us decoding; a block copy "
            f"{p['copy_s'] * 1e6:.0f} us{_trial_note(p.get('trial'))}"]


def _trial_note(trial: dict | None) -> str:
    """The decode steps' verdict on the CPU's share (placement.ShareTrial), where its trial has decided."""
    if not trial:
        return ""
    return (f"; timed while decoding, a token took {trial['with_share_s'] * 1e3:.2f} ms with the share and "
            f"{trial['without_s'] * 1e3:.2f} ms without: share {'kept' if trial['on'] else 'off'}")


def _full_model_scale(preset: str, spec, block_bytes: int, disk_per_token: float, ngram: dict) -> dict:
    """For a preset with fewer layers than its model: bytes per token scaled to the whole model (expert reads by
    layers; n-gram rows as they are: the preset keeps the model's PLE layers), beside what the engine the project
    was created from did on it."""
    from engine.tools.presets import FULL_MODEL
    full = FULL_MODEL.get(preset)
    if full is None:
        return {}
    scale = full["num_layers"] / len(spec.moe_layers)
    reference = {k: v for k, v in full.items() if k.startswith("reference_")}
    return {"full_model": {"name": full["name"], "num_layers": full["num_layers"], "preset_layers": spec.num_layers,
                           "expert_bytes_per_token": spec.top_k * full["num_layers"] * block_bytes,
                           "disk_bytes_per_token": disk_per_token * scale + ngram.get("bytes_read_per_token", 0.0),
                           **reference}}


class _Timings:
    prefill_s = decode_s = 0.0
    new_tokens = 0
    decode_major_faults = 0
    after_prefill: dict = {}


def _major_faults() -> int:
    """Pages this process had to read from files so far (code or data evicted under a memory cap, and the rows
    of an embedding table left in its file: 1-2 a token never seen before): a decode that adds many more is
    thrashing the libraries' pages, its RAM cache set too large."""
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    except (ImportError, OSError):
        return 0


def timed_generate(eng, prompt: list[int], params) -> _Timings:
    """Engine.generate (the path users run), timed: TTFT to the first token, decode from there on;
    the telemetry snapshot between the two phases separates their bytes."""
    t = _Timings()
    start = time.perf_counter()
    for event in eng.generate(prompt, params):
        if t.new_tokens == 0:
            t.prefill_s = time.perf_counter() - start
            t.after_prefill = eng.telemetry()
            faults, start = _major_faults(), time.perf_counter()
        t.new_tokens += 1
    t.decode_s = time.perf_counter() - start
    t.decode_major_faults = _major_faults() - faults if t.new_tokens else 0
    return t


def _full_model_lines(r: dict) -> list[str]:
    f = r.get("full_model")
    if not f:
        return []
    gib = lambda n: f"{n / 2**30:.2f} GiB"                               # noqa: E731
    seed = (f"{gib(f['reference_bytes_per_token'])}/token" if "reference_bytes_per_token" in f
            else f"{f['reference_tok_s']} tok/s on its own machine")
    return [f"{f['name']}    this preset has {f['preset_layers']} of its {f['num_layers']} layers; scaled to "
            f"{f['num_layers']}: experts per token {gib(f['expert_bytes_per_token'])}, read from disk per token "
            f"{gib(f['disk_bytes_per_token'])} (the seed engine: {seed})"]


def _ngram_lines(r: dict) -> list[str]:
    g = r.get("decode_ngram")
    if not g:
        return []
    return [f"n-gram rows  {g['rows_per_token']:.1f} a token, {g['bytes_read_per_token'] / 1024:.1f} KiB read a token "
            f"(in the roofline's disk term), RAM hit rate {g['hit_rate']:.1%}, read amplification {g['read_amplification']:.1f}x"]


def _warm_prefill_lines(r: dict) -> list[str]:
    if "warm_prefill_tok_s" not in r:
        return []
    w = r["warm_prefill_bytes"]
    moved = (f"copied into slots {_gb(w['h2d'])}" if _on_cpu(r) else
             f"h2d {_gb(w['h2d'])}, computed on the CPU {_gb(w['cpu'])}")
    return [f"prefill warm {r['prompt_tokens']} tokens after the first generation (median of {WARM_PROMPTS}): "
            f"{r['warm_prefill_tok_s']:.1f} tok/s (TTFT {r['warm_ttft_s']:.2f} s), disk {_gb(w['disk'])} a prompt, "
            f"{moved}"]


def _warmup_note(outcome: str | None) -> str:
    """This machine's first start: its kernels were checked in a child process before the load (kernel_warmup)."""
    return f" (checked in a child first: {outcome})" if outcome else ""


def report(r: dict) -> str:
    """The bench's JSON as lines a person reads; on the CPU device without a GPU's words (the slot banks live in
    RAM, the "PCIe" is a RAM copy, there are no CUDA graphs, VRAM or HBM)."""
    from engine.tools.presets import PRESET_NOTES
    lines = [f"note: {PRESET_NOTES[r['preset']]}"] if r["preset"] in PRESET_NOTES else []
    lines += [*_setup_lines(r), *_pacing_lines(r), *_prefill_lines(r), *_warm_prefill_lines(r), *_decode_lines(r),
              *_steady_lines(r), *_placement_lines(r), *_ngram_lines(r), *_full_model_lines(r), *_memory_lines(r), *_mapping_lines(r)]
    if "baseline" in r:
        b = r["baseline"]
        lines.append(f"accelerate   decode {b['decode_tok_s']:.3f} tok/s, TTFT {b['ttft_s']:.2f} s "
                     f"({b['prompt_tokens']} prompt tokens); Sluice / accelerate = {r['speedup_vs_baseline']:.1f}x")
    lines += [f"warning      {w}" for w in r["warnings"]]
    return "\n".join(lines)


def _on_cpu(r: dict) -> bool:
    return r["device"] == "cpu"


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _setup_lines(r: dict) -> list[str]:
    """What ran: the model against its budgets, the kernels, the bandwidths measured."""
    bw = r["bandwidth_gbps"]
    if _on_cpu(r):
        budget, engine = "slot budget", f"kernels {r['kernel']}"
        bandwidth = f"disk {bw['disk']:.2f} GB/s   RAM -> slot copy {bw['h2d']:.1f} GB/s   memory copy {bw['hbm_copy']:.1f} GB/s"
    else:
        budget = "VRAM budget"
        engine = (f"kernel {r['kernel']}{_warmup_note(r.get('kernel_warmup'))}, "
                  f"CUDA graphs {'on' if r['cuda_graphs'] else 'off'}")
        bandwidth = (f"disk {bw['disk']:.2f} GB/s   h2d {bw['h2d']:.1f} GB/s   "
                     f"HBM copy {bw['hbm_copy'] / 1e3:.2f} TB/s")
    return [
        f"{r['preset']} {r['quant']} on {r['device']}: experts {_gb(r['expert_bytes'])}, {budget} "
        f"{format_size(r['vram_budget_bytes'])} ({r['slots_per_bank']} slots/bank), RAM cache "
        f"{format_size(r['ram_cache_bytes'])}, experts / ({budget} + RAM) = {r['streaming_factor']:.1f}x",
        f"dense weights {r.get('dense_quant', 'none').replace('none', 'as stored')} "
        f"({format_size(r['dense_bytes'])}), {engine}, KV {r['kv_tokens']} tokens, decode: Engine.generate, tokens "
        f"sampled at temperature 1{_sampling_note(r.get('sampling'))} (varied routing, like real text)",
        f"bandwidth    {bandwidth}"]


def _prefill_lines(r: dict) -> list[str]:
    return [f"prefill      {r['prompt_tokens']} tokens, cold: {r['prefill_tok_s']:.1f} tok/s, TTFT {r['ttft_s']:.2f} s, "
            f"disk {_gb(r['prefill_bytes']['disk'])}, max reads/expert/layer "
            f"{r['prefill_max_reads_per_expert_per_layer']:.0f}, roofline {r['prefill_roofline_s']:.2f} s"]


def _decode_lines(r: dict) -> list[str]:
    """A decode token: speed against the roofline, its bytes by tier, where its time went, the hit rates."""
    per, cpu = r["decode_bytes_per_token"], _on_cpu(r)
    tables = (r.get("decode_ngram") or {}).get("held_read_bytes", 0)
    ahead = ([f"{r['decode_fill_reads']:.0f} blocks"] if r.get("decode_fill_reads") else []) + \
        ([f"{_gb(tables)} of the n-gram tables"] if tables else [])
    fill = f" (and {' and '.join(ahead)} read ahead into free RAM over the decode)" if ahead else ""
    moved = (f"copied into slots {_gb(per['h2d'])}, computed where it sits in RAM {_gb(per['cpu'])}, compute reads "
             f"{_gb(per['gpu_reads'])}" if cpu else
             f"h2d {_gb(per['h2d'])}, computed on the CPU {_gb(per['cpu'])} "
             f"({r['decode_cpu_per_token']['experts']:.1f} experts), GPU reads {_gb(per['gpu_reads'])}")
    waits = f"the decode thread waited {r.get('decode_sync_wait_s_per_token', 0) * 1e3:.1f} ms of it at the layers' syncs"
    waits += "" if cpu else " (the GPU's side)"
    if r.get("decode_disk_active_s_per_token"):
        waits += (f"; a read was in flight {r['decode_disk_active_s_per_token'] * 1e3:.1f} ms of it, and the decode "
                  f"thread waited for reads {r.get('decode_read_wait_s_per_token', 0) * 1e3:.1f} ms")
    tier = "slots" if cpu else "VRAM"
    return [f"decode       {r['new_tokens']} tokens: {r['decode_tok_s']:.2f} tok/s "
            f"({r['decode_s_per_token'] * 1e3:.1f} ms/token, roofline {r['decode_roofline_s_per_token'] * 1e3:.1f} ms, "
            f"efficiency {r['decode_efficiency']:.2f})",
            f"per token    disk {_gb(per['disk'])}{fill}, {moved}; {waits}",
            f"hit rates    {tier} {r['decode_hit_rate']['vram']:.1%}, RAM {r['decode_hit_rate']['ram']:.1%}; "
            f"speculation recall {r['speculation_recall']:.1%}, prefetch used "
            f"{r['prefetch']['used']:.0f}/{r['prefetch']['issued']:.0f}"]


def _steady_lines(r: dict) -> list[str]:
    """The second reply's decode, once the RAM fill has ended: the steady state a peer's warmed-up run compares with."""
    st = r.get("steady_decode")
    if not st:
        return []
    per = st["bytes_per_token"]
    fill = (f"the RAM fill ended {st['fill_wait_s']:.1f} s after the warm prompts" if st["ram_filled"] else
            f"the RAM fill still running after {st['fill_wait_s']:.0f} s")
    reads = (f", waited for reads {st['decode_read_wait_s_per_token'] * 1e3:.1f} ms"
             if st.get("decode_read_wait_s_per_token") else "")
    tier = "slots" if _on_cpu(r) else "VRAM"
    return [f"decode steady {st['new_tokens']} tokens, a second reply ({fill}): {st['tok_s']:.2f} tok/s "
            f"({st['s_per_token'] * 1e3:.1f} ms/token, roofline {st['roofline_s_per_token'] * 1e3:.1f} ms, efficiency "
            f"{st['efficiency']:.2f}); a token: disk {_gb(per['disk'])}, {'copied' if _on_cpu(r) else 'h2d'} "
            f"{_gb(per['h2d'])}, {tier} hits {st['hit_rate']['vram']:.1%}, RAM hits {st['hit_rate']['ram']:.1%}, "
            f"waited at the layers' syncs {st['decode_sync_wait_s_per_token'] * 1e3:.1f} ms{reads}"]


def _memory_lines(r: dict) -> list[str]:
    """The budget held (the driver's view on a GPU), and the process's memory besides the RAM cache."""
    within = "within" if r["vram_peak_within_budget"] else "OVER"
    if _on_cpu(r):
        held = f"slots peak   {format_size(r['vram_peak_bytes'])} of {format_size(r['vram_budget_bytes'])} budget ({within})"
    else:
        driver = format_size(r["vram_driver_bytes"]) if r["vram_driver_bytes"] else "n/a (no NVML)"
        held = (f"VRAM peak    {format_size(r['vram_peak_bytes'])} of {format_size(r['vram_budget_bytes'])} budget "
                f"({within}); the driver shows {driver} for the process")
    return [held,
            f"process      RSS {format_size(r['process_rss_bytes'])}, of which besides the RAM cache "
            f"{format_size(r['process_non_cache_bytes'])} ({format_size(r.get('process_non_cache_anon_bytes', 0))} "
            f"anonymous, the rest the libraries' file pages); {r.get('decode_major_faults_per_token', 0):.1f} "
            f"pages a token read from files while decoding (evicted library pages; a new token's embedding row, 1-2)"]
