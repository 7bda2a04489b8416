"""Rows of a float32 `.npy` matrix on disk, read by position without holding the file in memory.

Indexing a memory map of the file is not enough: the kernel maps the pages around every page a read
faults in (fault-around and readahead, from the page cache), so a batch of 560 rows scattered over a
143 MB file mapped 114 MB of it into the process, counted in its memory until released. `RowFile` reads
each run of consecutive rows with one positioned read into the result instead: what the process holds is
the rows it asked for (560 rows: 1.3 ms, no growth).

`release_pages` is for the writer (tasks/encoded_rows.py), which writes through a memory map.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np


class RowFile:
    """The rows of the C-ordered 2-d `.npy` file at `path`: `rows(positions)`, `run(start, stop)`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            major, _ = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, fortran_order, dtype = read_header(f)
            self._offset = f.tell()
        if fortran_order or len(shape) != 2 or dtype.hasobject:
            raise ValueError(f"{self.path}: not a C-ordered 2-d numeric .npy matrix")
        self.shape: tuple[int, int] = (int(shape[0]), int(shape[1]))
        self.dtype = np.dtype(dtype)
        self._row_bytes = self.shape[1] * self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def rows(self, positions: np.ndarray) -> np.ndarray:
        """The rows at `positions` (any order, repeats allowed), one read per run of consecutive ones."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.shape[0]):
            raise IndexError(f"{self.path}: a row position outside 0..{self.shape[0] - 1}")
        out = np.empty((len(positions), self.shape[1]), dtype=self.dtype)
        if not positions.size:
            return out
        breaks = np.flatnonzero(np.diff(positions) != 1) + 1
        starts, stops = np.concatenate([[0], breaks]), np.concatenate([breaks, [len(positions)]])
        buffer, width = memoryview(out.data).cast("B"), self._row_bytes
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            base, preadv = self._offset, getattr(os, "preadv", None)
            for first, last, row in zip(starts.tolist(), stops.tolist(), positions[starts].tolist(), strict=True):
                into = buffer[first * width : last * width]
                # A batch is thousands of runs of one row: one system call each, the loop kept lean.
                if preadv is None or preadv(fd, [into], base + row * width) != len(into):
                    self._read(fd, row, into)
        finally:
            os.close(fd)
        return out

    def run(self, start: int, stop: int) -> np.ndarray:
        """Rows `start` to `stop` (clipped to the file), in one read."""
        start, stop = max(0, min(start, self.shape[0])), max(0, min(stop, self.shape[0]))
        out = np.empty((max(0, stop - start), self.shape[1]), dtype=self.dtype)
        if len(out):
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            try:
                self._read(fd, start, memoryview(out.data).cast("B"))
            finally:
                os.close(fd)
        return out

    def _read(self, fd: int, first_row: int, into: memoryview) -> None:
        offset, done = self._offset + first_row * self._row_bytes, 0
        while done < len(into):  # a read may return fewer bytes than asked
            got = _read_at(fd, into[done:], offset + done)
            if not got:
                raise OSError(f"{self.path}: the file ends before row {first_row + len(into) // self._row_bytes}")
            done += got


def _read_at(fd: int, into: memoryview, offset: int) -> int:
    """One positioned read into `into` (one system call where the platform has preadv: 8,000 scattered
    rows in 10 ms, against 16 ms for a seek and a read each)."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, [into], offset)
    os.lseek(fd, offset, os.SEEK_SET)
    return os.readv(fd, [into])


def release_pages(array: np.ndarray) -> None:
    """Let go of the pages of `array`'s memory map (nothing for an array in memory); written pages stay in
    the page cache, bound for the file."""
    mapping = getattr(array, "_mmap", None)
    if isinstance(mapping, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        mapping.madvise(mmap.MADV_DONTNEED)
