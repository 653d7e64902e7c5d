"""The embedding table read from the model's file: the loaded table's rows, without the process holding it."""
from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import save_file

from engine.runtime.runner import to_int8
from engine.format import file_table
from engine.format.file_table import FileTable, can_map
from engine.model.model import EMBED_TABLE
from engine.model.layers import embedding
from engine.runtime.memory import process_memory


@pytest.fixture(scope="module")
def dense_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("dense") / "dense.safetensors"
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(24576, 1024, generator=gen).bfloat16()           # 48 MiB: after another tensor
    save_file({"model.norm.weight": torch.ones(1024).bfloat16(), EMBED_TABLE: table}, str(path))
    return path, table


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("quant", [None, "int8"])
def test_rows_are_the_loaded_tables_rows(dense_file, dtype, quant):
    path, table = dense_file
    loaded = table.to(dtype)
    if quant:
        loaded = to_int8(loaded)                 # what dense_quant="int8" loads: the whole table quantised
    rows = FileTable(path, EMBED_TABLE, dtype, quant)
    for ids in (torch.tensor([0]), torch.tensor([24575, 3, 3, 1000]), torch.tensor([[5, 6], [7, 8]])):
        got = rows.rows(ids)
        assert got.dtype == dtype and got.shape == (*ids.shape, 1024)
        assert torch.equal(got, embedding(ids, loaded))
    step_row = torch.full((1, 1024), float("nan"), dtype=dtype)          # a decode step's row, into its buffer
    for token in (0, 24575, 77):
        rows.row_into(token, step_row)
        assert torch.equal(step_row, embedding(torch.tensor([token]), loaded))


def test_reading_rows_takes_no_process_memory(dense_file):
    path, _ = dense_file
    before = process_memory()[1]
    table = FileTable(path, EMBED_TABLE, torch.bfloat16)
    for start in range(0, 24576, 97):
        table.rows(torch.tensor([start]))
    # anonymous memory: the 48 MiB table loaded would add it all; its rows read are the file's page cache
    assert process_memory()[1] - before < 8 << 20


def test_only_float_tables_are_mapped(tmp_path):
    path = tmp_path / "dense.safetensors"
    save_file({"ids": torch.arange(12, dtype=torch.int64).reshape(3, 4), "vec": torch.ones(4)}, str(path))
    assert not can_map(path, "ids") and not can_map(path, "vec") and not can_map(path, "missing")


def test_rows_asked_for_together_come_out_right(dense_file):
    """A prompt's rows are asked for together (fadvise WILLNEED over their pages, adjacent rows sharing pages)."""
    path, table = dense_file
    rows = FileTable(path, EMBED_TABLE, torch.bfloat16)
    ids = torch.tensor([24575, 0, 1, 2, 12000, 12000, 7])
    assert torch.equal(rows.rows(ids), table[ids])


def test_a_file_cut_short_is_a_sentence_not_a_crash(dense_file, tmp_path):
    import shutil
    from engine.errors import SluiceError
    path = shutil.copy(dense_file[0], tmp_path / "dense.safetensors")
    rows = FileTable(path, EMBED_TABLE, torch.bfloat16)
    os.truncate(path, os.path.getsize(path) // 2)
    assert rows.rows(torch.tensor([3])).shape == (1, 1024)             # the first half still reads
    with pytest.raises(SluiceError, match="was cut short while the model was in use"):
        rows.rows(torch.tensor([3, 24000]))
    with pytest.raises(SluiceError, match="was cut short while the model was in use"):
        rows.row_into(24000, torch.empty(1, 1024, dtype=torch.bfloat16))


def _disk_reads_reading(rows: FileTable, ids: list[int]) -> int:
    """Blocks read from the disk (page-cache hits count none)."""
    import resource
    before = resource.getrusage(resource.RUSAGE_SELF).ru_inblock
    for i in ids:
        rows.rows(torch.tensor([i]))
    return resource.getrusage(resource.RUSAGE_SELF).ru_inblock - before


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="fadvise is POSIX's")
def test_a_table_kept_cached_reads_no_row_from_the_disk(dense_file):
    """Where RAM is free the runner keeps the table's pages cached: a decode step's row is then no disk read
    before its first layer (1-2 a token on the H200 box while decoding, each ~0.1 ms)."""
    from engine.runtime.memory import drop_file_cache
    path, table = dense_file
    os.sync()
    ids = list(range(11, 24576, 331))
    drop_file_cache(path)
    if _disk_reads_reading(FileTable(path, EMBED_TABLE, torch.bfloat16), ids) == 0:
        pytest.skip("this file system reads no page from a disk (a RAM disk): nothing to keep")
    drop_file_cache(path)
    rows = FileTable(path, EMBED_TABLE, torch.bfloat16)
    rows.keep_cached().join(timeout=60)          # read in the background
    assert _disk_reads_reading(rows, ids) == 0
    assert torch.equal(rows.rows(torch.tensor(ids)), table[ids])


def test_the_table_stays_cached_only_beside_room_to_spare():
    gib = 1 << 30
    assert file_table.keeps_table(available=64 * gib, ram_cache=16 * gib, table_bytes=gib // 5)
    assert not file_table.keeps_table(available=17 * gib, ram_cache=16 * gib, table_bytes=gib // 5)
