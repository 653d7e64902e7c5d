"""The benchmark matrix's plan (issue 37), plain Python over configs and recorded results: the families and
their presets, a layer subset where the files would not fit the disk, each memory regime scaled to the
family's size, llama-bench's -ncmoe points around a VRAM limit, and the table of the results.
bench/stages/matrix.py runs it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from engine.errors import SluiceError
from engine.sizes import parse_size

from bench.regimes import Regime

Q8_0_BYTES = 34 / 32            # llama.cpp's Q8_0: 32 int8 weights and an fp16 scale
MXFP4_BYTES = 17 / 32           # MXFP4 (gpt-oss experts, kept as they are by the converter): 32 nibbles + a scale
RESERVED_DISK_BYTES = 8 * 10**9       # the system, the venv and wheels, llama.cpp's build, logs
# llama.cpp's VRAM besides the weights (CUDA context, KV and compute buffers at a 512-token prompt): OLMoE's
# -ncmoe 10 showed 3.97 GB for 3.08 GB of weights on the GPU
LLAMA_VRAM_OVERHEAD_BYTES = 8 * 10**8
REFERENCE_PRESET = "olmoe-1b-7b"      # the regimes' sizes are this model's (bench/regimes.py)


@dataclass(frozen=True)
class Family:
    name: str
    preset: str
    quant: str                    # Sluice's experts: int8 against llama.cpp's Q8_0; mxfp4 where the GGUF keeps mxfp4
    full_layers: int              # the released model's layers
    no_gguf: str | None = None    # why llama.cpp's converter cannot take the bench's checkpoint (None: it can)
    peer_layers: tuple[int, ...] | None = None     # the layer counts llama.cpp loads this family at (None: any)
    # decode tokens at least: where a cold prompt's background reads (the RAM cache's fill, n-gram tables read
    # whole) outlast NEW_TOKENS' decode, a short run measures those reads, not the decode
    min_new_tokens: int = 0


FAMILIES = {f.name: f for f in (
    Family("olmoe", "olmoe-1b-7b", "int8", 16),
    Family("qwen3-30b-a3b", "qwen3-30b-a3b", "int8", 48),
    Family("gpt-oss-120b", "gpt-oss-120b", "mxfp4", 36),
    Family("gpt-oss-20b", "gpt-oss-20b", "mxfp4", 24),
    Family("qwen3.5-35b-a3b", "qwen3.5-35b-a3b", "int8", 40),
    # llama.cpp reads a DeepSeek-V2 without q LoRA only at 26 or 27 layers (src/models/deepseek2.cpp's is_lite)
    Family("deepseek-v2-lite", "deepseek-v2-lite", "int8", 27, peer_layers=(26, 27)),
    Family("glm-4.5-air", "glm-4.5-air", "int8", 46),
    # no peer, so the experts' format is the families stage's (the released model's experts are fp4)
    Family("deepseek-v4-flash", "deepseek-v4-flash-4l", "mxfp4", 43,
           no_gguf="llama.cpp's DeepSeek-V4 converter reads the released checkpoint's own config names "
                   "(num_hash_layers, compress_ratios) and tensors, not transformers' that the bench writes"),
    Family("qwen3.8-flash-next", "qwen3.8-flash-next-4l", "int8", 48, min_new_tokens=256),   # ~19 GB read behind
)}
NEW_TOKENS = {"fits-ram": 128, "fits-vram-ram": 64, "exceeds": 32}     # as BENCHMARKS.md's regime rows
PROMPT_TOKENS = 512


def families(names: list[str]) -> list[Family]:
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise SluiceError(f"Unknown family {', '.join(unknown)}: choose among {', '.join(FAMILIES)}.")
    return [FAMILIES[n] for n in names or FAMILIES]


# ---- files on disk -------------------------------------------------------------------------------------------

# How the two engines' files share the disk. SAME: one HF checkpoint, repacked for Sluice and converted to the GGUF
# (the same weights). SEPARATE: the checkpoint converted, then deleted, and Sluice's model written directly (the
# same shapes and formats, another random draw), where the three copies would not fit. ALONE: Sluice only.
SAME, SEPARATE, ALONE = "same", "separate", "alone"


@dataclass(frozen=True)
class Files:
    """Estimated bytes of a preset's files: its HF checkpoint (bf16; gpt-oss's experts in mxfp4 as released),
    Sluice's model folder (repacked from it, or written directly) and llama.cpp's GGUF."""
    hf_bytes: int
    sluice_bytes: int
    gguf_bytes: int
    gguf_expert_bytes: int        # of gguf_bytes, the routed experts (what -ncmoe moves to the CPU)
    gguf_host_bytes: int = 0      # of gguf_bytes, what llama.cpp keeps on the CPU at any -ngl: the token embeddings
                                  # and Flash-Next's n-gram table (input-layer tensors, read by row)

    def peak(self, layout: str) -> int:
        """The most bytes on the disk at once."""
        if layout == SAME:
            return self.hf_bytes + self.sluice_bytes + self.gguf_bytes
        if layout == SEPARATE:
            return self.gguf_bytes + max(self.hf_bytes, self.sluice_bytes)
        return self.sluice_bytes


def file_bytes(config: dict, quant: str) -> Files:
    from engine.plan.estimate import expert_block_bytes, model_shape, ngram_file_bytes
    shape = model_shape(config)
    num_blocks = shape.num_moe_layers * shape.num_experts
    expert_params = num_blocks * shape.expert_params
    ngram_params = shape.ngram_rows * shape.ngram_row_dim
    dense_params = shape.dense_params
    expert_elem = MXFP4_BYTES if shape.family == "gpt_oss" else None
    gguf_experts = int(expert_params * (expert_elem or Q8_0_BYTES))
    # the converter quantizes the n-gram table too, where its rows split into Q8_0 blocks (else F16)
    gguf_ngram = int(ngram_params * (Q8_0_BYTES if shape.ngram_row_dim % 32 == 0 else 2))
    return Files(hf_bytes=int(dense_params * 2 + ngram_params * 2 + expert_params * (expert_elem or 2)),
                 sluice_bytes=dense_params * 2 + ngram_file_bytes(shape, 2) + num_blocks * expert_block_bytes(shape, quant),
                 gguf_bytes=int(dense_params * Q8_0_BYTES) + gguf_ngram + gguf_experts,
                 gguf_expert_bytes=gguf_experts,
                 gguf_host_bytes=int(shape.embedding_params * Q8_0_BYTES) + gguf_ngram)


# ---- the preset, a layer subset where the files would not fit --------------------------------------------------

@dataclass(frozen=True)
class Planned:
    family: Family
    preset: str                   # the family's preset, or a subset of its layers registered under a new name
    config: dict                  # the preset's entry (engine.tools.presets.PRESETS)
    num_layers: int
    preset_layers: int            # the family preset's own layers (fewer than the released model's for some)
    num_moe_layers: int
    files: Files
    layout: str                   # SAME, SEPARATE or ALONE
    disk_limit_bytes: int
    peer_left_out: bool = False   # the peer was asked for, but its files would not fit (ALONE)

    @property
    def fits(self) -> bool:
        return self.files.peak(self.layout) <= self.disk_limit_bytes - RESERVED_DISK_BYTES

    @property
    def model_bytes(self) -> int:
        """What the regimes scale with: the GGUF where the peer runs, else Sluice's model (about the same bytes at
        int8 against Q8_0)."""
        return self.files.sluice_bytes if self.layout == ALONE else self.files.gguf_bytes

    @property
    def is_subset(self) -> bool:
        return self.num_layers < self.family.full_layers

    def layers_note(self) -> str:
        """Which layers run, and why fewer than the released model's."""
        if not self.is_subset:
            return f"all {self.num_layers} layers"
        why = (f"the files of more would not fit a {self.disk_limit_bytes / 1e9:.0f} GB disk"
               if self.num_layers < self.preset_layers else f"the preset {self.family.preset}'s subset")
        return f"{self.num_layers} of {self.family.full_layers} layers ({why})"

    def layout_note(self) -> str:
        if self.layout == SEPARATE:
            return ("llama.cpp runs another random draw of the same shapes: one checkpoint, its repack and its GGUF "
                    f"would not fit a {self.disk_limit_bytes / 1e9:.0f} GB disk")
        return ""


