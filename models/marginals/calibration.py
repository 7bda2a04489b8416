"""Calibrate synthetic rows to measured (noisy) marginals: post-processing, no privacy cost.

`calibrate` reads only a decoded synthetic table (from any generator), the public schema, the released
`MeasuredMarginals` (models/marginals/measure.py) and a public random generator: never a real row. Whatever it
returns is a function of DP outputs and public randomness, so it costs nothing beyond the generator's
and the measurement's epsilon.

Two steps, so that the generator's joint structure is kept where the marginals allow it:

1. Raking: iterative proportional fitting of one weight per synthetic row to every measured marginal
   (weights capped at `max_weight` times the mean so that a few rows are not copied hundreds of times),
   then systematic resampling of the requested number of rows by weight. Whole rows are kept, so every
   relation between columns that the generator learned survives within a row. Cells that no synthetic
   row occupies cannot be reached by weights.
2. Value updates (as PrivSyn's GUM): per measured marginal, rows of cells holding more than their target
   count are moved to cells holding fewer by changing only that marginal's columns in randomly chosen
   rows. For a marginal of k >= 2 columns, moves that change one column only come first (one column
   free, the others fixed), then unrestricted ones. Rounds go over the multi-column marginals, then over
   every measured column alone: the last pass leaves each column's counts at its rounded target exactly
   (a 1-way move changes no other column). This reaches cells no synthetic row had.

A changed value is drawn inside its new cell with `binning.cell_values` (a point mass exactly, a level as
itself, a bin's value uniformly among the bin's values on the column's decimals), or, for a continuous
column whose fine histogram was measured (`MeasuredMarginals.shapes`), where that histogram puts it. A drawn value that
`cell_codes` puts in another cell or that lies off the decimal grid (float edge cases of columns with
decimals, e.g. 0.6 drawn for [0.55, 0.6)) is redrawn (`_values_in_cells`). In a column without a measured
fine histogram, values the calibration did not move keep their exact synthetic value. In a column with one,
every row's value is then re-placed inside its cell by it, the rows' order inside the cell kept
(`_placed_by_rank`): a row left in its cell would otherwise keep the generator's shape there (a heap at a
round value spread over its cell). Targets leave out cells of a continuous column that hold no value on the column's
decimal grid (public: such a cell cannot be written), spreading their share over the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from dpsynth.models.data.binning import (
    cell_codes,
    cell_count,
    cell_values,
    decimal_grid,
    writable_cells,
)
from dpsynth.models.data.schema import Column, DatasetSchema
from dpsynth.models.errors import ConfigError
from dpsynth.models.marginals.measure import MeasuredMarginals, counts_of_cells, flat_cells, frame_codes
from dpsynth.models.marginals.shapes import ColumnShapes

RAKING_SWEEPS = 50
RAKING_TOLERANCE = 1e-4
MAX_WEIGHT = 10.0
ROUNDS = 4
# Redraws for values that rounding pushed out of their cell (a column's decimal grid is enumerated, to
# find the cells it can fill and to draw from them directly, when it has at most binning.MAX_GRID points).
_REDRAWS = 8


def calibrate(
    synthetic: pd.DataFrame,
    schema: DatasetSchema,
    measured: MeasuredMarginals,
    rng: np.random.Generator,
    rows: int | None = None,
    rounds: int = ROUNDS,
    max_weight: float = MAX_WEIGHT,
) -> pd.DataFrame:
    """`rows` rows (default: as many as `synthetic`) drawn from the synthetic rows and edited so that their
    marginals match the measured shares; columns as in `synthetic`. A schema id column is renumbered."""
    if len(synthetic) == 0:
        raise ConfigError("calibration needs at least one synthetic row")
    n_out = len(synthetic) if rows is None else int(rows)
    if n_out < 1:
        raise ConfigError(f"calibration returns at least one row, asked for {rows!r}")
    names = [name for name in schema.column_names if name in set(measured.columns)]
    columns = {name: schema.column(name) for name in names}
    original = frame_codes(schema, synthetic, names, measured.bins)
    writable = {name: writable_cells(col, measured.bins) for name, col in columns.items()}
    codes = np.stack([original[name] for name in names], axis=1) if names else np.zeros((len(synthetic), 0), int)
    codes = _fill_missing(codes, names, measured, writable, rng)

    # The multi-column marginals, then every measured column alone: (positions, shape, shares).
    positions = {name: j for j, name in enumerate(names)}
    fits = [
        ([positions[name] for name in m.columns], m.shape, m.table()) for m in measured.marginals if len(m.columns) > 1
    ]
    fits += [([j], (cell_count(columns[name], measured.bins),), measured.one_way(name)) for j, name in enumerate(names)]
    labels = [[names[j] for j in cols] for cols, _, _ in fits]
    proxies = {
        name: _proxy_cells(columns[name], np.bincount(codes[:, j], minlength=len(writable[name])) > 0, measured.bins)
        for j, name in enumerate(names)
    }
    weights = rake(
        codes,
        [cols for cols, _, _ in fits],
        [shape for _, shape, _ in fits],
        [
            _on_proxies(_target_shares(shares, label, writable), shape, label, proxies)
            for (_, shape, shares), label in zip(fits, labels, strict=False)
        ],
        max_weight,
    )
    picks = rng.permutation(systematic_resample(weights, n_out, rng))
    codes = codes[picks]
    copies = _later_copies(picks)
    targets = [
        _target_counts(shares, label, writable, n_out) for (_, _, shares), label in zip(fits, labels, strict=False)
    ]
    for _ in range(rounds):
        for (cols, shape, _), target in zip(fits, targets, strict=False):
            move_rows(codes, cols, shape, target, rng, copies)
    return _write(synthetic, schema, picks, codes, names, original, columns, measured, rng)


# -------------------------------------------------------------------------------------- targets


def _target_shares(shares: np.ndarray, marginal: Sequence[str], writable: dict[str, np.ndarray]) -> np.ndarray:
    """The measured shares (flat) with cells that cannot be written set to 0, renormalised."""
    table = np.asarray(shares, dtype=np.float64).copy()
    for axis, name in enumerate(marginal):
        index: list[slice | np.ndarray] = [slice(None)] * table.ndim
        index[axis] = ~writable[name]
        table[tuple(index)] = 0.0
    flat = table.ravel()
    return flat / flat.sum() if flat.sum() > 0 else np.full(flat.size, 1.0 / flat.size)


def _target_counts(
    shares: np.ndarray, marginal: Sequence[str], writable: dict[str, np.ndarray], rows: int
) -> np.ndarray:
    """Integer counts summing to `rows` from the shares (largest remainders)."""
    return largest_remainders(_target_shares(shares, marginal, writable) * rows, rows)


def largest_remainders(exact: np.ndarray, rows: int) -> np.ndarray:
    """Whole counts summing to `rows` from `exact` ones that sum to it: each rounded down, then the largest
    remainders (the first among ties) rounded up."""
    counts = np.floor(exact).astype(np.int64)
    short = rows - int(counts.sum())
    if short > 0:
        counts[np.argsort(counts - exact, kind="stable")[:short]] += 1
    return counts


def _proxy_cells(col: Column, occupied: np.ndarray, bins: int) -> np.ndarray:
    """For raking, where each cell's target share goes: the cell itself when synthetic rows occupy it;
    for a continuous column's empty cell, the nearest occupied cell (a point mass sits at the bin that
    holds its value), whose rows the value updates later move into it. A categorical column's empty
    level has no neighbour: its share stays (raking spreads it over the other levels)."""
    proxy = np.arange(len(occupied))
    if not col.is_continuous or occupied.all() or not occupied.any():
        return proxy
    plain = Column(col.name, col.kind, bounds=col.bounds, decimals=col.decimals)
    position = np.concatenate([np.arange(bins), cell_codes(plain, np.asarray(col.point_masses, float), bins)])
    candidates = np.nonzero(occupied)[0]
    distance = np.abs(position[:, None] - position[candidates][None, :]).astype(np.float64)
    distance += (candidates[None, :] >= bins) * 0.5  # a bin before a point mass at the same place
    nearest = candidates[np.argmin(distance, axis=1)]
    return np.where(occupied, proxy, nearest)


def _on_proxies(
    shares: np.ndarray, shape: tuple[int, ...], marginal: Sequence[str], proxies: dict[str, np.ndarray]
) -> np.ndarray:
    """The flat shares with each column's cells gathered onto their proxy cells."""
    table = shares.reshape(shape)
    for axis, name in enumerate(marginal):
        moved = np.moveaxis(table, axis, 0)
        gathered = np.zeros_like(moved)
        np.add.at(gathered, proxies[name], moved)
        table = np.moveaxis(gathered, 0, axis)
    return table.ravel()


