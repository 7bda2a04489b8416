"""Column shapes: each continuous column's fine 1-way histogram (dpsynth.models.data.binning's fine cells),
measured once by the Gaussian mechanism, so that a value decoded from a coarse cell lands where the
column's rows are inside it (a heap at 40 hours stays at 40) rather than uniformly over the cell.

Cost: a declared share of a release's zCDP rho (MST's and AIM's `shape_share` of their rho, the measured
marginals' `shape_share` of theirs), spread equally over the continuous columns. Each histogram is a count
vector that one replaced row moves by L2 sqrt(2), exactly as a measured marginal
(dpsynth.models.marginals.measure): at noise multiplier sigma (std sigma sqrt(2)) it costs rho 1 / (2 sigma^2)
replace-one, 1 / (4 sigma^2) add/remove-one (`measure.rho_of`). The share is inside the rho the one
accountant already composes, so a release's epsilon does not move with it: the other measurements get
less. The noise comes from the run's secret (purpose `PURPOSE`), each draw rounded to an integer.

Sampling imports this module (a released model holds its shapes), so the measurement's modules are
imported inside the functions that measure or cost. Decoding reads only the noisy counts and the public noise
std (post-processing), denoises them, clips at 0 and draws a fine cell with probability proportional to the
result (`binning.shaped_cell_values`). Two rules (`DENOISERS`; a release's shapes name theirs):

* `neighbour_denoised` (`NEIGHBOURS`, what a release measures now): a heap (a count more than
  `HEAP_STDS` noise stds off the median of its neighbours) is kept as measured; every other fine cell
  gets a smooth level from the non-heap counts within `HALF_WINDOW` fine cells, itself shrunk towards the
  coarse cell's mean as far as its own noise says, and its deviation from that level is shrunk by
  positive-part James-Stein. On the generated census tables the noise of the fine counts, not the coarse
  counts, was most of the worst numeric column's error, and a cell of four ages has too few counts to
  average its noise away alone (docs/utility-study.md section 18).
* `denoised` (`CELL_MEAN`, shapes released before, whose dict lacks the key): within each coarse cell
  the fine counts are shrunk towards their mean by the positive-part James-Stein factor
  1 - (m - 3) std^2 / (sum of squared deviations). A heap stands far above the noise and is kept; a cell
  whose fine counts differ by no more than noise would stays uniform (on generated tables clipping alone
  made smooth columns worse than uniform: a wide column's 16 sub-bins then hold fewer rows than one noise
  std).

Under both a decimal column's whole-number fine cells (`binning.whole_split`) are read apart from the
cell's other fine cells: a whole-number cell holds one grid value and the others four or five, so one
common mean would manufacture whole values in a column that has few (docs/utility-study.md section 13).
A release's shapes say which fine-cell layout they were measured on (`whole_cells`) and which rule reads
them (`denoiser`); older ones lack the keys and decode as they did.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dpsynth.models.data.binning import (
    fine_cell_count,
    fine_cell_values,
    fine_codes,
    fine_parents,
    fine_whole,
    shaped_cell_values,
)
from dpsynth.models.data.schema import Column
from dpsynth.models.errors import ConfigError

PURPOSE = "shapes"
# The neighbours' denoiser: how many fine cells either side make a cell's smooth level, and how many
# noise stds off their median make a heap (chosen on generated tables: docs/utility-study.md section 18).
HALF_WINDOW = 8
HEAP_STDS = 3.0
# How decoding reads a release's noisy fine counts (`ColumnShapes.denoiser`): the earlier rule, each
# coarse cell towards its own mean, and the current one, with the neighbouring fine cells.
CELL_MEAN = "cell-mean"
NEIGHBOURS = "neighbours"


def shaped_columns(columns: Sequence[Column]) -> tuple[Column, ...]:
    """The columns that get a shape: every continuous one (public: the schema's kinds)."""
    return tuple(col for col in columns if col.is_continuous)


def shape_noise_multiplier(rho: float, columns: int) -> float:
    """The noise multiplier of each of `columns` fine histograms that together cost `rho` (replace-one)."""
    from dpsynth.models.marginals.measure import noise_multiplier_for  # measuring only: samplers stay light

    if not rho > 0 or not math.isfinite(rho) or columns < 1:
        raise ConfigError(f"column shapes need rho > 0 and at least one column, got rho {rho!r}, {columns} columns")
    return noise_multiplier_for(rho / columns)


@dataclass(frozen=True)
class ColumnShapes:
    """The released fine histograms: per column name, its noisy counts (the Gaussian mechanism's output,
    one per fine cell), all at `noise_multiplier`, over fine cells of `bins` coarse bins. `whole_cells`:
    the fine cells give a whole number of a decimal column its own cell (`binning.whole_split`); shapes
    released before that layout (their dict lacks the key) have it False and decode as they did.
    `denoiser`: how decoding reads the noisy counts (`DENOISERS`); shapes released before `NEIGHBOURS`
    (their dict lacks the key) keep `CELL_MEAN` and decode as they did."""

    def __post_init__(self) -> None:
        if self.denoiser not in DENOISERS:
            raise ConfigError(f"column shapes' denoiser is one of {sorted(DENOISERS)}, got {self.denoiser!r}")

    counts: dict[str, tuple[float, ...]]
    noise_multiplier: float
    bins: int
    whole_cells: bool = True
    denoiser: str = NEIGHBOURS
    # `shape`'s weights per column, denoised once: sampling reads every shape for each batch of rows.
    _shapes: dict[Column, np.ndarray] = field(default_factory=dict, init=False, repr=False, compare=False)

    def rho(self, adjacency: str = "replace-one") -> float:
        """What the measurement cost: one Gaussian count vector per column."""
        from dpsynth.models.marginals.measure import rho_of

        return len(self.counts) * rho_of(self.noise_multiplier, adjacency) if self.counts else 0.0

    @property
    def noise_std(self) -> float:
        return self.noise_multiplier * math.sqrt(2.0)  # the marginals' convention: std = sigma x sensitivity

    def parents(self, col: Column) -> np.ndarray:
        """The coarse cell of each of the column's fine cells, in this release's layout."""
        return fine_parents(col, self.bins, self.whole_cells)

    def shape(self, col: Column) -> np.ndarray:
        """The column's weights per fine cell: its noisy counts denoised by this release's rule (the
        whole-number cells apart from the others: the denoisers' `whole`). Computed once per column, and
        read-only."""
        if col not in self._shapes:
            weights = DENOISERS[self.denoiser](
                np.asarray(self.counts[col.name], dtype=np.float64),
                self.parents(col),
                self.noise_std,
                fine_whole(col, self.bins, self.whole_cells),
            )
            weights.flags.writeable = False
            self._shapes[col] = weights
        return self._shapes[col]

    def values(self, col: Column, codes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Values for a continuous column's coarse cells, placed by its shape (`binning.shaped_cell_values`)."""
        return shaped_cell_values(col, codes, self.shape(col), rng, self.bins, self.whole_cells)

    def fine_values(self, col: Column, fine: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """A value in each of the given fine cells (`binning.fine_cell_values`, this release's layout)."""
        return fine_cell_values(col, fine, rng, self.bins, self.whole_cells)

    def to_dict(self) -> dict:
        return {
            "counts": {name: [float(v) for v in c] for name, c in self.counts.items()},
            "noise_multiplier": float(self.noise_multiplier),
            "bins": int(self.bins),
            "whole_cells": bool(self.whole_cells),
            "denoiser": self.denoiser,
        }

    @classmethod
    def from_dict(cls, raw: dict) -> ColumnShapes:
        keys = {"counts", "noise_multiplier", "bins"}
        # Without "whole_cells": shapes released before whole numbers had fine cells of their own; without
        # "denoiser": before the neighbours' denoiser (both keys came in that order).
        allowed = (keys, keys | {"whole_cells"}, keys | {"whole_cells", "denoiser"})
        if not isinstance(raw, dict) or set(raw) not in allowed:
            raise ConfigError(
                f"column shapes have exactly the keys {sorted(keys | {'whole_cells', 'denoiser'})}, got {raw!r}"
            )
        whole_cells = raw.get("whole_cells", False)
        if not isinstance(whole_cells, bool):
            raise ConfigError(f"column shapes' whole_cells is true or false, got {whole_cells!r}")
        return cls(
            {str(n): tuple(float(v) for v in c) for n, c in raw["counts"].items()},
            float(raw["noise_multiplier"]),
            int(raw["bins"]),
            whole_cells,
            str(raw.get("denoiser", CELL_MEAN)),
        )


def denoised(noisy: np.ndarray, parents: np.ndarray, std: float, whole: np.ndarray | None = None) -> np.ndarray:
    """Fine counts shrunk, within each coarse cell (`parents`), towards the cell's mean count by the
    positive-part James-Stein factor max(0, 1 - max(m - 3, 1) std^2 / SS) (m fine cells, SS their squared
    deviations from the mean), then clipped at 0. `whole` (per fine cell): the whole-number cells are
    shrunk apart from the cell's other fine cells, towards their own mean (a whole-number cell holds one
    grid value, the others several: one common mean would put whole numbers where the rows had none).
    Post-processing of the noisy counts and the public std."""
    weights = np.asarray(noisy, dtype=np.float64).copy()
    groups = np.asarray(parents, dtype=np.int64)
    if whole is not None:
        groups = groups * 2 + np.asarray(whole, dtype=np.int64)
    for group in np.unique(groups):
        members = np.flatnonzero(groups == group)
        if len(members) < 2:
            continue
        mean = weights[members].mean()
        spread = float(((weights[members] - mean) ** 2).sum())
        shrink = max(0.0, 1.0 - max(len(members) - 3, 1) * std**2 / spread) if spread > 0 else 0.0
        weights[members] = mean + shrink * (weights[members] - mean)
    return np.clip(weights, 0.0, None)


def _running_median(y: np.ndarray, half: int) -> np.ndarray:
    """Each position's median of the values within `half` positions of it (fewer at the ends). The full
    windows in one call: one `np.median` per position made sampling a column's shape cost milliseconds, and
    every checkpoint's sampling reads every shape."""
    y = np.asarray(y, dtype=np.float64)
    out = np.empty(len(y), dtype=np.float64)
    width = 2 * half + 1
    if len(y) >= width:
        out[half : len(y) - half] = np.median(np.lib.stride_tricks.sliding_window_view(y, width), axis=1)
        edges = [*range(half), *range(len(y) - half, len(y))]
    else:
        edges = list(range(len(y)))
    for i in edges:
        out[i] = np.median(y[max(i - half, 0) : i + half + 1])
    return out


def _window_mean(y: np.ndarray, keep: np.ndarray, half: int) -> np.ndarray:
    """Each position's mean of the kept values within `half` positions of it (itself included)."""
    sums = np.r_[0.0, np.cumsum(np.where(keep, y, 0.0))]
    kept = np.r_[0, np.cumsum(keep)]
    at = np.arange(len(y))
    lo, hi = np.maximum(at - half, 0), np.minimum(at + half + 1, len(y))
    n = kept[hi] - kept[lo]
    return np.where(n > 0, (sums[hi] - sums[lo]) / np.maximum(n, 1), y)


def _shrunk(values: np.ndarray, noise_var: float) -> np.ndarray:
    """`values`' deviations from their mean shrunk by the positive-part James-Stein factor
    1 - noise_var / (their squared deviations)."""
    mean = values.mean()
    spread = float(((values - mean) ** 2).sum())
    factor = max(0.0, 1.0 - noise_var / spread) if spread > 0 else 0.0
    return mean + factor * (values - mean)


def neighbour_denoised(
    noisy: np.ndarray,
    parents: np.ndarray,
    std: float,
    whole: np.ndarray | None = None,
    half: int = HALF_WINDOW,
    heap: float = HEAP_STDS,
    anchored: bool = True,
) -> np.ndarray:
    """Fine counts denoised with their neighbours (docs/utility-study.md section 18). The fine cells of
    coarse cells that have more than one (point masses aside), in order, the whole-number cells apart
    from the others:

    * a heap is a count more than `heap` stds off the median of the `half` cells either side of it: kept
      as measured (a heap at 40 hours stands hundreds of stds above its neighbours);
    * every other cell's smooth level is the mean of the non-heap counts within `half` cells (noise std
      about std / sqrt(2 half + 1), where the cell mean has std / sqrt(4) in a 4-value cell of ages),
      its deviation from the levels' mean in the coarse cell shrunk by positive-part James-Stein on that
      noise (a sparse column's level stays flat, a slope across the cell is kept), and (`anchored`) moved
      so that the cell's non-heap levels add up to its non-heap counts: the neighbours shape the cell,
      they do not move rows between its heap and the rest (unanchored, low draws beside a heap at 65 kg
      gave it 0.166 of a fitted test table's rows, against 0.150 by the cell-mean rule and 0.137 real);
    * each count's deviation from its level is shrunk, within the coarse cell, by positive-part
      James-Stein on the noise std.

    Clipped at 0. Post-processing of the noisy counts and the public std only."""
    weights = np.asarray(noisy, dtype=np.float64).copy()
    groups = np.asarray(parents, dtype=np.int64) * 2
    if whole is not None:
        groups = groups + np.asarray(whole, dtype=np.int64)
    shared = np.bincount(groups)[groups] >= 2
    for kind in (0, 1):
        run = np.flatnonzero(shared & (groups % 2 == kind))
        if len(run) < 2:
            continue
        y, cells = weights[run], groups[run]
        heaps = np.abs(y - _running_median(y, half)) > heap * std
        level = _window_mean(y, ~heaps, half)
        at = np.arange(len(y))
        window = np.minimum(at + half + 1, len(y)) - np.maximum(at - half, 0)
        out = y.copy()
        for cell in np.unique(cells):
            plain = np.flatnonzero((cells == cell) & ~heaps)
            if len(plain) == 0:
                continue
            smooth = _shrunk(level[plain], float((std**2 / window[plain]).sum()))
            if anchored:
                smooth = smooth - smooth.mean() + y[plain].mean()
            residual = y[plain] - smooth
            spread = float((residual**2).sum())
            factor = max(0.0, 1.0 - len(plain) * std**2 / spread) if spread > 0 else 0.0
            out[plain] = smooth + factor * residual
        weights[run] = out
    return np.clip(weights, 0.0, None)


def measure_shapes(
    frame: pd.DataFrame, columns: Sequence[Column], sigma: float, noise: np.random.Generator, bins: int
) -> ColumnShapes:
    """Every continuous column's fine histogram of `frame` plus Gaussian noise at noise multiplier `sigma`
    (`shape_noise_multiplier`: rho / columns each). Missing values are counted in no cell (a row's absence
    only lowers a count)."""
    shaped = shaped_columns(columns)
    exact = {}
    for col in shaped:
        if col.name not in frame.columns:
            raise ConfigError(f"the table has no column {col.name!r}, whose shape is measured")
        codes = fine_codes(col, frame[col.name].to_numpy(), bins)
        exact[col.name] = np.bincount(codes[codes >= 0], minlength=fine_cell_count(col, bins))
    return noisy_shapes(exact, shaped, sigma, noise, bins)


def noisy_shapes(
    exact: dict[str, np.ndarray], columns: Sequence[Column], sigma: float, noise: np.random.Generator, bins: int
) -> ColumnShapes:
    """`measure_shapes` from the exact fine histograms (by column name), however they were counted: the
    noise is drawn here, once, in the columns' order."""
    from dpsynth.models.marginals.measure import L2_SENSITIVITY

    counts = {}
    for col in shaped_columns(columns):
        histogram = np.asarray(exact[col.name]).astype(np.float64)
        if histogram.shape != (fine_cell_count(col, bins),):
            raise ConfigError(
                f"column {col.name!r}: a fine histogram of {histogram.size} cells, expected "
                f"{fine_cell_count(col, bins)} (counts from an earlier version of the fine cells: count again)"
            )
        noisy = histogram + np.rint(noise.normal(0.0, sigma * L2_SENSITIVITY, histogram.shape))
        counts[col.name] = tuple(float(v) for v in noisy)
    return ColumnShapes(counts, sigma, bins)


DENOISERS: dict[str, Callable[..., np.ndarray]] = {CELL_MEAN: denoised, NEIGHBOURS: neighbour_denoised}

__all__ = [
    "CELL_MEAN",
    "DENOISERS",
    "NEIGHBOURS",
    "neighbour_denoised",
    "PURPOSE",
    "ColumnShapes",
    "denoised",
    "measure_shapes",
    "noisy_shapes",
    "shape_noise_multiplier",
    "shaped_columns",
]