def _text(entry: dict) -> dict:
    return entry["text_config"] if "text_config" in entry else entry


def with_layers(entry: dict, num_layers: int) -> dict:
    """A preset's entry with its first `num_layers` layers (the nested text config's, where it has one)."""
    if "text_config" in entry:
        return {**entry, "text_config": {**entry["text_config"], "num_hidden_layers": num_layers}}
    return {**entry, "num_hidden_layers": num_layers}


def _config(entry: dict) -> dict:
    """A preset entry's config, as engine.tools.presets.preset_config builds it."""
    from transformers import AutoConfig
    kw = dict(entry)
    return AutoConfig.for_model(kw.pop("model_type"), **kw).to_dict()


def plan_family(family: Family, presets: dict, disk_limit_bytes: int, with_peer: bool) -> Planned:
    """Where the peer runs: the family's preset on one checkpoint for both engines, or the most of its layers whose
    files fit the disk (in steps of its attention schedule's period). A preset whose layers are fixed (an explicit
    layer schedule, or a count llama.cpp requires) runs the peer on a separate draw where that fits, else Sluice
    alone. A subset is named PRESET-Nl; the caller registers its entry among the presets."""
    from engine.plan.estimate import model_shape
    entry = presets[family.preset]

    def planned(name: str, e: dict, layout: str, peer_left_out: bool = False) -> Planned:
        config = _config(e)
        shape = model_shape(config)
        return Planned(family, name, e, shape.num_layers, _text(entry)["num_hidden_layers"], shape.num_moe_layers,
                       file_bytes(config, family.quant), layout, disk_limit_bytes, peer_left_out)

    if not with_peer or family.no_gguf:
        return planned(family.preset, entry, ALONE)
    full = planned(family.preset, entry, SAME)
    if full.fits:
        return full
    if "layer_types" in _text(entry) or family.peer_layers:
        separate = replace(full, layout=SEPARATE)
        return separate if separate.fits else replace(full, layout=ALONE, peer_left_out=True)
    step = _text(entry).get("full_attention_interval", 1)
    subset = lambda k: planned(f"{family.preset}-{k * step}l", with_layers(entry, k * step), SAME)   # noqa: E731
    low, high = 2, full.num_layers // step - 1          # in steps: the fewest kept, the most that might fit
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if subset(mid).fits else (low, mid - 1)
    return subset(low)