def _fill_missing(
    codes: np.ndarray,
    names: list[str],
    measured: MeasuredMarginals,
    writable: dict[str, np.ndarray],
    rng: np.random.Generator,
) -> np.ndarray:
    """A cell, drawn from the measured 1-way shares, for every missing or undeclared synthetic value."""
    codes = codes.copy()
    for j, name in enumerate(names):
        missing = codes[:, j] < 0
        if missing.any():
            shares = _target_shares(measured.one_way(name), (name,), writable)
            codes[missing, j] = rng.choice(len(shares), size=int(missing.sum()), p=shares)
    return codes


# ---------------------------------------------------------------------------------------- raking


def rake(
    codes: np.ndarray,
    marginals: Sequence[list[int]],
    shapes: Sequence[tuple[int, ...]],
    shares: Sequence[np.ndarray],
    max_weight: float = MAX_WEIGHT,
    sweeps: int = RAKING_SWEEPS,
) -> np.ndarray:
    """Row weights (summing to 1) whose weighted marginals approach `shares` (flat, row-major over the
    cells `shapes` of the columns at `marginals`' positions in `codes`): raking, each weight capped at
    about `max_weight` times the mean. Rows in cells of share 0 get weight 0."""
    n = len(codes)
    cells = [flat_cells(codes[:, cols], shape) for cols, shape in zip(marginals, shapes, strict=False)]
    weights = np.full(n, 1.0 / n)
    cap = max_weight / n
    for _ in range(sweeps):
        worst = 0.0
        for flat, target in zip(cells, shares, strict=False):
            current = counts_of_cells(flat, target.size, weights)
            worst = max(worst, 0.5 * float(np.abs(current / current.sum() - target).sum()))
            ratio = np.divide(target, current, out=np.zeros_like(target), where=current > 0)
            updated = np.minimum(weights * ratio[flat], cap)
            if updated.sum() > 0:  # else every row sits in cells of share 0: leave them to the value updates
                weights = updated / updated.sum()
        if worst <= RAKING_TOLERANCE:
            break
    return weights


