"""Rows of the preprocess stage's `encoded.npy`, read without holding the file in memory.

The file has a row for every row of the table (those no evaluation reads stay zeros on disk). The rows
evaluation reads are spread over the whole file (the split is row-local), so indexing a memory map of it
maps nearly every page: at 1,000,000 census rows about 420 MB of file pages, counted in the process's
memory, for 40 MB of rows. `EncodedRows` reads just the rows asked for with positioned reads
(models/data/npy_rows.py `RowFile`), so what the process holds is the rows it asked for.

`write_rows` writes the file block by block through a memory map, each block's pages let go once written
(a shared file mapping's written pages stay in the kernel's page cache, bound for the file, not in the
process). Indexing one memory map of the whole file held every page written, about 430 MB at 1,000,000
rows and, since the rows are spread over the file, about 1.2 GB at 10,000,000.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from dpsynth.models.data.npy_rows import RowFile, release_pages

# Rows written between two releases of the mapping's pages: they touch at most this many pages (32 MB).
BLOCK_ROWS = 8_192


class EncodedRows:
    """`np.load(path, mmap_mode="r")` for reading rows by index: `rows_of[indices]` is a plain array."""

    def __init__(self, path: str | Path):
        self._file = RowFile(path)
        self.shape = self._file.shape
        self.dtype = self._file.dtype

    def __len__(self) -> int:
        return len(self._file)

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows)
        if rows.dtype == bool:
            rows = np.flatnonzero(rows)
        return self._file.rows(rows)


def write_rows(
    path: str | Path, n_rows: int, width: int, rows: np.ndarray, encode: Callable[[slice], np.ndarray]
) -> None:
    """Write `path` as an `.npy` file of `n_rows` x `width` float32 rows, zeros but for the sorted rows
    `rows`: `rows[block]` get `encode(block)` (a slice of positions into `rows`), block by block (see the
    module notes). The rows never written stay holes in the file, on neither disk nor memory."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n_rows, width))
    for start in range(0, len(rows), BLOCK_ROWS):
        block = slice(start, start + BLOCK_ROWS)
        out[rows[block]] = encode(block)
        release_pages(out)
    out.flush()
    del out
