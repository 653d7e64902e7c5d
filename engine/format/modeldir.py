"""The Sluice model directory: manifest (sluice.json) reading, writing and checking."""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import SluiceError
from engine.format import integrity
from engine.format.config_check import checked_spec
from engine.format.layout import Field, Layout
from engine.format.manifest_schema import FORMAT_VERSION, check_manifest
from engine.model.spec import ModelSpec

MANIFEST = "sluice.json"
DENSE_FILE = "dense.safetensors"
EXPERTS_FILE = "experts.bin"


def build_manifest(name: str, spec: ModelSpec, config: dict, quant: str, layout: Layout,
                   layer_checksums: dict[int, list[int]], dense_tensors: dict, tokenizer_files: list[str],
                   source: dict) -> dict:
    layers, offset = {}, 0
    for layer in spec.moe_layers:
        layers[str(layer)] = {"offset": offset, "block_bytes": layout.block_bytes, "crc32": layer_checksums[layer]}
        offset += layout.block_bytes * spec.num_experts
    return {
        "format": "sluice", "format_version": FORMAT_VERSION, "name": name, "family": spec.family,
        "config": config, "quant": quant,
        "dense": {"file": DENSE_FILE, "tensors": dense_tensors},
        "experts": {"file": EXPERTS_FILE, "num_experts": spec.num_experts, "total_bytes": offset,
                    "layout": [{"name": f.name, "dtype": str(f.dtype).removeprefix("torch."), "shape": list(f.shape),
                                "offset": f.offset, "nbytes": f.nbytes} for f in layout.fields],
                    "intermediate": layout.intermediate, "hidden": layout.hidden, "layers": layers},
        "tokenizer_files": tokenizer_files, "source": source,
    }


@dataclass
class ModelDir:
    path: Path
    manifest: dict
    spec: ModelSpec
    layout: Layout

    @property
    def name(self) -> str:
        return self.manifest.get("name", self.path.name)

    @property
    def quant(self) -> str:
        return self.manifest["quant"]

    def expert_offset(self, layer: int, expert: int) -> int:
        entry = self.manifest["experts"]["layers"][str(layer)]
        return entry["offset"] + expert * entry["block_bytes"]

    def expert_crc32(self, layer: int, expert: int) -> int:
        return self.manifest["experts"]["layers"][str(layer)]["crc32"][expert]

    @property
    def expert_bytes_total(self) -> int:
        return self.manifest["experts"]["total_bytes"]

    @property
    def dense_shapes(self) -> dict[str, list[int]]:
        return {name: t["shape"] for name, t in self.manifest["dense"]["tensors"].items()}

    @property
    def dense_dtypes(self) -> dict[str, str]:
        """Each dense tensor's stored dtype ("BF16", "I64", ...), from the dense file's header."""
        from engine.format.checkpoint import read_header
        header = read_header(self.path / DENSE_FILE)
        return {name: entry["dtype"] for name, entry in header.items() if isinstance(entry, dict) and "dtype" in entry}


def is_model_dir(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def open_model_dir(path: str | Path, verify_experts: bool = False) -> ModelDir:
    """Open a Sluice model dir: schema of sluice.json, files present, checksums of the manifest and
    dense weights (see engine.format.integrity); with `verify_experts` every expert block's CRC32 too
    (for a cached repack, which can be rebuilt when it fails)."""
    p = Path(path)
    manifest = read_manifest(p)
    check_manifest(manifest, p / MANIFEST)
    for name in (DENSE_FILE, EXPERTS_FILE):
        if not (p / name).is_file():
            raise SluiceError(f"'{p}' is missing {name}; repack the model again.")
    if (p / EXPERTS_FILE).stat().st_size < manifest["experts"]["total_bytes"]:
        raise SluiceError(f"'{p / EXPERTS_FILE}' is truncated; repack the model again.")
    integrity.verify_files(p, (lambda d: verify_checksums(d, manifest)) if verify_experts else None)
    spec = checked_spec(manifest["config"], str(p / MANIFEST))
    experts = manifest["experts"]
    if (experts["num_experts"], experts["intermediate"], experts["hidden"], sorted(int(k) for k in experts["layers"])) \
            != (spec.num_experts, spec.expert_intermediate, spec.hidden_size, list(spec.moe_layers)):
        raise SluiceError(f"'{p / MANIFEST}' is damaged (its expert table does not match its config); "
                          "repack the model again.")
    fields = tuple(Field(f["name"], getattr(torch, f["dtype"]), tuple(f["shape"]), f["offset"], f["nbytes"])
                   for f in experts["layout"])
    block_bytes = next(iter(experts["layers"].values()))["block_bytes"] if experts["layers"] else 0
    layout = Layout(manifest["quant"], experts["intermediate"], experts["hidden"], fields, block_bytes)
    if layout.is_gated != spec.has_expert_gate:
        raise SluiceError(f"'{p / MANIFEST}' is damaged (its expert blocks {'have' if layout.is_gated else 'lack'} "
                          "a gate projection, its config's experts do not); repack the model again.")
    return ModelDir(p, manifest, spec, layout)


def read_manifest(p: Path) -> dict:
    """sluice.json of the folder `p`, parsed: a missing folder, file or a damaged one is one sentence."""
    if not p.exists():
        raise SluiceError(f"The folder '{p}' does not exist; check the path or pick the model from the list.")
    if not p.is_dir():
        raise SluiceError(f"'{p}' is a file, not a folder; choose the model's folder.")
    try:
        return json.loads((p / MANIFEST).read_text())
    except FileNotFoundError:
        raise SluiceError(f"'{p}' is not a Sluice model folder (no {MANIFEST}); repack it with `sluice repack`.") from None
    except (ValueError, UnicodeDecodeError):
        raise SluiceError(f"'{p / MANIFEST}' is damaged; repack the model again.") from None
    except OSError as exc:
        raise SluiceError(f"'{p / MANIFEST}' cannot be read ({exc.strerror}); check the folder's permissions.") from None


def verify_checksums(path: Path, manifest: dict) -> None:
    """Read back every expert block and compare its CRC32 (end of repack)."""
    with open(path / EXPERTS_FILE, "rb") as f:
        for layer, entry in manifest["experts"]["layers"].items():
            f.seek(entry["offset"])
            for expert, crc in enumerate(entry["crc32"]):
                if zlib.crc32(f.read(entry["block_bytes"])) != crc:
                    raise SluiceError(f"Expert {expert} of layer {layer} did not read back correctly "
                                      "(checksum mismatch); check the drive and repack again.")
