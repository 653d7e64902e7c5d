"""The n-gram tables of a PLE model (qwen4_exp) on disk: ngram.bin, with its index ngram.json.

The tables are the model's largest tensors and a token needs a few rows of each, so they stay out of the
dense weights and are read by row (engine.runtime.ngram). Each PLE layer's table is one run of rows, rows
`row_stride` bytes apart (the row rounded up to a power of two, so no row straddles a 4 KiB page and one
O_DIRECT page read holds whole rows), each table starting on a page. The Hub splits a table into
`split_ngram_parts` shards along its rows; they are written in order, one shard in memory at a time.

ngram.json: {"version", "dtype", "row_dim", "row_bytes", "row_stride", "page_bytes",
             "tables": [{"layer", "rows", "offset", "crc32"}] (PLE layers in order)}
"""
from __future__ import annotations

import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import SluiceError

NGRAM_FILE, NGRAM_INDEX = "ngram.bin", "ngram.json"
MTP_FILE = "mtp.safetensors"        # multi-token-prediction weights, kept for later (not run)
PAGE = 4096
# one layer's table (canonical name), whole or one Hub shard of it
TABLE_NAME = re.compile(r"^model\.layers\.(\d+)\.ple\.ple_embedding\.ngram_embedding\.(?:shard_(\d+)\.)?weight$")
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def row_stride(row_bytes: int) -> int:
    """Rows up to a page: the next power of two (whole rows per page); larger rows: whole pages."""
    if row_bytes <= PAGE:
        return 1 << (row_bytes - 1).bit_length()
    return -(-row_bytes // PAGE) * PAGE


@dataclass(frozen=True)
class Table:
    layer: int
    rows: int
    offset: int            # of row 0 in ngram.bin (page aligned)
    crc32: int


@dataclass(frozen=True)
class NgramIndex:
    dtype: torch.dtype
    row_dim: int
    row_bytes: int
    row_stride: int
    tables: tuple[Table, ...]

    @property
    def total_bytes(self) -> int:
        last = self.tables[-1]
        return last.offset + last.rows * self.row_stride

    def to_json(self) -> dict:
        dtype = next(k for k, v in _DTYPES.items() if v == self.dtype)
        return {"version": 1, "dtype": dtype, "row_dim": self.row_dim, "row_bytes": self.row_bytes,
                "row_stride": self.row_stride, "page_bytes": PAGE,
                "tables": [t.__dict__ for t in self.tables]}


def read_index(model_dir: Path) -> NgramIndex | None:
    """The index of a model dir's n-gram tables, None where it has none."""
    path = Path(model_dir) / NGRAM_INDEX
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        index = NgramIndex(_DTYPES[raw["dtype"]], raw["row_dim"], raw["row_bytes"], raw["row_stride"],
                           tuple(Table(**t) for t in raw["tables"]))
    except (ValueError, KeyError, TypeError):
        raise SluiceError(f"'{path}' is damaged; repack the model again.") from None
    data = Path(model_dir) / NGRAM_FILE
    if not data.is_file():
        raise SluiceError(f"'{model_dir}' is missing {NGRAM_FILE}; repack the model again.")
    if data.stat().st_size < index.total_bytes:
        raise SluiceError(f"'{data}' is truncated; repack the model again.")
    return index


def table_shards(names: list[str], canonical) -> dict[int, list[str]]:
    """Checkpoint names of each layer's table, shards in order: {layer: [names]}. canonical: name -> Sluice name."""
    found: dict[int, list[tuple[int, str]]] = {}
    for name in names:
        m = TABLE_NAME.match(canonical(name))
        if m:
            found.setdefault(int(m.group(1)), []).append((int(m.group(2) or 0), name))
    return {layer: [n for _, n in sorted(parts)] for layer, parts in sorted(found.items())}


def write_tables(work: Path, shards: dict[int, list[str]], read, ple_layers: tuple[int, ...]) -> NgramIndex:
    """ngram.bin and ngram.json in `work`; read(name) -> the shard's tensor. Refuses a table a PLE layer lacks."""
    missing = [layer for layer in ple_layers if layer not in shards]
    if missing:
        raise SluiceError(f"The checkpoint has no n-gram table for PLE layer {missing[0]}; it is incomplete "
                          "or not the model its config says.")
    tables, offset, fmt = [], 0, None
    fd = os.open(work / NGRAM_FILE, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for layer in ple_layers:
            rows, crc = 0, 0
            for name in shards[layer]:
                shard = read(name).contiguous()                          # [rows, row_dim]
                fmt = fmt or (shard.dtype, shard.shape[1], shard.shape[1] * shard.element_size())
                data = _strided(shard, row_stride(fmt[2]))
                os.pwrite(fd, data, offset + rows * row_stride(fmt[2]))
                crc = zlib.crc32(data, crc)
                rows += shard.shape[0]
            tables.append(Table(layer, rows, offset, crc))
            offset = -(-(offset + rows * row_stride(fmt[2])) // PAGE) * PAGE
        os.ftruncate(fd, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    index = NgramIndex(fmt[0], fmt[1], fmt[2], row_stride(fmt[2]), tuple(tables))
    (work / NGRAM_INDEX).write_text(json.dumps(index.to_json(), indent=1))
    return index


def _strided(shard: torch.Tensor, stride: int) -> bytes:
    """The shard's rows as bytes, each padded to `stride`."""
    raw = shard.view(torch.uint8).view(shard.shape[0], -1)
    if raw.shape[1] < stride:
        raw = torch.nn.functional.pad(raw, (0, stride - raw.shape[1]))
    return raw.numpy().tobytes()


def ple_layers(spec) -> tuple[int, ...]:
    """Zero-based PLE layers of a model (none outside qwen4_exp)."""
    return tuple(i - 1 for i in getattr(spec.cfg, "ple_layer_ids", None) or ())


def is_table(spec, canonical_name: str) -> bool:
    """Whether a checkpoint tensor is an n-gram table (written to ngram.bin, not to the dense weights)."""
    return bool(ple_layers(spec)) and TABLE_NAME.match(canonical_name) is not None


def table_bytes(spec, names: list[str], nbytes, canonical) -> int:
    """Bytes of the checkpoint's n-gram tables (the repack's disk-space check)."""
    return sum(nbytes(n) for n in names if is_table(spec, canonical(n)))


def repack_tables(work: Path, names: list[str], read, spec, canonical) -> tuple[str, ...]:
    """The repack's step for PLE models: the checkpoint's tables into ngram.bin (read(name) -> tensor, block-FP8
    dequantised); the files to checksum."""
    layers = ple_layers(spec)
    if not layers:
        return ()
    write_tables(work, table_shards(names, canonical), read, layers)
    return (NGRAM_INDEX,)


def repack_mtp(work: Path, names: list[str], read, spec) -> tuple[str, ...]:
    """A PLE model's multi-token-prediction weights (`mtp.*`), if the checkpoint ships them, into mtp.safetensors:
    kept on disk, never loaded; the files to checksum."""
    mtp = [n for n in names if n.startswith("mtp.")]
    if not ple_layers(spec) or not mtp:
        return ()
    from safetensors.torch import save_file
    save_file({n: read(n).contiguous() for n in mtp}, str(work / MTP_FILE), metadata={"format": "pt"})
    return (MTP_FILE,)
