"""Cells of a column on public facts only: its declared levels, or bins of its public bounds plus its
declared point masses. One definition for everything that counts rows per cell: fidelity scores
(how far a released table is from the real one) and measured marginals (what a release spends budget on).

A continuous column has `bins` equal-width cells over its bounds, then one cell per declared point
mass (`point_masses` in the schema, e.g. a money column's 0): a value equal to a point mass goes to the
point mass's cell, not to the bin it lies in. Values outside the bounds go to the nearest end bin.
Missing or undeclared values get code -1.

A continuous column's bin narrower than its decimals' step may hold no value of its decimal grid: such a
cell can never be written (`writable_cells`, public).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from dpsynth.models.data.encoding import level_codes
from dpsynth.models.data.schema import Column

DEFAULT_BINS = 20
MISSING = -1
# Enumerating a column's decimal grid (to find the cells it can fill) is done when it has at most this many points.
MAX_GRID = 2_000_000


def cell_count(col: Column, bins: int = DEFAULT_BINS) -> int:
    """How many cells the column has."""
    if col.is_continuous:
        return bins + len(col.point_masses)
    return len(col.levels)


def _bin_of(col: Column, numbers: np.ndarray, bins: int) -> np.ndarray:
    """The bin of each finite number (ends clipped): the one formula for coding and for drawing values."""
    low, high = col.continuous_bounds
    codes = np.floor((numbers - low) / (high - low) * bins)
    return np.clip(np.nan_to_num(codes, nan=0.0), 0, bins - 1).astype(np.int64)


def cell_codes(col: Column, values: ArrayLike, bins: int = DEFAULT_BINS) -> np.ndarray:
    """The cell of each value (int64, -1 for missing or undeclared values)."""
    if not col.is_continuous:
        return level_codes(col, np.asarray(values)).astype(np.int64)
    numbers = pd.to_numeric(pd.Series(np.asarray(values, dtype=object)), errors="coerce").to_numpy(np.float64)
    codes = _bin_of(col, numbers, bins)
    for k, mass in enumerate(col.point_masses):
        codes[numbers == mass] = bins + k
    codes[~np.isfinite(numbers)] = MISSING
    return codes


def writable_cells(col: Column, bins: int = DEFAULT_BINS) -> np.ndarray:
    """Which of the column's cells hold a value on its decimal grid (every cell of a discrete column; a
    continuous column's bins narrower than its decimals' step may hold none). Public: bounds, decimals,
    point masses and `bins` only."""
    if not col.is_continuous:
        return np.ones(cell_count(col, bins), dtype=bool)
    low, high = col.continuous_bounds
    width = (high - low) / bins
    if width >= (len(col.point_masses) + 1) * 10.0**-col.decimals:
        return np.ones(cell_count(col, bins), dtype=bool)  # every bin holds a grid value that is no point mass
    grid = decimal_grid(col)
    if grid is None:
        return np.ones(cell_count(col, bins), dtype=bool)
    return np.bincount(cell_codes(col, grid, bins), minlength=cell_count(col, bins)) > 0


def decimal_grid(col: Column) -> np.ndarray | None:
    """Every value of a continuous column's decimal grid within its bounds, when there are at most
    `MAX_GRID` (else None); None for a discrete column."""
    if not col.is_continuous:
        return None
    step = 10.0**-col.decimals
    low, high = col.continuous_bounds
    first, last = math.ceil(low / step - 1e-9), math.floor(high / step + 1e-9)
    if last - first + 1 > MAX_GRID:
        return None
    return np.round(np.arange(first, last + 1) * step, col.decimals)


def cell_labels(col: Column, bins: int = DEFAULT_BINS) -> list[str]:
    """A readable name per cell: the level, "[low, high)" for a bin, "=value" for a point mass."""
    if not col.is_continuous:
        return [str(level) for level in col.levels]
    low, high = col.continuous_bounds
    edges = np.linspace(low, high, bins + 1)
    labels = [f"[{a:g}, {b:g})" for a, b in itertools.pairwise(edges)]
    labels[-1] = labels[-1][:-1] + "]"
    return labels + [f"={mass:g}" for mass in col.point_masses]


def cell_values(col: Column, codes: np.ndarray, rng: np.random.Generator, bins: int = DEFAULT_BINS) -> np.ndarray:
    """Values for cells, each coded back to its own cell by `cell_codes`: the level itself, the point mass
    exactly, or a value drawn uniformly among the bin's values on the column's decimal grid (none equal
    to a point mass). A bin that holds no such value gets its midpoint, off the grid."""
    codes = np.asarray(codes, dtype=np.int64)
    if not col.is_continuous:
        return np.asarray(col.levels, dtype=object)[codes]
    low, high = col.continuous_bounds
    width = (high - low) / bins
    step = 10.0**-col.decimals
    in_bin = np.minimum(codes, bins - 1)
    lower, upper = low + in_bin * width, low + (in_bin + 1) * width

    def on_grid(x: np.ndarray) -> np.ndarray:
        return np.round(x, col.decimals)

    # The bin's first and last grid values, moved inwards until the coding formula agrees (float edges).
    first = on_grid(np.ceil(np.round(lower / step, 6)) * step)
    last = on_grid(np.floor(np.round(upper / step, 6)) * step)
    for _ in range(2):
        first = np.where(_bin_of(col, first, bins) < in_bin, on_grid(first + step), first)
        last = np.where(_bin_of(col, last, bins) > in_bin, on_grid(last - step), last)
    points = np.round((last - first) / step).astype(np.int64) + 1
    values = on_grid(first + np.floor(rng.random(len(codes)) * np.maximum(points, 1)) * step)
    for mass in col.point_masses:
        # A grid value equal to a point mass belongs to the mass's cell: take its neighbour in the bin.
        hit = values == mass
        values = np.where(
            hit & (values + step <= last), on_grid(values + step), np.where(hit, on_grid(values - step), values)
        )
    usable = (
        (points >= 1)
        & (_bin_of(col, values, bins) == in_bin)
        & ~np.isin(values, col.point_masses)
        & (values >= low)
        & (values <= high)
    )
    values = np.where(usable, values, (lower + upper) / 2)
    for k, mass in enumerate(col.point_masses):
        values[codes == bins + k] = mass
    return values


def frame_cells(columns: list[Column], frame: pd.DataFrame, bins: int = DEFAULT_BINS) -> np.ndarray:
    """Each row's cell in each of `columns` (rows x columns, int64)."""
    return (
        np.stack([cell_codes(col, frame[col.name].to_numpy(), bins) for col in columns], axis=1)
        if columns
        else np.zeros((len(frame), 0), dtype=np.int64)
    )
