"""Checksums of a model dir's manifest and dense weights, written at repack and verified at load.

checksums.json  {file: sha256}, written once the files are final (experts.bin has per-block CRC32s in
                the manifest instead, checked by the store as blocks are read).
sluice.json     its `integrity` record repeats the dense file's sha256 and holds the digest of the rest of
                the manifest: a model dir that lost checksums.json is still checked.
.verified.json  {file: {sha256, size, mtime_ns, ctime_ns}} for the last successful verification, so a
                file is hashed in full on the first load and again only when it changed on disk (the
                inode change time also moves when mtime is set back by hand). Best effort: a read-only
                model dir is verified on every load.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from engine.errors import SluiceError

CHECKSUMS_FILE = "checksums.json"
MANIFEST_FILE = "sluice.json"            # engine.format.modeldir's names, repeated: modeldir imports this module
DENSE_FILE = "dense.safetensors"
MANIFEST_RECORD = "integrity"            # the manifest's key for integrity_record()
STAMP_FILE = ".verified.json"
CHUNK_BYTES = 8 << 20
log = logging.getLogger("sluice.integrity")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _stat_key(path: Path) -> dict:
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def write_checksums(model_dir: Path, known: dict[str, str], names: tuple[str, ...]) -> None:
    """Record sha256 sums: `known` ones (taken when the file was written) and those of `names`,
    computed now (the last step of a repack, before the rename)."""
    sums = {**known, **{name: sha256_file(model_dir / name) for name in names}}
    _write_json(model_dir / CHECKSUMS_FILE, sums)


def verify_files(model_dir: Path, extra_check=None) -> None:
    """Raise SluiceError naming the first file that no longer matches its recorded checksum.

    `extra_check(model_dir)` (optional) is one more full check run under the same stamp, e.g. the
    expert blocks of a cached repack. A model dir repacked before checksums existed is accepted
    with a log line."""
    try:
        sums = json.loads((model_dir / CHECKSUMS_FILE).read_text())
    except FileNotFoundError:
        sums = _sums_from_manifest(model_dir)
        if sums is None:
            log.info("%s has no %s (repacked by an older Sluice): not verified", model_dir, CHECKSUMS_FILE)
            return
    except (OSError, ValueError) as exc:
        raise SluiceError(f"'{model_dir / CHECKSUMS_FILE}' is damaged ({exc}); repack the model again.") from None
    if not isinstance(sums, dict) or not all(isinstance(v, str) for v in sums.values()):
        raise SluiceError(f"'{model_dir / CHECKSUMS_FILE}' is damaged; repack the model again.")
    stamp = _read_stamp(model_dir)
    fresh = {}
    for name, expected in sums.items():
        path = model_dir / name
        try:
            key = _stat_key(path)
        except FileNotFoundError:
            raise SluiceError(f"'{path}' is missing; repack the model again.") from None
        if stamp.get(name) == {"sha256": expected, **key}:
            fresh[name] = stamp[name]
            continue
        if sha256_file(path) != expected:
            raise SluiceError(f"'{path}' does not match the checksum written when the model was repacked "
                              "(it was changed or damaged); repack the model again.")
        fresh[name] = {"sha256": expected, **key}
    if extra_check is not None:
        key = {"sha256": "extra", **_stat_key(model_dir / "experts.bin")}
        if stamp.get("experts.bin") != key:
            extra_check(model_dir)
        fresh["experts.bin"] = key
    if fresh != stamp:
        try:
            _write_json(model_dir / STAMP_FILE, fresh)
        except OSError as exc:
            log.info("cannot record the verification in %s: %s", model_dir, exc)


def manifest_digest(manifest: dict) -> str:
    """sha256 of the manifest without its own `integrity` record (canonical JSON: key order does not count)."""
    body = {k: v for k, v in manifest.items() if k != MANIFEST_RECORD}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def integrity_record(manifest: dict, dense_sha256: str) -> dict:
    """The manifest's own copy of what checksums.json holds, for a model dir that lost checksums.json."""
    return {"manifest_sha256": manifest_digest(manifest), "dense_sha256": dense_sha256}


def _sums_from_manifest(model_dir: Path) -> dict | None:
    """Without checksums.json: the manifest checked against its own digest, and the dense file's sum it records
    (None for a manifest without the record, written by an older Sluice)."""
    path = model_dir / MANIFEST_FILE
    manifest = json.loads(path.read_text())            # the caller has read and checked it already
    record = manifest.get(MANIFEST_RECORD)
    if record is None:
        return None
    if not isinstance(record, dict) or record.get("manifest_sha256") != manifest_digest(manifest) \
            or not isinstance(record.get("dense_sha256"), str):
        raise SluiceError(f"'{path}' was changed since the model was repacked (it no longer matches its own "
                          "checksum); repack the model again.")
    return {DENSE_FILE: record["dense_sha256"]}


def _read_stamp(model_dir: Path) -> dict:
    try:
        stamp = json.loads((model_dir / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return stamp if isinstance(stamp, dict) else {}


def _write_json(path: Path, value) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=1))
    os.replace(tmp, path)
