"""Evaluation's reads of `encoded.npy` (tasks/encoded_rows.py): the same rows as indexing a memory map of
it, without the file's pages staying in the process's memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpsynth.tasks.encoded_rows import EncodedRows, write_rows

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


@pytest.mark.skipif(not ROLLUP.exists(), reason="reads Linux's /proc/self/smaps_rollup")
def test_written_rows_equal_a_memory_maps_and_their_pages_are_not_held(tmp_path):
    n_rows, rows = 300_000, np.arange(0, 300_000, 7)  # 17 MB of rows on every page of a 120 MB file
    values = np.random.default_rng(2).random((len(rows), 100), dtype=np.float32)
    expected = np.lib.format.open_memmap(tmp_path / "mapped.npy", mode="w+", dtype=np.float32, shape=(n_rows, 100))
    expected[rows] = values
    expected.flush()
    del expected
    before = _pss_kb()
    held = []

    def encode(block: slice) -> np.ndarray:
        held.append(_pss_kb() - before)  # while the file is being written
        return values[block]

    write_rows(tmp_path / "written.npy", n_rows, 100, rows, encode)
    assert (tmp_path / "written.npy").read_bytes() == (tmp_path / "mapped.npy").read_bytes()
    # About one block's pages (32 MB at most) at any time; holding every page written would reach 120 MB.
    assert max(held) < 40_000, max(held)
