"""An embedding table left in the model's dense file: a token's row is read from the file (pread, not a map: a file
cut short while the model runs is then a SluiceError, not a SIGBUS that kills the process).

A decode step needs one row of the table and a prompt a few hundred, so on a GPU the table need not take
VRAM (OLMoE-1B-7B: 206 MB in bf16, 103 MB as int8: 16-32 more expert slots) nor process memory: the rows
read are the file's page cache, which the OS may drop and read again, not anonymous memory. Nor does the
GPU run torch's gather for it (its CUDA module holds ~65 MiB of host memory once launched).

`rows` gives what the loaded table would: the compute dtype and, with int8 dense weights, each row
quantised and dequantised as the whole table's would be (rows are quantised independently, one scale each).

Under a memory cap the table's pages are soon dropped, so a prompt's rows are read from disk: the file is
marked random (a read brings its page, not the 128 KB around it, which pushed the libraries' pages out of a
4 GiB cap and halved warm prefill), and a prompt's pages are asked for all at once
before they are read, so their reads are in flight together rather than one at a time.
"""
from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path

import torch

from engine.errors import SluiceError
from engine.format.checkpoint import read_header
from engine.format.quant import int8_round_trip

_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


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
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        offset = 8 + int.from_bytes(os.pread(self._fd, 8, 0), "little") + start    # after the length and header
        self._advise(getattr(os, "POSIX_FADV_RANDOM", None), 0, 0)
        self._stored, self._shape = _DTYPES[entry["dtype"]], tuple(entry["shape"])
        self._first, self._row_bytes = offset, (end - start) // entry["shape"][0]
        self.dtype, self.quant = dtype, quant
        self._path, self._span = path, (offset, end - start)
        self._one = bytearray(self._row_bytes)                           # a decode step's row (`row_into`)
        self._one_row = torch.frombuffer(self._one, dtype=torch.uint8).view(self._stored).view(1, -1)

    def __del__(self):
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            os.close(fd)

    def _ask_for(self, ids: list[int]) -> None:
        """Start the reads of the rows' pages not in the page cache, together (the kernel's readahead)."""
        page = mmap.PAGESIZE
        spans = []
        for i in ids:
            first = self._first + i * self._row_bytes
            lo, hi = first - first % page, first + self._row_bytes
            if spans and lo <= spans[-1][1]:
                spans[-1][1] = hi
            else:
                spans.append([lo, hi])
        for lo, hi in spans:
            self._advise(getattr(os, "POSIX_FADV_WILLNEED", None), lo, hi - lo)

    @property
    def nbytes(self) -> int:
        return self._span[1]

    def keep_cached(self) -> threading.Thread:
        """Read the whole table once, in the background, so that its pages are in the page cache: where RAM is
        free a decode step's row is then a page-cache hit, not a ~0.1 ms read from the disk before the step's
        first layer (the runner asks only where the RAM cache leaves room: `keeps_table`). A plain read: the
        OS's read-ahead advice (madvise or fadvise WILLNEED) left most rows on the disk on the dev machine."""
        thread = threading.Thread(target=_read_through, args=(self._path, *self._span), name="sluice-table-read",
                                  daemon=True)
        thread.start()
        return thread

    def _advise(self, advice: int | None, offset: int, length: int) -> None:
        """Advice is only advice: a platform or file system without it reads the rows all the same."""
        if advice is not None:
            try:
                os.posix_fadvise(self._fd, offset, length, advice)
            except OSError:
                pass

    def _read_rows(self, ids: list[int]) -> torch.Tensor:
        """The stored rows of `ids` [U, H], read with pread: a file cut short while the model runs is a
        SluiceError here (a mapped file's missing page would kill the process with SIGBUS)."""
        rb = self._row_bytes
        buffer = bytearray(len(ids) * rb)
        view = memoryview(buffer)
        for k, i in enumerate(ids):
            data = os.pread(self._fd, rb, self._first + i * rb)
            if len(data) != rb:
                self._cut_short()
            view[k * rb:(k + 1) * rb] = data
        return torch.frombuffer(buffer, dtype=torch.uint8).view(self._stored).view(len(ids), -1)

    def row_into(self, token: int, out: torch.Tensor) -> None:
        """A decode step's row: token's row written into `out` [1, H] (host) as `rows` gives it, with one pread into
        a buffer kept for it (rows' unique, gather and fresh buffers cost a 2-core host ~150 us a token)."""
        if os.preadv(self._fd, [self._one], self._first + token * self._row_bytes) != self._row_bytes:
            self._cut_short()
        row = self._one_row.to(self.dtype)
        out.copy_(int8_round_trip(row) if self.quant == "int8" else row)

    def _cut_short(self):
        raise SluiceError(f"'{self._path}' was cut short while the model was in use; restore or repack "
                          "the model and load it again.")

    def rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token ids (any shape, on the host) -> their rows [..., H] in the compute dtype, on the host."""
        ids, inverse = token_ids.reshape(-1).unique(return_inverse=True)
        ids = ids.tolist()
        if len(ids) > 1:
            self._ask_for(ids)
        rows = self._read_rows(ids).index_select(0, inverse).to(self.dtype)
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
