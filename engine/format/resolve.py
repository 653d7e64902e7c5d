"""MODEL_DIR as the user gives it -> a Sluice model dir.

A Sluice dir is used as is; a Hugging Face snapshot is repacked (bf16) once into the user cache,
and again when the snapshot changes (its shards' sizes and headers are compared with the record
kept in sluice.json), so a stale repack is never used.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from engine.format import modeldir
from engine.format.checkpoint import Checkpoint
from engine.errors import SluiceError


def cached_repack_dir(snapshot: Path) -> Path:
    from platformdirs import user_cache_dir
    digest = hashlib.sha256(str(snapshot.resolve()).encode()).hexdigest()[:12]
    return Path(user_cache_dir("sluice")) / "repacked" / f"{snapshot.name}-{digest}"


def resolve_model_dir(path: Path, progress=None) -> Path:
    if modeldir.is_model_dir(path):
        return path
    if not path.exists():
        raise SluiceError(f"The folder '{path}' does not exist; check the path.")
    if not (path / "config.json").is_file():
        raise SluiceError(f"'{path}' is neither a Sluice model folder nor a Hugging Face model folder (no config.json).")
    from engine.format.repack import repack
    target = cached_repack_dir(path)
    if modeldir.is_model_dir(target):
        recorded = json.loads((target / modeldir.MANIFEST).read_text()).get("source", {}).get("files")
        if recorded == Checkpoint(path).fingerprint():
            return target
        shutil.rmtree(target)          # the snapshot changed since it was repacked
    return repack(path, target, quant="bf16", progress=progress)
