"""MODEL_DIR as the user gives it -> a Sluice model dir.

A Sluice dir is used as is; a Hugging Face snapshot is repacked once into the user cache (bf16, or
mxfp4 for a checkpoint that ships its experts in MXFP4: copied as they are, not inflated 4x),
and again when the snapshot changes (its shards' sizes and headers, and the hashes of its config, tokenizer and
template files, are compared with the record kept in sluice.json), so a stale repack is never used. The cache heals itself: a cached repack that
fails its checks (manifest, dense checksums, every expert block's CRC32 after it changed on disk), or that
something else replaced, is rebuilt, with its path in the log. One process at a time builds a cache entry (engine.format.locks);
another waits and then uses it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

from engine.errors import SluiceError, fs_errors_as_sentences
from engine.format import locks, modeldir
from engine.format.checkpoint import Checkpoint

log = logging.getLogger("sluice.resolve")


def cached_repack_dir(snapshot: Path) -> Path:
    from platformdirs import user_cache_dir
    digest = hashlib.sha256(str(snapshot.resolve()).encode()).hexdigest()[:12]
    return Path(user_cache_dir("sluice")) / "repacked" / f"{snapshot.name}-{digest}"


def resolve_model_dir(path: Path, progress=None) -> Path:
    if modeldir.is_model_dir(path):
        return path
    if not path.exists():
        raise SluiceError(f"The folder '{path}' does not exist; check the path.")
    if not path.is_dir():
        raise SluiceError(f"'{path}' is a file, not a folder; give the model's folder.")
    if not (path / "config.json").is_file():
        raise SluiceError(f"'{path}' is neither a Sluice model folder nor a Hugging Face model folder (no config.json).")
    from engine.format.repack import repack
    target = cached_repack_dir(path)

    def say(message: str) -> None:
        if progress:
            progress(0, 1, message)

    with fs_errors_as_sentences(target, then="the repacked copy of the model is kept there; run again once it is fixed"):
        target.parent.mkdir(parents=True, exist_ok=True)
        with locks.exclusive(target, f"repacking '{path}' into the cache at '{target}'", say):
            if _cache_is_usable(target, path):
                return target
            return repack(path, target, quant=_native_quant(path), progress=progress)


def _native_quant(snapshot: Path) -> str:
    """mxfp4 for a checkpoint whose experts ship in MXFP4 (gpt-oss: its bytes copied), else bf16."""
    from engine.model.spec import load_config_dict
    method = (load_config_dict(snapshot).get("quantization_config") or {}).get("quant_method")
    return "mxfp4" if method == "mxfp4" else "bf16"


def _cache_is_usable(target: Path, snapshot: Path) -> bool:
    from engine.format.repack import source_record
    """True when `target` is a sound repack of the snapshot as it is now; a stale or damaged one is
    removed (the log names it) so that it is built again."""
    if not target.exists():
        return False
    if not target.is_dir():                   # something replaced the cache entry: build it again in its place
        log.warning("The cached repack at '%s' is not a folder; rebuilding it.", target)
        target.unlink()
        return False
    try:
        recorded = json.loads((target / modeldir.MANIFEST).read_text()).get("source")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if recorded is not None and recorded != source_record(snapshot, Checkpoint(snapshot)):
        log.info("the snapshot %s changed since it was repacked; repacking it again", snapshot)
        shutil.rmtree(target)
        return False
    try:
        modeldir.open_model_dir(target, verify_experts=True)
    except SluiceError as exc:
        log.warning("The cached repack at '%s' is damaged (%s); rebuilding it.", target, str(exc).rstrip("."))
        shutil.rmtree(target)
        return False
    return True
