"""Evaluation's reads of `encoded.npy` (tasks/encoded_rows.py): the same rows as indexing a memory map of
it, without the file's pages staying in the process's memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpsynth.tasks.encoded_rows import EncodedRows

ROLLUP = Path("/proc/self/smaps_rollup")


def _pss_kb() -> int:
    for line in ROLLUP.read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    raise AssertionError("no Pss line")


@pytest.fixture
def encoded(tmp_path) -> Path:
    path = tmp_path / "encoded.npy"
    rows = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(300_000, 100))  # 120 MB
    rows[::7] = np.random.default_rng(0).random((len(range(0, 300_000, 7)), 100), dtype=np.float32)
    rows.flush()
    del rows
    return path


def test_the_rows_equal_the_memory_maps(encoded):
    mapped = np.load(encoded, mmap_mode="r")
    rows = np.random.default_rng(1).choice(300_000, 20_000, replace=False)
    np.testing.assert_array_equal(EncodedRows(encoded)[rows], mapped[rows])
    mask = np.zeros(300_000, dtype=bool)
    mask[rows] = True
    np.testing.assert_array_equal(EncodedRows(encoded)[mask], mapped[mask])
    assert EncodedRows(encoded).shape == mapped.shape and len(EncodedRows(encoded)) == len(mapped)


@pytest.mark.skipif(not ROLLUP.exists(), reason="reads Linux's /proc/self/smaps_rollup")
def test_rows_spread_over_the_file_keep_only_themselves_in_memory(encoded):
    rows = np.arange(0, 300_000, 10)  # 12 MB of rows on nearly every page of the 120 MB file
    before = _pss_kb()
    read = EncodedRows(encoded)[rows]
    grown = _pss_kb() - before
    # At most the rows themselves (the allocator may reuse freed memory for them) and one block's pages.
    assert grown < read.nbytes // 1024 + 20_000, grown
    # What a memory map of the file keeps: every page it touched (the old way: about 120 MB here).
    mapped = np.load(encoded, mmap_mode="r")
    before = _pss_kb()
    kept = mapped[rows]
    assert _pss_kb() - before > kept.nbytes // 1024 + 60_000
