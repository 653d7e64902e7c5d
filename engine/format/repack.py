"""Hugging Face snapshot -> Sluice model dir (sluice.json, dense.safetensors, experts.bin, tokenizer files).

Resumable: work happens in DST.partial/, and progress.json there records each finished MoE layer
(after its bytes are fsynced) with its CRC32s, and the dense file's sha256, so a restart skips
finished work that still reads back as written and redoes the rest. Atomic: DST appears only by a
rename once everything is written and checked, with checksums.json (engine.format.integrity).
"""
from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import threading
import zlib
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.format import generation_config, integrity, locks, modeldir, ngram
from engine.format.checkpoint import Checkpoint
from engine.format.config_check import check_tensors, checked_spec
from engine.errors import SluiceError, fs_errors_as_sentences
from engine.format.layout import block_layout
from engine.format.quant import FORMATS, quantize
from engine.sizes import format_size
from engine.model.families import FAMILIES
from engine.model.families.deepseek_style import is_beyond_last_layer
from engine.model.spec import ModelSpec, canonical_dense_name, is_text_model_tensor, load_config_dict

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "chat_template.json", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "generation_config.json")
DISK_MARGIN_BYTES = 64 << 20
log = logging.getLogger("sluice.repack")


class RepackCancelled(SluiceError):
    pass


def free_bytes(path: Path) -> int:
    """Free space on the file system holding `path` (or its nearest existing parent)."""
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


class ExpertSource:
    """Per-expert gate/up/down weights from a checkpoint, in Hub layout or v5 fused layout."""
    has_bias = False

    def __init__(self, ckpt: Checkpoint, spec: ModelSpec):
        self.ckpt, self.spec = ckpt, spec
        self._fused: tuple[int, torch.Tensor, torch.Tensor] | None = None

    def _name(self, layer: int, expert: int, proj: str) -> str:
        return self.ckpt.spelling(self.spec.expert_tensor_name(layer, expert, proj))

    def check(self) -> None:
        for layer in self.spec.moe_layers:
            if self._name(layer, 0, "gate") not in self.ckpt and \
                    self.spec.fused_expert_names(layer)[0] not in self.ckpt:
                raise SluiceError(f"The checkpoint has no expert weights for layer {layer}; "
                                  "it is incomplete or not the model its config says.")

    def get(self, layer: int, expert: int) -> dict[str, torch.Tensor]:
        if self._name(layer, expert, "gate") in self.ckpt:
            return {p: self.ckpt.get_float(self._name(layer, expert, p)) for p in ("gate", "up", "down")}
        if self._fused is None or self._fused[0] != layer:
            gate_up_name, down_name = self.spec.fused_expert_names(layer)
            self._fused = (layer, self.ckpt.get_float(gate_up_name), self.ckpt.get_float(down_name))
        _, gate_up, down = self._fused
        gate, up = gate_up[expert].chunk(2, dim=0)
        return {"gate": gate, "up": up, "down": down[expert]}

    def is_expert_tensor(self, name: str) -> bool:
        return ".experts." in name

    def native_parts(self, layer: int, expert: int, quant: str) -> dict[str, torch.Tensor] | None:
        """Block parts copied as stored, when the checkpoint already holds this quant (FP4 experts with e8m0
        scales per 32, as DeepSeek-V4-Flash ships them, are mxfp4 byte for byte); else None."""
        if quant != "mxfp4" or self._name(layer, expert, "gate") not in self.ckpt:
            return None
        parts = {}
        for proj in ("gate", "up", "down"):
            native = self.ckpt.mxfp4_parts(self._name(layer, expert, proj))
            if native is None:
                return None
            parts.update({f"{proj}.{k}": v for k, v in native.items()})
        return parts


def expert_source(ckpt: Checkpoint, spec: ModelSpec):
    if spec.family == "gpt_oss":
        from engine.format.gptoss_experts import GptOssExpertSource
        return GptOssExpertSource(ckpt, spec)
    if FAMILIES[spec.family].module == "llama4":
        from engine.format.llama4_experts import Llama4ExpertSource
        return Llama4ExpertSource(ckpt, spec)
    if spec.family == "nemotron_h":
        from engine.format.nemotron_experts import NemotronExpertSource
        return NemotronExpertSource(ckpt, spec)
    if spec.generic is not None:
        from engine.format.generic_experts import GenericExpertSource
        return GenericExpertSource(ckpt, spec)
    return ExpertSource(ckpt, spec)


def check_source_quantization(config: dict) -> None:
    """Block-FP8 checkpoints (and gpt-oss's MXFP4 experts) are read as they are; other quantized
    formats are refused in one sentence."""
    method = (config.get("quantization_config") or {}).get("quant_method")
    if method == "mxfp4" and config.get("model_type") == "gpt_oss":
        return
    if method not in (None, "fp8"):
        raise SluiceError(f"This checkpoint is quantized with '{method}', which Sluice cannot read; download the "
                          "unquantized (bf16) or FP8 version of the model instead.")