def systematic_resample(weights: np.ndarray, rows: int, rng: np.random.Generator) -> np.ndarray:
    """`rows` row indices drawn by systematic resampling: row i appears floor or ceil of rows x w_i times
    (the lowest-variance unbiased resampling)."""
    cumulative = np.cumsum(weights / weights.sum())
    points = (rng.random() + np.arange(rows)) / rows
    return np.minimum(np.searchsorted(cumulative, points, side="right"), len(weights) - 1)


# -------------------------------------------------------------------------------- value updates


def move_rows(
    codes: np.ndarray,
    cols: list[int],
    shape: tuple[int, ...],
    target: np.ndarray,
    rng: np.random.Generator,
    copies: np.ndarray | None = None,
) -> int:
    """Change the codes at columns `cols` of randomly chosen rows of over-full cells so that the
    marginal's counts reach `target` (flat, row-major; summing to the number of rows). Moves that change
    one column only come first, then any. Rows flagged in `copies` (a resampled row's second and later
    copies) are moved first, which undoes duplicates rather than editing rows the generator made; a moved
    row is no longer a copy. Edits `codes` and `copies` in place; returns how many rows moved."""
    if copies is None:
        copies = np.zeros(len(codes), dtype=bool)
    moved = 0
    for free in [*range(len(cols)), None] if len(cols) > 1 else [None]:
        flat = flat_cells(codes[:, cols], shape)
        counts = np.bincount(flat, minlength=target.size)
        over, under = np.maximum(counts - target, 0), np.maximum(target - counts, 0)
        if not over.any():
            break
        group = _groups(shape, free)
        rows, cells = _matched_moves(flat, over, under, group, copies, rng)
        if len(rows):
            codes[np.ix_(rows, np.asarray(cols))] = np.stack(np.unravel_index(cells, shape), axis=1)
            copies[rows] = False
            moved += len(rows)
    return moved


