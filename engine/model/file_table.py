"""An embedding table left in the model's dense file: a token's row is read where the file is mapped.

A decode step needs one row of the table and a prompt a few hundred, so on a GPU the table need not take
VRAM (OLMoE-1B-7B: 206 MB in bf16, 103 MB as int8: 16-32 more expert slots) nor process memory: the rows
read are the file's page cache, which the OS may drop and read again, not anonymous memory. Nor does the
GPU run torch's gather for it (its CUDA module holds ~65 MiB of host memory once launched).

`rows` gives what the loaded table would: the compute dtype and, with int8 dense weights, each row
quantised and dequantised as the whole table's would be (rows are quantised independently, one scale each).

Under a memory cap the table's pages are soon dropped, so a prompt's rows are read from disk: the map is
marked random (a fault reads its page, not the 128 KB around it, which pushed the libraries' pages out of a
4 GiB cap and halved warm prefill), and a prompt's pages are asked for all at once
before they are touched, so their reads are in flight together rather than one fault at a time.
"""
from __future__ import annotations

import mmap
import threading
from pathlib import Path

import torch

from engine.format.checkpoint import read_header
from engine.format.quant import int8_round_trip

EMBED_TABLE = "model.embed_tokens.weight"
# POSIX maps take advice (Windows has none: there a fault reads what the OS chooses)
_ADVICE = all(hasattr(m, a) for m, a in ((mmap.mmap, "madvise"), (mmap, "MADV_RANDOM"), (mmap, "MADV_WILLNEED")))
_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def table_in_file(family: str, tied: bool) -> bool:
    """Whether the embedding table stays in the file: where the head has its own weight and the family embeds
    by a plain row lookup. The runner and both planners ask."""
    from engine.model.families import family_module
    return not tied and not getattr(family_module(family), "EMBEDS_ITSELF", False)


def keeps_table(available: int, ram_cache: int, table_bytes: int) -> bool:
    """Whether the table's pages may stay cached (FileTable.keep_cached): where the memory left beside the RAM
    cache's budget holds the table twice over and 1 GiB more (a machine with RAM to spare; under a memory
    cap the cache takes what the cap leaves, so the table's rows are read as they are needed)."""
    return available - ram_cache >= 2 * table_bytes + (1 << 30)


def can_map(path: Path, name: str) -> bool:
    """Whether the file's tensor is a float table this module reads rows of."""
    entry = read_header(path).get(name)
    return isinstance(entry, dict) and entry["dtype"] in _DTYPES and len(entry["shape"]) == 2


class FileTable:
    def __init__(self, path: Path, name: str, dtype: torch.dtype, quant: str | None = None):
        entry = read_header(path)[name]
        start, end = entry["data_offsets"]
        with open(path, "rb") as f:
            offset = 8 + int.from_bytes(f.read(8), "little") + start        # after the length and the header
            aligned = offset - offset % mmap.ALLOCATIONGRANULARITY
            # copy-on-write (private, writable) only so torch takes the buffer without a warning: nothing
            # writes to it; ACCESS_COPY is the portable spelling (POSIX and Windows)
            self._map = mmap.mmap(f.fileno(), offset + (end - start) - aligned, access=mmap.ACCESS_COPY,
                                  offset=aligned)
        self._advise(mmap.MADV_RANDOM if _ADVICE else None)
        raw = torch.frombuffer(self._map, dtype=torch.uint8, count=end - start, offset=offset - aligned)
        self._table = raw.view(_DTYPES[entry["dtype"]]).view(*entry["shape"])
        self._first, self._row_bytes = offset - aligned, (end - start) // entry["shape"][0]
        self.dtype, self.quant = dtype, quant
        self._path, self._span = path, (offset, end - start)

    def _ask_for(self, ids: torch.Tensor) -> None:
        """Start the reads of the rows' pages not in the page cache, together (the kernel's readahead)."""
        page = mmap.PAGESIZE
        spans = []
        for i in ids.unique().tolist():
            first = self._first + i * self._row_bytes
            lo, hi = first - first % page, first + self._row_bytes
            if spans and lo <= spans[-1][1]:
                spans[-1][1] = hi
            else:
                spans.append([lo, hi])
        for lo, hi in spans:
            self._advise(mmap.MADV_WILLNEED, lo, hi - lo)

    @property
    def nbytes(self) -> int:
        return self._table.numel() * self._table.element_size()

    def keep_cached(self) -> threading.Thread:
        """Read the whole table once, in the background, so that its pages are in the page cache: where RAM is
        free a decode step's row is then a page-cache hit, not a ~0.1 ms read from the disk before the step's
        first layer (the runner asks only where the RAM cache leaves room: `keeps_table`). A plain read: the
        OS's read-ahead advice (madvise or fadvise WILLNEED) left most rows on the disk on the dev machine."""
        thread = threading.Thread(target=_read_through, args=(self._path, *self._span), name="sluice-table-read",
                                  daemon=True)
        thread.start()
        return thread

    def _advise(self, advice: int | None, *span: int) -> None:
        """Advice is only advice: a platform or file system without it reads the rows all the same."""
        if advice is not None:
            try:
                self._map.madvise(advice, *span)
            except OSError:
                pass

    def rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token ids (any shape, on the host) -> their rows [..., H] in the compute dtype, on the host."""
        flat = token_ids.reshape(-1)
        if flat.numel() > 1 and _ADVICE:
            self._ask_for(flat)
        rows = self._table.index_select(0, flat).to(self.dtype)
        if self.quant == "int8":
            rows = int8_round_trip(rows).to(self.dtype)
        return rows.reshape(*token_ids.shape, -1)


def _read_through(path: Path, offset: int, length: int, chunk: int = 1 << 20) -> None:
    """Read [offset, offset + length) of the file into one reused buffer (the page cache keeps the pages)."""
    buffer = bytearray(chunk)
    try:
        with open(path, "rb", buffering=0) as f:
            f.seek(offset)
            left = length
            while left > 0:
                n = f.readinto(memoryview(buffer)[:min(chunk, left)])
                if not n:
                    return
                left -= n
    except OSError:
        pass