def dense_tensor(ckpt: Checkpoint, name: str) -> torch.Tensor:
    """A dense tensor in its source dtype; block-FP8 weights are stored dequantized in bf16 (exact)."""
    if ckpt.scale_of(name) is not None:
        return ckpt.get_float(name).to(torch.bfloat16)
    return ckpt.get(name)


def repack(src_dir: str | Path, dst_dir: str | Path, quant: str = "bf16", progress=None,
           cancel_event: threading.Event | None = None, display_name: str | None = None) -> Path:
    """Repack; `progress(done, total, message)` is called after each step. Returns dst_dir.

    Everything is checked before anything is written (config values, every tensor and its shape,
    disk space); one process at a time works on a destination (engine.format.locks)."""
    src, dst = Path(src_dir), Path(dst_dir)
    if not src.exists():
        raise SluiceError(f"The folder '{src}' does not exist; choose the folder of a downloaded model.")
    if not src.is_dir():
        raise SluiceError(f"'{src}' is a file, not a folder; choose the folder of a downloaded model.")
    if quant not in FORMATS:
        raise SluiceError(f"Unknown quant format '{quant}': choose one of {', '.join(FORMATS)}.")
    config = load_config_dict(src)
    spec = checked_spec(config, str(src / "config.json"))
    check_source_quantization(config)
    generation_config.read(src, then="fix or delete it, then repack")       # copied below: checked first
    ckpt = Checkpoint(src)
    experts = expert_source(ckpt, spec)
    experts.check()
    check_tensors(spec, ckpt, str(src))
    layout = block_layout(spec.expert_intermediate, spec.hidden_size, quant, bias=experts.has_bias,
                          gated=spec.has_expert_gate)

    def say(message: str) -> None:
        if progress:
            progress(0, len(spec.moe_layers) + 1, message)

    def cancelled():
        raise RepackCancelled("Repack cancelled; start it again to resume where it stopped.")

    with fs_errors_as_sentences(dst, then="then run the repack again: it continues where it stopped"):
        dst.parent.mkdir(parents=True, exist_ok=True)
        with locks.exclusive(dst, f"repacking into '{dst}'", say, cancel_event, cancelled) as waited:
            if waited and _holds_repack_of(dst, ckpt, quant):
                return dst          # the process we waited for made exactly this
            return _repack_locked(src, dst, config, spec, ckpt, experts, layout, quant, progress, cancel_event,
                                  display_name)


def source_record(src: Path, ckpt: Checkpoint) -> dict:
    """What a repack was made from, as the manifest's `source` keeps it: the shards' fingerprint and the sha256 of
    config.json and every tokenizer and template file (an edit to any of them makes a cached repack stale)."""
    names = ["config.json", *TOKENIZER_FILES]
    if (src / "additional_chat_templates").is_dir():
        names += sorted(f"additional_chat_templates/{p.name}" for p in (src / "additional_chat_templates").iterdir())
    meta = {name: integrity.sha256_file(src / name) for name in names if (src / name).is_file()}
    return {"path": str(src.resolve()), "files": ckpt.fingerprint(), "meta": meta}