def _groups(shape: tuple[int, ...], free: int | None) -> np.ndarray:
    """Per flat cell, the group within which a move may go: the cell's codes on every column but
    `free` (so a move changes that column only), or one group for all when `free` is None."""
    size = math.prod(shape)
    if free is None:
        return np.zeros(size, dtype=np.int64)
    index = np.unravel_index(np.arange(size), shape)
    kept = [index[a] for a in range(len(shape)) if a != free]
    return np.ravel_multi_index(kept, [shape[a] for a in range(len(shape)) if a != free])


def _matched_moves(
    flat: np.ndarray,
    over: np.ndarray,
    under: np.ndarray,
    group: np.ndarray,
    copies: np.ndarray,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows to move and their new cells: in each group, as many moves as both its surplus and its
    deficit allow; sources are rows of over-full cells (copies first, else at random), destinations
    the missing places in random order."""
    order = np.lexsort((rng.random(len(flat)), ~copies, flat))
    sorted_cells = flat[order]
    rank = np.arange(len(flat)) - np.searchsorted(sorted_cells, sorted_cells, side="left")
    sources = order[rank < over[sorted_cells]]
    slots = np.repeat(np.arange(len(under)), under)
    source_group, slot_group = group[flat[sources]], group[slots]
    sources, source_group = _sorted_by_group(sources, source_group, ~copies[sources], rng)
    slots, slot_group = _sorted_by_group(slots, slot_group, np.zeros(len(slots), dtype=bool), rng)
    groups = int(group.max()) + 1
    allowed = np.minimum(np.bincount(source_group, minlength=groups), np.bincount(slot_group, minlength=groups))
    keep_sources = _rank_in_group(source_group) < allowed[source_group]
    keep_slots = _rank_in_group(slot_group) < allowed[slot_group]
    return sources[keep_sources], slots[keep_slots]


def _sorted_by_group(
    items: np.ndarray, groups: np.ndarray, later: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Items sorted by group, then those not `later` first, then at random."""
    order = np.lexsort((rng.random(len(items)), later, groups))
    return items[order], groups[order]


def _later_copies(picks: np.ndarray) -> np.ndarray:
    """True for every occurrence of a picked row after its first."""
    first = np.zeros(len(picks), dtype=bool)
    first[np.unique(picks, return_index=True)[1]] = True
    return ~first


def _rank_in_group(sorted_groups: np.ndarray) -> np.ndarray:
    return np.arange(len(sorted_groups)) - np.searchsorted(sorted_groups, sorted_groups, side="left")


# ----------------------------------------------------------------------------------------- output


def _write(
    synthetic: pd.DataFrame,
    schema: DatasetSchema,
    picks: np.ndarray,
    codes: np.ndarray,
    names: list[str],
    original: dict[str, np.ndarray],
    columns: dict[str, Column],
    measured: MeasuredMarginals,
    rng: np.random.Generator,
) -> pd.DataFrame:
    """The picked rows, with new values drawn only where a row's cell changed; then, in every column with
    a measured fine histogram, every row's value re-placed inside its cell by it (`_placed_by_rank`)."""
    out = synthetic.iloc[picks].reset_index(drop=True)
    shapes = measured.shapes
    for j, name in enumerate(names):
        changed = codes[:, j] != original[name][picks]
        if changed.any():
            values = _values_in_cells(columns[name], codes[changed, j], rng, measured.bins, shapes)
            out[name] = _merged(out[name].to_numpy(), changed, values)
        if shapes is not None and name in shapes.counts:
            current = pd.to_numeric(out[name], errors="coerce").to_numpy(np.float64)
            placed = _placed_by_rank(columns[name], codes[:, j], current, shapes, rng, measured.bins)
            out[name] = _merged(out[name].to_numpy(), np.ones(len(out), dtype=bool), placed)
    if schema.id_column and schema.id_column in out.columns:
        out[schema.id_column] = np.arange(len(out), dtype=np.int64)
    return out


def _placed_by_rank(
    col: Column, codes: np.ndarray, values: np.ndarray, shapes: ColumnShapes, rng: np.random.Generator, bins: int
) -> np.ndarray:
    """Every row's value of a continuous column re-placed inside its cell (`codes`) by the column's measured
    fine histogram (`ColumnShapes.shape`: denoised), keeping the rows' order inside each cell.

    Why every row: a row the value updates left keeps the generator's value, which follows the
    generator's shape inside the cell, not the measured one (a heap at 120 stays a plateau over its
    cell). Within a cell, rows in the order of their current value (ties at random) take the cell's fine
    cells by systematic allocation: the rank r of n takes the fine cell whose cumulative share passes
    (r + u) / n, one u per cell, so each fine cell gets floor or ceil of n times its share and a fine
    cell that is one value (a heap) comes out as that value repeated. Values are then drawn inside their
    fine cells (`binning.fine_cell_values`; one that does not code back to its cell or lies off the decimal
    grid is drawn in the cell as `_values_in_cells` does) and handed out in sorted order, so a row's value
    never falls below that of a row the generator put lower in the same cell: the order, hence the
    dependence on other columns, is kept. Reads the released noisy counts and `rng` only. A cell with no
    fine cell (a point mass off the decimal grid) keeps its values."""
    parents = shapes.parents(col)
    weights = shapes.shape(col)
    placed = np.asarray(values, dtype=np.float64).copy()
    rows = np.flatnonzero(codes >= 0)
    order = rows[np.lexsort((rng.random(len(rows)), placed[rows], codes[rows]))]
    cells = codes[order]
    for cell in np.unique(cells):
        members = np.flatnonzero(parents == cell)
        if len(members) == 0:
            continue
        at = np.flatnonzero(cells == cell)
        share = weights[members] if weights[members].sum() > 0 else np.ones(len(members))
        cumulative = np.cumsum(share) / share.sum()
        points = (np.arange(len(at)) + rng.random()) / len(at)
        fine = members[np.minimum(np.searchsorted(cumulative, points, side="right"), len(members) - 1)]
        drawn = np.asarray(shapes.fine_values(col, fine, rng), dtype=np.float64)
        in_cell = np.full(len(at), cell, dtype=np.int64)
        bad = ~_in_cell(col, drawn, in_cell, bins)
        if bad.any():
            drawn[bad] = _values_in_cells(col, in_cell[bad], rng, bins)
        placed[order[at]] = np.sort(drawn)
    return placed


def _values_in_cells(
    col: Column, codes: np.ndarray, rng: np.random.Generator, bins: int, shapes: ColumnShapes | None = None
) -> np.ndarray:
    """Values inside the given cells: placed by the column's measured fine histogram when `shapes` holds
    it (binning.shaped_cell_values), else uniform (binning.cell_values). A drawn value that rounding moved
    out of its cell, or off the column's decimal grid, is redrawn uniformly; after a few tries it is drawn
    from the cell's grid values directly when the grid is small enough to list."""
    if not col.is_continuous:
        return cell_values(col, codes, rng, bins)
    if shapes is not None and col.name in shapes.counts:
        values = shapes.values(col, codes, rng)
    else:
        values = cell_values(col, codes, rng, bins)
    values = np.asarray(values, dtype=np.float64)
    for _ in range(_REDRAWS):
        bad = ~_in_cell(col, values, codes, bins)
        if not bad.any():
            return values
        values[bad] = cell_values(col, codes[bad], rng, bins)
    bad = ~_in_cell(col, values, codes, bins)
    grid = decimal_grid(col) if bad.any() else None
    if grid is not None:
        values[bad] = _grid_draws(col, grid, codes[bad], rng, bins, values[bad])
    return values


def _in_cell(col: Column, values: np.ndarray, codes: np.ndarray, bins: int) -> np.ndarray:
    on_grid = np.abs(values - np.round(values, col.decimals)) <= 1e-9 * np.maximum(1.0, np.abs(values))
    return on_grid & (cell_codes(col, values, bins) == codes)


def _grid_draws(
    col: Column, grid: np.ndarray, codes: np.ndarray, rng: np.random.Generator, bins: int, fallback: np.ndarray
) -> np.ndarray:
    """A uniform draw among the grid values of each code's cell (the fallback where the cell has none)."""
    grid_codes = cell_codes(col, grid, bins)
    order = np.argsort(grid_codes, kind="stable")
    grid, grid_codes = grid[order], grid_codes[order]
    start = np.searchsorted(grid_codes, codes, side="left")
    size = np.searchsorted(grid_codes, codes, side="right") - start
    picked = grid[np.minimum(start + (rng.random(len(codes)) * size).astype(np.int64), len(grid) - 1)]
    return np.where(size > 0, picked, fallback)


def _merged(old: np.ndarray, changed: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The column with `values` at the changed rows, in the column's own dtype when the values fit it
    (integers stay integers), else float or object."""
    if np.issubdtype(old.dtype, np.integer):
        try:
            numbers = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            numbers = None
        if numbers is not None and np.all(numbers == np.round(numbers)):
            merged = old.copy()
            merged[changed] = numbers.astype(old.dtype)
            return merged
        old = old.astype(np.float64 if numbers is not None else object)
    elif np.issubdtype(old.dtype, np.floating):
        try:
            numbers = np.asarray(values, dtype=np.float64)
            merged = old.copy()
            merged[changed] = numbers
            return merged
        except (TypeError, ValueError):
            old = old.astype(object)
    merged = old.astype(object) if old.dtype != object else old.copy()
    merged[changed] = values
    return merged


# -------------------------------------------------------------------------------------- checking


def marginal_distances(frame: pd.DataFrame, schema: DatasetSchema, measured: MeasuredMarginals) -> dict:
    """Total-variation distance between the frame's shares and the measured shares, per marginal (rows
    with a missing cell left out): how closely a table follows the measurements."""
    names = measured.columns
    codes = frame_codes(schema, frame, names, measured.bins)
    out = {}
    for marginal in measured.marginals:
        stacked = np.stack([codes[name] for name in marginal.columns], axis=1)
        counts = counts_of_cells(flat_cells(stacked, marginal.shape), len(marginal.shares))
        shares = counts / max(counts.sum(), 1.0)
        out[marginal.columns] = 0.5 * float(np.abs(shares - np.asarray(marginal.shares)).sum())
    return out


__all__ = ["calibrate", "marginal_distances", "move_rows", "rake", "systematic_resample"]
