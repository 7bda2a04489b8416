"""Exact counts of rows per public cell, for a set of column cliques, accumulated chunk by chunk.

The marginal generators (MST, AIM) and the continuous columns' fine histograms read the rows only
through such counts, so a table of any length costs one pass over its rows, one chunk in memory at a
time, and partial counts of disjoint chunks add up exactly (integers): the same totals whether the
chunks are counted in one process, one after another, or on the workers of a Dask cluster. Noise is
never added here: the mechanisms draw it from the run's secret, once, after the exact counts are summed.

Cells are dpsynth.models.data.binning's (public facts only); a clique's counts are an int64 array with
one axis per column, over every cell of that column (`cell_count`). A generator that reduces a column's
domain maps those cells to its own codes afterwards (`CellCounts.mapped`).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpsynth.models.data.binning import cell_codes, cell_count, fine_cell_count, fine_codes
from dpsynth.models.data.schema import Column
from dpsynth.models.errors import ConfigError

Clique = tuple[int, ...]


@dataclass
class CellCounts:
    """Rows per cell of each clique (positions into the counted columns), the continuous columns' fine
    histograms (by position), and how many rows were counted. Exact: real-row facts, never published."""

    total: int
    cliques: dict[Clique, np.ndarray] = field(default_factory=dict)
    fine: dict[int, np.ndarray] = field(default_factory=dict)

    def __add__(self, other: CellCounts) -> CellCounts:
        if set(self.cliques) != set(other.cliques) or set(self.fine) != set(other.fine):
            raise ValueError("counts of different cliques cannot be added")
        return CellCounts(
            self.total + other.total,
            {c: self.cliques[c] + other.cliques[c] for c in self.cliques},
            {j: self.fine[j] + other.fine[j] for j in self.fine},
        )

    def mapped(self, clique: Clique, maps: Sequence[np.ndarray], sizes: Sequence[int]) -> np.ndarray:
        """The clique's counts over each column's own codes (`maps[j]`: cell -> code, -1 for a cell counted
        nowhere), flat and row-major, int64: what counting the rows' mapped codes directly gives."""
        raw = self.cliques[clique]
        out = np.zeros(tuple(int(sizes[j]) for j in clique), dtype=np.int64)
        occupied = np.nonzero(raw)
        codes = [np.asarray(maps[j])[cells] for j, cells in zip(clique, occupied, strict=True)]
        kept = np.logical_and.reduce([c >= 0 for c in codes])
        np.add.at(out, tuple(c[kept] for c in codes), raw[occupied][kept])
        return out.ravel()

    def unmapped_rows(self, clique: Clique, maps: Sequence[np.ndarray]) -> int:
        """Rows of the clique in a cell some column's map drops (-1)."""
        raw = self.cliques[clique]
        occupied = np.nonzero(raw)
        codes = [np.asarray(maps[j])[cells] for j, cells in zip(clique, occupied, strict=True)]
        dropped = np.logical_or.reduce([c < 0 for c in codes])
        return int(raw[occupied][dropped].sum())

    def digest(self) -> str:
        """A hash of every count (to compare two ways of counting the same rows)."""
        h = hashlib.sha256(str(self.total).encode())
        for clique in sorted(self.cliques):
            h.update(repr(clique).encode())
            h.update(np.ascontiguousarray(self.cliques[clique], dtype=np.int64).tobytes())
        for j in sorted(self.fine):
            h.update(f"fine{j}".encode())
            h.update(np.ascontiguousarray(self.fine[j], dtype=np.int64).tobytes())
        return h.hexdigest()

    def save(self, path: Path) -> Path:
        # Any: numpy's stubs would read a name among the arrays as savez's own `allow_pickle` flag.
        arrays: dict[str, Any] = {f"clique_{'_'.join(map(str, c))}": v for c, v in self.cliques.items()}
        arrays |= {f"fine_{j}": v for j, v in self.fine.items()}
        with open(path, "wb") as handle:
            np.savez(handle, total=np.int64(self.total), **arrays)
        return Path(path)

    @classmethod
    def load(cls, path: Path) -> CellCounts:
        with np.load(path) as saved:
            cliques = {
                tuple(int(p) for p in key.removeprefix("clique_").split("_")): saved[key]
                for key in saved.files
                if key.startswith("clique_")
            }
            fine = {int(key.removeprefix("fine_")): saved[key] for key in saved.files if key.startswith("fine_")}
            return cls(int(saved["total"]), cliques, fine)


def one_and_two_way(columns: int) -> list[Clique]:
    """Every column alone and every pair of columns (what MST reads)."""
    return [(j,) for j in range(columns)] + list(itertools.combinations(range(columns), 2))


def empty_counts(
    columns: Sequence[Column], bins: int, cliques: Iterable[Clique], fine: Iterable[int] = ()
) -> CellCounts:
    """Zero counts of the right shapes (the sum of no chunk)."""
    return CellCounts(
        0,
        {c: np.zeros(tuple(cell_count(columns[j], bins) for j in c), dtype=np.int64) for c in cliques},
        {j: np.zeros(fine_cell_count(columns[j], bins), dtype=np.int64) for j in fine},
    )


def count_frame(
    frame: pd.DataFrame,
    columns: Sequence[Column],
    bins: int,
    cliques: Iterable[Clique],
    fine: Iterable[int] = (),
    reader: str = "the marginal generators",
) -> CellCounts:
    """The counts of one chunk of rows, every value of a clique's columns already in a cell (complete rows:
    `reader` is named in the refusal otherwise). `fine`: positions of continuous columns whose fine
    histogram is counted too (a missing value counts in no fine cell)."""
    cliques = list(cliques)
    used = sorted({j for c in cliques for j in c})
    codes: dict[int, np.ndarray] = {}
    for j in used:
        col = columns[j]
        codes[j] = cell_codes(col, frame[col.name].to_numpy(), bins)
        if (codes[j] < 0).any():
            raise ConfigError(f"{reader} reads complete rows: column {col.name!r} holds missing or undeclared values")
    counted: dict[Clique, np.ndarray] = {}
    for clique in cliques:
        shape = tuple(cell_count(columns[j], bins) for j in clique)
        flat = np.ravel_multi_index(tuple(codes[j] for j in clique), shape) if len(frame) else np.zeros(0, np.int64)
        counted[clique] = np.bincount(flat, minlength=int(np.prod(shape))).astype(np.int64).reshape(shape)
    histograms = {}
    for j in fine:
        col = columns[j]
        fine_cells = fine_codes(col, frame[col.name].to_numpy(), bins)
        histograms[j] = np.bincount(fine_cells[fine_cells >= 0], minlength=fine_cell_count(col, bins)).astype(np.int64)
    return CellCounts(len(frame), counted, histograms)


def add_up(
    parts: Iterable[CellCounts], columns: Sequence[Column], bins: int, cliques: Sequence[Clique], fine: Sequence[int]
) -> CellCounts:
    """The sum of chunks' counts (exact, in any order)."""
    total = empty_counts(columns, bins, cliques, fine)
    for part in parts:
        total = total + part
    return total
