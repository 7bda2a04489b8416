"""Cells of a column on public facts only: its declared levels, or bins of its public bounds plus its
declared point masses. One definition for everything that counts rows per cell: fidelity scores
(how far a released table is from the real one) and measured marginals (what a release spends budget on).

A continuous column has `bins` equal-width cells over its bounds, then one cell per declared point
mass (`point_masses` in the schema, e.g. a money column's 0): a value equal to a point mass goes to the
point mass's cell, not to the bin it lies in. Values outside the bounds go to the nearest end bin.
Missing or undeclared values get code -1.

A continuous column's bin narrower than its decimals' step may hold no value of its decimal grid: such a
cell can never be written (`writable_cells`, public).

Fine cells, nested in those cells, give a continuous column's 1-way shape (`fine_codes`): one cell per
value when the column's decimal grid holds at most `MAX_VALUE_CELLS` values (hours 1-99, an age, a
score 0-100), else each bin split into `FINE_SPLIT` equal sub-bins; a point mass is a fine cell of its
own. A column declared with decimals is often recorded at whole units (weights in whole kilograms, money
in whole units), so a sub-bin that holds a whole number and other values of its decimal grid has two fine
cells, at a whole number and not (`whole_split`; each value still in exactly one fine cell). Shapes
released before that layout keep theirs (`whole_cells=False`). Pairs keep the coarse cells; a measured
fine histogram (dpsynth.models.marginals.shapes) says where inside a coarse cell a drawn value lands
(`shaped_cell_values`). Public facts only, like the cells.
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
# A column whose decimal grid holds at most this many values gets one fine cell per value.
MAX_VALUE_CELLS = 400
# Otherwise each coarse bin is split into this many equal fine sub-bins.
FINE_SPLIT = 16


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


def _bin_edges(col: Column, in_bin: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    low, high = col.continuous_bounds
    width = (high - low) / bins
    return low + in_bin * width, low + (in_bin + 1) * width


def _grid_span(col: Column, in_bin: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Each bin's first and last value on the column's decimal grid, moved inwards until the coding
    formula agrees (float edges); last < first where the bin holds no grid value."""
    step = 10.0**-col.decimals
    lower, upper = _bin_edges(col, in_bin, bins)

    def on_grid(x: np.ndarray) -> np.ndarray:
        return np.round(x, col.decimals)

    first = on_grid(np.ceil(np.round(lower / step, 6)) * step)
    last = on_grid(np.floor(np.round(upper / step, 6)) * step)
    for _ in range(2):
        first = np.where(_bin_of(col, first, bins) < in_bin, on_grid(first + step), first)
        last = np.where(_bin_of(col, last, bins) > in_bin, on_grid(last - step), last)
    return first, last


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
    step = 10.0**-col.decimals
    in_bin = np.minimum(codes, bins - 1)
    lower, upper = _bin_edges(col, in_bin, bins)

    def on_grid(x: np.ndarray) -> np.ndarray:
        return np.round(x, col.decimals)

    first, last = _grid_span(col, in_bin, bins)
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


def value_grid(col: Column) -> np.ndarray | None:
    """A continuous column's decimal grid when it holds at most `MAX_VALUE_CELLS` values (one fine cell
    each), else None."""
    if not col.is_continuous:
        return None
    step = 10.0**-col.decimals
    low, high = col.continuous_bounds
    if math.floor(high / step + 1e-9) - math.ceil(low / step - 1e-9) + 1 > MAX_VALUE_CELLS:
        return None
    return decimal_grid(col)


def fine_cell_count(col: Column, bins: int = DEFAULT_BINS, whole_cells: bool = True) -> int:
    """How many fine cells a continuous column has (0 for a discrete column: its levels are its shape).
    `whole_cells` False: the layout before whole numbers had fine cells of their own (shapes released
    then keep it)."""
    if not col.is_continuous:
        return 0
    grid = value_grid(col)
    if grid is not None:
        return len(grid)
    return len(_sub_bin_cells(col, bins, whole_cells)[0]) + len(col.point_masses)


