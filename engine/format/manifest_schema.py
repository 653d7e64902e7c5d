"""The declared schema of sluice.json, checked at load so an edited or damaged manifest is one sentence,
never a KeyError deep in the engine or a silently wrong answer.

The schema is data: a dict maps keys to a type, a nested dict, or a list of one item schema.
Cross-field facts (the layout matches the quant, one checksum per expert, layers back to back) are
checked after the shapes, in `check_manifest`.
"""
from __future__ import annotations

from pathlib import Path

from engine.errors import SluiceError

FORMAT_VERSION = 1      # of sluice.json and its files: bumped when an older reader would misread them
_INT, _STR, _DICT, _NUMBER = int, str, dict, (int, float)

FIELD_SCHEMA = {"name": _STR, "dtype": _STR, "shape": [_INT], "offset": _INT, "nbytes": _INT}
LAYER_SCHEMA = {"offset": _INT, "block_bytes": _INT, "crc32": [_INT]}
SCHEMA = {
    "format": _STR,
    "format_version": _INT,
    "name": _STR,
    "family": _STR,
    "config": _DICT,
    "quant": _STR,
    "dense": {"file": _STR, "tensors": _DICT},
    "experts": {"file": _STR, "num_experts": _INT, "total_bytes": _INT, "layout": [FIELD_SCHEMA],
                "intermediate": _INT, "hidden": _INT, "layers": _DICT},
    "tokenizer_files": [_STR],
    "source": _DICT,
}


def _fail(where: Path, what: str):
    raise SluiceError(f"'{where}' is damaged ({what}); repack the model again.")


def _check(value, schema, key: str, where: Path) -> None:
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            _fail(where, f"'{key}' is not an object")
        for name, sub in schema.items():
            if name not in value:
                _fail(where, f"'{key}.{name}' is missing" if key else f"'{name}' is missing")
            _check(value[name], sub, f"{key}.{name}" if key else name, where)
    elif isinstance(schema, list):
        if not isinstance(value, list):
            _fail(where, f"'{key}' is not a list")
        for i, item in enumerate(value):
            _check(item, schema[0], f"{key}[{i}]", where)
    elif isinstance(value, bool) or not isinstance(value, schema):
        names = schema.__name__ if isinstance(schema, type) else "number"
        _fail(where, f"'{key}' is {value!r}, not a {names}")
    elif schema is _INT and value < 0:
        _fail(where, f"'{key}' is negative")


def check_manifest(manifest, where: Path) -> None:
    """Raise SluiceError (naming `where` and the bad field) unless `manifest` follows the schema."""
    from kernels.quant_formats import FORMATS
    _check(manifest, SCHEMA, "", where)
    if manifest["format"] != "sluice" or manifest["format_version"] != FORMAT_VERSION:
        raise SluiceError(f"'{where.parent}' was made by another Sluice version (format "
                          f"{manifest.get('format_version')}); repack the model again.")
    if manifest["quant"] not in FORMATS:
        _fail(where, f"unknown quant '{manifest['quant']}'")
    experts = manifest["experts"]
    if experts["num_experts"] < 1 or experts["intermediate"] < 1 or experts["hidden"] < 1:
        _fail(where, "the expert sizes are zero")
    expected = _expected_layout(manifest, where)
    offset = 0
    for layer, entry in sorted(experts["layers"].items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else -1):
        _check_layer(layer, entry, offset, expected.block_bytes, experts["num_experts"], where)
        offset += entry["block_bytes"] * experts["num_experts"]
    if offset != experts["total_bytes"]:
        _fail(where, f"'experts.total_bytes' is {experts['total_bytes']}, the layers add up to {offset}")


def _expected_layout(manifest: dict, where: Path):
    """The block layout the manifest's quant and sizes imply, checked against the one it declares (gated or not
    as it declares: the model dir's load checks that against the config)."""
    from engine.format.layout import FAMILIES_WITH_EXPERT_BIAS, block_layout
    from kernels.formats import is_gated
    experts = manifest["experts"]
    gated = is_gated(f["name"] for f in experts["layout"])
    try:
        expected = block_layout(experts["intermediate"], experts["hidden"], manifest["quant"],
                                bias=manifest.get("family") in FAMILIES_WITH_EXPERT_BIAS, gated=gated)
    except SluiceError as exc:
        _fail(where, str(exc).split(";")[0].rstrip("."))
    declared = [(f["name"], f["dtype"], tuple(f["shape"]), f["offset"], f["nbytes"]) for f in experts["layout"]]
    actual = [(f.name, str(f.dtype).removeprefix("torch."), f.shape, f.offset, f.nbytes) for f in expected.fields]
    if declared != actual:
        _fail(where, f"the expert layout does not match {manifest['quant']} blocks of "
                     f"{experts['intermediate']}x{experts['hidden']}")
    return expected


def _check_layer(layer: str, entry, offset: int, block_bytes: int, num_experts: int, where: Path) -> None:
    """One layer's entry: a numbered key, its schema, right after the layer before, one checksum an expert."""
    if not layer.isdigit():
        _fail(where, f"layer key '{layer}' is not a number")
    _check(entry, LAYER_SCHEMA, f"experts.layers.{layer}", where)
    if entry["block_bytes"] != block_bytes or entry["offset"] != offset:
        _fail(where, f"layer {layer} has a wrong offset or block size")
    if len(entry["crc32"]) != num_experts:
        _fail(where, f"layer {layer} has {len(entry['crc32'])} checksums for {num_experts} experts")