def _holds_repack_of(dst: Path, ckpt: Checkpoint, quant: str) -> bool:
    try:
        manifest = json.loads((dst / modeldir.MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return manifest.get("quant") == quant and manifest.get("source") == source_record(ckpt.dir, ckpt)


def _repack_locked(src: Path, dst: Path, config: dict, spec: ModelSpec, ckpt: Checkpoint, experts: ExpertSource,
                   layout, quant: str, progress, cancel_event, display_name) -> Path:
    check_destination(dst)
    layer_bytes = spec.num_experts * layout.block_bytes
    dense_names = _dense_names(ckpt, spec, experts)
    dense_bytes = sum(ckpt.nbytes(n) * (2 if ckpt.scale_of(n) else 1) for n in dense_names)
    canonical = functools.partial(canonical_dense_name, spec.family)
    total_bytes = dense_bytes + layer_bytes * len(spec.moe_layers) + ngram.table_bytes(spec, ckpt.names(), ckpt.nbytes,
                                                                                       canonical)

    work = dst.with_name(dst.name + ".partial")
    state = _load_state(work, ckpt, quant, layer_bytes, layout.block_bytes, spec)
    done_bytes = layer_bytes * len(state["layers"]) + (dense_bytes if state["dense"] else 0)
    needed = total_bytes - done_bytes + DISK_MARGIN_BYTES
    available = free_bytes(work)
    if available < needed:
        raise SluiceError(f"Not enough disk space to repack: {format_size(needed)} needed, {format_size(available)} "
                          f"free on the destination drive; free some space or choose another destination.")
    work.mkdir(parents=True, exist_ok=True)
    total_steps = len(spec.moe_layers) + 1

    def report(message: str) -> None:
        if progress:
            progress(len(state["layers"]) + int(bool(state["dense"])), total_steps, message)

    if not state["dense"]:
        _write_dense(work, ckpt, spec, dense_names, state)
    report("dense weights written")

    _write_experts(work, spec, experts, layout, quant, state, cancel_event, report)
    ngram_files = ngram.repack_tables(work, ckpt.names(), lambda n: dense_tensor(ckpt, n), spec, canonical) \
        + ngram.repack_mtp(work, ckpt.names(), lambda n: dense_tensor(ckpt, n), spec)

    tokenizer_files = _copy_tokenizer(src, work)
    manifest = modeldir.build_manifest(
        name=display_name or src.name, spec=spec, quant=quant, layout=layout,
        config={k: v for k, v in config.items() if k != "quantization_config"},   # weights are plain now
        layer_checksums={int(k): v for k, v in state["layers"].items()},
        dense_tensors=_dense_shapes(work, ckpt, spec, dense_names),
        tokenizer_files=tokenizer_files, source=source_record(src, ckpt))
    manifest[integrity.MANIFEST_RECORD] = integrity.integrity_record(manifest, state["dense"])
    _finish(work, dst, manifest, state, ngram_files)
    report("done")
    return dst


def _dense_names(ckpt: Checkpoint, spec: ModelSpec, experts: ExpertSource) -> list[str]:
    """The checkpoint's tensors dense.safetensors holds: not experts, scales, a vision tower, the layers after the
    last decoder layer (multi-token prediction: DeepSeek-V3, GLM; not used to decode) or PLE tables (ngram.bin)."""
    scales = {ckpt.scale_of(n) for n in ckpt.names()} - {None}

    def is_dense(n: str) -> bool:
        return (not experts.is_expert_tensor(n) and n not in scales and is_text_model_tensor(spec.family, n)
                and not is_beyond_last_layer(n, spec.num_layers)
                and not ngram.is_table(spec, canonical_dense_name(spec.family, n)))
    return [n for n in ckpt.names() if is_dense(n)]


def _finish(work: Path, dst: Path, manifest: dict, state: dict, ngram_files: tuple[str, ...]) -> None:
    """Verify what was written, write sluice.json and the checksums, and move the folder into place."""
    modeldir.verify_checksums(work, manifest)
    if integrity.sha256_file(work / modeldir.DENSE_FILE) != state["dense"]:
        state["dense"] = False        # changed on disk since it was written: the next run writes it again
        _save_state(work, state)
        raise SluiceError(f"'{work / modeldir.DENSE_FILE}' did not read back as written; check the drive and "
                          "run the repack again.")
    (work / modeldir.MANIFEST).write_text(json.dumps(manifest, indent=1))
    integrity.write_checksums(work, {modeldir.DENSE_FILE: state["dense"]}, (modeldir.MANIFEST, *ngram_files))
    (work / "progress.json").unlink()
    if dst.exists():
        dst.rmdir()
    os.replace(work, dst)


def check_destination(dst: Path) -> None:
    """A new or empty folder, never one holding a model."""
    if (dst / modeldir.MANIFEST).exists():
        raise SluiceError(f"'{dst}' already holds a Sluice model; choose another destination or delete it first.")
    if dst.exists() and not dst.is_dir():
        raise SluiceError(f"'{dst}' is a file, not a folder; choose a new or empty destination folder.")
    if dst.exists() and any(dst.iterdir()):
        raise SluiceError(f"'{dst}' is not empty; choose a new or empty destination folder.")


def _write_dense(work: Path, ckpt: Checkpoint, spec: ModelSpec, dense_names: list[str], state: dict) -> None:
    """dense.safetensors under the canonical names, synced; its hash marks it done in the progress state."""
    if spec.generic is not None:          # transformers' names, tensors merged where its loader merges them
        from engine.format.generic_dense import GenericDense
        tensors = GenericDense(spec, dense_names).tensors(lambda n: dense_tensor(ckpt, n))
        tensors = {name: t.contiguous() for name, t in tensors.items()}
    else:
        tensors = {canonical_dense_name(spec.family, n): dense_tensor(ckpt, n).contiguous() for n in dense_names}
    save_file(tensors, str(work / modeldir.DENSE_FILE), metadata={"format": "pt"})
    _fsync(work / modeldir.DENSE_FILE)
    state["dense"] = integrity.sha256_file(work / modeldir.DENSE_FILE)
    _save_state(work, state)


def _dense_shapes(work: Path, ckpt: Checkpoint, spec: ModelSpec, dense_names: list[str]) -> dict:
    """The manifest's dense table: canonical name -> shape (a generic family's as written: some are merged)."""
    if spec.generic is None:
        return {canonical_dense_name(spec.family, n): {"shape": list(ckpt.shape(n))} for n in dense_names}
    from engine.format.checkpoint import read_header
    header = read_header(work / modeldir.DENSE_FILE)
    return {name: {"shape": entry["shape"]} for name, entry in header.items() if name != "__metadata__"}


def _copy_tokenizer(src: Path, work: Path) -> list[str]:
    """Copies the tokenizer and chat-template files the snapshot has; returns their names."""
    names = [name for name in TOKENIZER_FILES if (src / name).is_file()]
    for name in names:
        shutil.copy2(src / name, work / name)
    return names


def _write_experts(work: Path, spec: ModelSpec, experts: ExpertSource, layout, quant: str, state: dict,
                   cancel_event, report) -> None:
    """experts.bin, layer by layer (fsynced, its block CRCs recorded in the resume state after each layer):
    a rerun skips the layers already done."""
    layer_bytes = spec.num_experts * layout.block_bytes
    experts_path = work / modeldir.EXPERTS_FILE
    fd = os.open(experts_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, layer_bytes * len(spec.moe_layers))
        for index, layer in enumerate(spec.moe_layers):
            if str(layer) in state["layers"]:
                continue
            checksums = []
            for expert in range(spec.num_experts):
                if cancel_event is not None and cancel_event.is_set():
                    raise RepackCancelled("Repack cancelled; start it again to resume where it stopped.")
                parts = experts.native_parts(layer, expert, quant) or quantized_parts(experts.get(layer, expert), quant)
                block = layout.pack(parts).numpy()
                os.pwrite(fd, block, index * layer_bytes + expert * layout.block_bytes)
                checksums.append(zlib.crc32(block))
            os.fsync(fd)
            state["layers"][str(layer)] = checksums
            _save_state(work, state)
            report(f"layer {layer} repacked")
    finally:
        os.close(fd)


def quantized_parts(weights: dict[str, torch.Tensor], quant: str) -> dict[str, torch.Tensor]:
    """gate/up/down quantized to `quant`; expert biases (gate_bias, ...) kept as float32."""
    parts = {}
    for proj, w in weights.items():
        if proj.endswith("_bias"):
            parts[f"{proj}.b"] = w.float()
        else:
            parts.update({f"{proj}.{k}": v for k, v in quantize(w, quant).items()})
    return parts


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _load_state(work: Path, ckpt: Checkpoint, quant: str, layer_bytes: int, block_bytes: int,
                spec: ModelSpec) -> dict:
    """The progress of an unfinished repack in `work`, keeping only what still reads back as written:
    finished layers whose blocks fail their CRC32, or dense weights that changed, are done again."""
    fresh = {"source": ckpt.fingerprint(), "quant": quant, "dense": False, "layers": {}}
    path = work / "progress.json"
    if not path.is_file():
        if work.exists():
            shutil.rmtree(work)
        return fresh
    try:
        state = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        state = None
    if not isinstance(state, dict) or state.get("source") != fresh["source"] or state.get("quant") != quant \
            or not isinstance(state.get("layers"), dict):
        shutil.rmtree(work)   # different source or quant: the partial work does not apply
        return fresh
    dense = work / modeldir.DENSE_FILE
    if state.get("dense") and (not isinstance(state["dense"], str) or not dense.is_file()
                               or integrity.sha256_file(dense) != state["dense"]):
        log.warning("the dense weights of the unfinished repack in %s did not read back; writing them again", work)
        state["dense"] = False
    for layer in list(state["layers"]):
        if not _layer_reads_back(work / modeldir.EXPERTS_FILE, spec, layer, state["layers"][layer], layer_bytes,
                                 block_bytes):
            log.warning("layer %s of the unfinished repack in %s did not read back; repacking it again", layer, work)
            del state["layers"][layer]
    return state


def _layer_reads_back(path: Path, spec: ModelSpec, layer: str, checksums, layer_bytes: int, block_bytes: int) -> bool:
    if not layer.isdigit() or int(layer) not in spec.moe_layers or not isinstance(checksums, list) \
            or len(checksums) != spec.num_experts:
        return False
    offset = spec.moe_layers.index(int(layer)) * layer_bytes
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return all(zlib.crc32(f.read(block_bytes)) == crc for crc in checksums)
    except OSError:
        return False


def _save_state(work: Path, state: dict) -> None:
    tmp = work / "progress.json.tmp"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, work / "progress.json")