def whole_split(col: Column, bins: int = DEFAULT_BINS) -> np.ndarray | None:
    """Per sub-bin of a column whose fine cells are sub-bins and whose decimals are above 0, whether it
    holds both a whole number and another value of its decimal grid (point masses aside): such a sub-bin
    has two fine cells, "at a whole number" and "not at one", so that a column recorded at whole units
    though declared with decimals (weights in whole kilograms) keeps its whole values. None for any other
    column. Public facts only: bounds, decimals, point masses."""
    if not col.is_continuous or col.decimals <= 0 or value_grid(col) is not None:
        return None
    sub_bins = bins * FINE_SPLIT
    k_first, k_last = _grid_indices(col, np.arange(sub_bins), sub_bins)
    per_whole = 10**col.decimals  # grid steps per whole number
    points = np.maximum(k_last - k_first + 1, 0)
    wholes = np.maximum(k_last // per_whole + (-k_first // per_whole) + 1, 0)  # floor(last) - ceil(first) + 1
    others = points - wholes
    step = 10.0**-col.decimals
    for mass in col.point_masses:
        k = mass / step
        if abs(k - round(k)) > 1e-6:
            continue  # a point mass off the grid is no grid value of any sub-bin
        at = (k_first <= round(k)) & (round(k) <= k_last)
        if round(k) % per_whole == 0:
            wholes = wholes - at
        else:
            others = others - at
    return (wholes >= 1) & (others >= 1)


def _grid_indices(col: Column, in_bin: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """`_grid_span` as integer multiples of the grid step (exact arithmetic for whole numbers)."""
    step = 10.0**-col.decimals
    first, last = _grid_span(col, in_bin, bins)
    return np.rint(first / step).astype(np.int64), np.rint(last / step).astype(np.int64)


def _sub_bin_cells(col: Column, bins: int, whole_cells: bool) -> tuple[np.ndarray, np.ndarray]:
    """The sub-bin fine cells in order: each one's sub-bin, and its kind (0: the sub-bin's only cell,
    1: not at a whole number, 2: at a whole number; a split sub-bin's two cells are adjacent)."""
    sub_bins = bins * FINE_SPLIT
    split = whole_split(col, bins) if whole_cells else None
    if split is None or not split.any():
        return np.arange(sub_bins), np.zeros(sub_bins, dtype=np.int64)
    sub = np.repeat(np.arange(sub_bins), 1 + split)
    kind = np.zeros(len(sub), dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, sub[1:] != sub[:-1]])
    kind[starts[split]] = 1
    kind[starts[split] + 1] = 2
    return sub, kind


def fine_codes(col: Column, values: ArrayLike, bins: int = DEFAULT_BINS, whole_cells: bool = True) -> np.ndarray:
    """The fine cell of each value of a continuous column (int64, -1 for missing values): the nearest
    grid value's index, or the sub-bin (its whole-number cell when the value rounds to a whole number at
    the column's decimals and the sub-bin is split, `whole_split`), a point mass's own cell after them."""
    numbers = pd.to_numeric(pd.Series(np.asarray(values, dtype=object)), errors="coerce").to_numpy(np.float64)
    grid = value_grid(col)
    if grid is not None:
        step = 10.0**-col.decimals
        codes = np.clip(np.rint((np.nan_to_num(numbers) - grid[0]) / step), 0, len(grid) - 1).astype(np.int64)
    else:
        sub_bins = bins * FINE_SPLIT
        codes = _bin_of(col, numbers, sub_bins)
        sub, kind = _sub_bin_cells(col, bins, whole_cells)
        if kind.any():
            starts = np.searchsorted(sub, np.arange(sub_bins))
            whole = np.round(numbers, col.decimals) == np.rint(numbers)
            codes = starts[codes] + ((kind[starts[codes]] == 1) & whole)
        for k, mass in enumerate(col.point_masses):
            codes[numbers == mass] = len(sub) + k
    codes[~np.isfinite(numbers)] = MISSING
    return codes


def fine_parents(col: Column, bins: int = DEFAULT_BINS, whole_cells: bool = True) -> np.ndarray:
    """The coarse cell (`cell_codes`) each fine cell lies in: the nesting, from public facts only."""
    grid = value_grid(col)
    if grid is not None:
        return cell_codes(col, grid, bins)
    sub, _ = _sub_bin_cells(col, bins, whole_cells)
    return np.concatenate([sub // FINE_SPLIT, bins + np.arange(len(col.point_masses))])


def fine_whole(col: Column, bins: int = DEFAULT_BINS, whole_cells: bool = True) -> np.ndarray:
    """Which fine cells are a split sub-bin's "at a whole number" cell (`whole_split`)."""
    if value_grid(col) is not None:
        return np.zeros(fine_cell_count(col, bins), dtype=bool)
    _, kind = _sub_bin_cells(col, bins, whole_cells)
    return np.concatenate([kind == 2, np.zeros(len(col.point_masses), dtype=bool)])


def fine_cell_values(
    col: Column, fine: np.ndarray, rng: np.random.Generator, bins: int = DEFAULT_BINS, whole_cells: bool = True
) -> np.ndarray:
    """A value in each fine cell: the grid value itself, the point mass, or a uniform draw on the decimal
    grid within the sub-bin (its midpoint when it holds no grid value; callers check the coarse cell); in
    a split sub-bin, among its whole numbers or among its other grid values (point masses aside)."""
    fine = np.asarray(fine, dtype=np.int64)
    grid = value_grid(col)
    if grid is not None:
        return grid[fine]
    sub_bins = bins * FINE_SPLIT
    sub, kind = _sub_bin_cells(col, bins, whole_cells)
    in_sub = np.minimum(fine, len(sub) - 1)
    plain = Column(col.name, col.kind, bounds=col.bounds, decimals=col.decimals)
    values = np.asarray(cell_values(plain, sub[in_sub], rng, sub_bins), dtype=np.float64)
    for wanted in (1, 2):
        rows = np.flatnonzero((fine < len(sub)) & (kind[in_sub] == wanted))
        if len(rows):
            values[rows] = _split_draws(col, sub[in_sub[rows]], wanted == 2, rng, sub_bins)
    for k, mass in enumerate(col.point_masses):
        values[fine == len(sub) + k] = mass
    return values


def _split_draws(col: Column, sub: np.ndarray, whole: bool, rng: np.random.Generator, sub_bins: int) -> np.ndarray:
    """Uniform draws among each sub-bin's whole numbers (`whole`) or among its other grid values, a point
    mass replaced by its neighbour of the same kind. Grid values are counted in integer steps k (value k x
    step); the grid values that are no whole number are numbered without gaps by g(k) = k - floor(k / m),
    m steps per whole number, so one uniform index picks among them."""
    m = 10**col.decimals
    k_first, k_last = _grid_indices(col, sub, sub_bins)
    if whole:
        low, high = -(-k_first // m), k_last // m

        def value(i: np.ndarray) -> np.ndarray:
            return i.astype(np.float64)

    else:
        low, high = (k_first - 1) - (k_first - 1) // m + 1, k_last - k_last // m

        def value(i: np.ndarray) -> np.ndarray:
            k = (i - 1) // (m - 1) * m + (i - 1) % (m - 1) + 1
            return np.round(k * 10.0**-col.decimals, col.decimals)

    count = np.maximum(high - low + 1, 1)
    picked = low + np.minimum((rng.random(len(sub)) * count).astype(np.int64), count - 1)
    values = value(picked)
    for mass in col.point_masses:
        hit = values == mass
        picked = np.where(hit & (picked + 1 <= high), picked + 1, np.where(hit, picked - 1, picked))
        values = value(picked)
    return values


def shaped_cell_values(
    col: Column,
    codes: np.ndarray,
    shape: np.ndarray,
    rng: np.random.Generator,
    bins: int = DEFAULT_BINS,
    whole_cells: bool = True,
) -> np.ndarray:
    """Values for coarse cells of a continuous column, each landing in one of the cell's fine cells with
    probability proportional to `shape` (non-negative weights per fine cell, e.g. a noisy fine histogram
    clipped at 0; uniform over the cell's fine cells where they sum to 0). A value that does not code back
    to its cell (float edges, a sub-bin with no grid value) is drawn uniformly in the cell instead."""
    codes = np.asarray(codes, dtype=np.int64)
    parents = fine_parents(col, bins, whole_cells)
    weights = np.clip(np.nan_to_num(np.asarray(shape, dtype=np.float64)), 0.0, None)
    if weights.shape != parents.shape:
        raise ValueError(f"column {col.name!r}: a shape of {weights.size} fine cells, expected {parents.size}")
    # Per coarse cell, the fine cells in order and their cumulative weights (uniform where all are 0).
    order = np.argsort(parents, kind="stable")
    sorted_parents = parents[order]
    per_cell = np.bincount(parents, weights=weights, minlength=cell_count(col, bins))
    w = np.where(per_cell[sorted_parents] > 0, weights[order], 1.0)
    totals = np.bincount(sorted_parents, weights=w, minlength=cell_count(col, bins))
    starts = np.searchsorted(sorted_parents, np.arange(cell_count(col, bins)), side="left")
    cumulative = np.cumsum(w) - np.concatenate([[0.0], np.cumsum(totals)])[sorted_parents]
    # The drawn fine cell: the first of the cell's fine cells whose cumulative weight passes u x total.
    u = rng.random(len(codes)) * totals[codes]
    picked = np.empty(len(codes), dtype=np.int64)
    ends = np.searchsorted(sorted_parents, np.arange(cell_count(col, bins)), side="right")
    for cell in np.unique(codes):
        rows = np.flatnonzero(codes == cell)
        lo, hi = starts[cell], ends[cell]
        if hi <= lo:
            picked[rows] = -1
            continue
        at = np.searchsorted(cumulative[lo:hi], u[rows], side="right")
        picked[rows] = order[lo + np.minimum(at, hi - lo - 1)]
    values = np.asarray(cell_values(col, codes, rng, bins), dtype=np.float64)
    has_fine = picked >= 0
    if has_fine.any():
        drawn = np.asarray(fine_cell_values(col, picked[has_fine], rng, bins, whole_cells), dtype=np.float64)
        on_grid = np.abs(drawn - np.round(drawn, col.decimals)) <= 1e-9 * np.maximum(1.0, np.abs(drawn))
        fits = on_grid & (cell_codes(col, drawn, bins) == codes[has_fine])
        values[np.flatnonzero(has_fine)[fits]] = drawn[fits]
    return values


def frame_cells(columns: list[Column], frame: pd.DataFrame, bins: int = DEFAULT_BINS) -> np.ndarray:
    """Each row's cell in each of `columns` (rows x columns, int64)."""
    return (
        np.stack([cell_codes(col, frame[col.name].to_numpy(), bins) for col in columns], axis=1)
        if columns
        else np.zeros((len(frame), 0), dtype=np.int64)
    )