# ---- regimes and the peer's points -----------------------------------------------------------------------------

def scaled_regime(r: Regime, model_bytes: int, reference_bytes: int) -> Regime:
    """Regime `r` for a model of `model_bytes`: its memory cap and VRAM budget scaled by the model's size over the
    reference's (OLMoE's), so each regime holds the same share of the model as it does of OLMoE (rounded up to
    256 MiB)."""
    factor = model_bytes / reference_bytes
    if abs(factor - 1) < 0.01:
        return r
    step = 256 << 20
    up = lambda n: max(step, -(-int(n * factor) // step) * step)         # noqa: E731
    return replace(r, memory_cap_bytes=up(r.memory_cap_bytes) if r.memory_cap_bytes else None,
                   vram_budget=f"{up(parse_size(r.vram_budget)) / 2**30:g}GiB",
                   summary=f"{r.summary}, scaled by {factor:.2f} to this model's size")


def ncmoe_points(files: Files, num_layers: int, num_moe_layers: int, vram_limit_bytes: int,
                 exceeds: bool = False) -> tuple[int, ...]:
    """-ncmoe values to sweep: the fewest CPU layers whose predicted VRAM (dense weights but the host's, the GPU
    layers' experts, llama.cpp's buffers) fits the limit, one fewer (the prediction is rough) and two more, and every layer on the
    CPU; in `exceeds` only the fitting one and every layer (each run there takes its whole timeout)."""
    per_layer = files.gguf_expert_bytes / max(num_moe_layers, 1)
    fixed = files.gguf_bytes - files.gguf_expert_bytes - files.gguf_host_bytes + LLAMA_VRAM_OVERHEAD_BYTES
    on_gpu = min(num_moe_layers, max(0, int((vram_limit_bytes - fixed) // per_layer)))
    fit = num_layers - on_gpu
    around = (fit,) if exceeds else (fit - 1, fit, fit + 1, fit + 2)
    return tuple(sorted({n for n in around if 0 <= n <= num_layers} | {num_layers}))


def sluice_vram_at(peer_best: dict | None, regime_vram: str) -> str:
    """fits-vram-ram: Sluice's VRAM budget is the driver-view VRAM of llama.cpp's fastest point within the
    regime's budget (the two then compare at equal VRAM); without one, the regime's budget."""
    if peer_best and peer_best.get("vram_driver_bytes"):
        return str(peer_best["vram_driver_bytes"])
    return regime_vram


# ---- the table -------------------------------------------------------------------------------------------------

COLUMNS = ("family (layers)", "regime", "Sluice decode tok/s: steady / first reply (VRAM)",
           "llama.cpp decode (-ncmoe, VRAM)", "ratio (steady)", "prefill warm / cold vs llama.cpp pp",
           "efficiency (steady / first)", "where the first reply's time goes")


def _gib(n: int | None) -> str:
    return f"{n / 2**30:.2f} GiB" if n else "VRAM n/a"


def wait_cell(r: dict) -> str:
    """The larger wait of a decode token (at the layers' syncs, for disk reads) against its time, and the experts
    the CPU computed a token."""
    token_ms = r["decode_s_per_token"] * 1e3
    waits = {"reads": r.get("decode_read_wait_s_per_token", 0), "syncs": r.get("decode_sync_wait_s_per_token", 0)}
    name = max(waits, key=waits.get)
    cpu = (r.get("decode_cpu_per_token") or {}).get("experts", 0)
    return f"{name} {waits[name] * 1e3:.1f} of {token_ms:.1f} ms; CPU {cpu:.1f} experts a token"


def _peer_cells(cell: dict) -> tuple[str, str, str]:
    """(llama.cpp's decode, the ratio, its pp) for a cell."""
    peer = cell.get("peer") or {}
    if "not_run" in peer:
        return f"not run ({peer['not_run']})", "n/a", ""
    best, x = peer.get("best"), peer.get("ratio", {})
    if best:
        decode = f"{best['decode_tok_s']:.2f} (-ncmoe {best['ncmoe']}, {_gib(best['vram_driver_bytes'])})"
    else:
        bounds = [r["decode_tok_s_below"] for r in peer.get("runs", []) if r.get("decode_tok_s_below")]
        decode = f"< {max(bounds):.2f} (timed out)" if bounds else "none within the VRAM"
    ratio = (f"{x['decode']:.2f}x" if "decode" in x else f">= {x['decode_at_least']:.1f}x" if "decode_at_least" in x
             else "n/a")
    pp = max((r["prefill_tok_s"] for r in peer.get("runs", []) if r.get("prefill_tok_s")), default=None)
    return decode, ratio, f" vs {pp:.0f}" if pp else ""


def table_rows(matrix: dict) -> list[list[str]]:
    rows = []
    for name, fam in matrix["families"].items():
        for regime_name, cell in fam["regimes"].items():
            label = f"{name} ({fam['layers']}/{fam['full_layers']})"
            s = cell.get("sluice") or {}
            if "decode_tok_s" not in s:
                rows.append([label, regime_name, f"failed: {s.get('error', 'not run')[:60]}", *[""] * 5])
                continue
            decode, ratio, pp = _peer_cells(cell)
            warm = s.get("warm_prefill_tok_s")
            prefill = f"{warm:.0f} / {s['prefill_tok_s']:.0f}{pp}" if warm else f"- / {s['prefill_tok_s']:.0f}{pp}"
            paced = f", copies paced to {s['copy_pacing']['rate_gbps']:g} GB/s" if s.get("copy_pacing") else ""
            st = s.get("steady_decode")
            steady = f"{st['tok_s']:.2f} / " if st else "- / "
            sluice = f"{steady}{s['decode_tok_s']:.2f} ({_gib(s.get('vram_driver_bytes'))}{paced})"
            efficiency = f"{st['efficiency']:.2f} / " if st else "- / "
            rows.append([label, regime_name, sluice, decode,
                         ratio, prefill, f"{efficiency}{s['decode_efficiency']:.2f}", wait_cell(s)])
    return rows


def format_table(matrix: dict) -> str:
    """The matrix as a markdown table, then what its rows leave out: layer subsets, peers not run."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(matrix)]
    for name, fam in matrix["families"].items():
        lines.append(f"{name}: preset {fam['preset']}, {fam['layers_note']}"
                     + (f"; {fam['layout_note']}" if fam.get("layout_note") else ""))
    return "\n".join(lines)
