"""A numeric column's shape as an analyst sees it, scored against the real table: cells at the real
table's quantiles, and the Kolmogorov-Smirnov distance.

Bins of the public bounds (`dpsynth.models.data.binning`) are what a release measures; they cannot see a
shape inside a bin. Hours worked, bounds 1 to 99: 47% of the rows say exactly 40, and a release that
spreads them over the bin [35.3, 40.2) has the same public-bin shares as one that keeps the spike. Cells
cut at the real table's quantiles see it, because the real rows decide where the cells are: internal
figures only, like every score against real rows (they never reach a bundle or the registry).

Ties. Quantile edges of a heaped column coincide (20 quantiles of hours, 8 of them at 40), so the cells
are intervals of values, never split a value, and a value that alone holds at least one quantile cell's
share of the rows (1/`cells`) is a heap with a cell of its own, as is every declared point mass; the
other values are cut at `cells` quantiles. Taking out a heap raises the others' shares (a value at 4% of
all rows holds 7.5% of the rest once a 47% heap is out), so heaps are found until none is left. Values
are compared at the column's declared decimals, the grid a release writes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from dpsynth.models.data.schema import Column

# Cells cut at the real table's quantiles per numeric column (beside one per heap): what an analyst's
# histogram shows, and the number of cells the figures were scored on.
QUANTILE_CELLS = 20
MISSING = -1


def _numbers(values: ArrayLike, decimals: int) -> np.ndarray:
    """Values as floats at the column's decimals (NaN for missing or non-numbers)."""
    numbers = pd.to_numeric(pd.Series(np.asarray(values, dtype=object)), errors="coerce").to_numpy(np.float64)
    return np.round(numbers, decimals)


@dataclass(frozen=True)
class QuantileCells:
    """A numeric column's cells from its real values: intervals (-inf, e1], (e1, e2], ..., (e_last, inf)
    between the distinct `edges`, then one cell per heap value (a value equal to a heap goes to its cell,
    not to the interval it lies in)."""

    decimals: int
    edges: np.ndarray  # ascending, distinct
    heaps: np.ndarray  # ascending: declared point masses and values holding at least one cell's share

    @property
    def size(self) -> int:
        return len(self.edges) + 1 + len(self.heaps)

    def codes(self, values: ArrayLike) -> np.ndarray:
        """The cell of each value (int64; MISSING for missing values)."""
        numbers = _numbers(values, self.decimals)
        codes = np.searchsorted(self.edges, numbers, side="left").astype(np.int64)
        for k, heap in enumerate(self.heaps):
            codes[numbers == heap] = len(self.edges) + 1 + k
        codes[~np.isfinite(numbers)] = MISSING
        return codes

    def labels(self) -> list[str]:
        """A readable name per cell: "(a, b]" for an interval, "=value" for a heap."""
        bounds = [-np.inf, *self.edges, np.inf]
        intervals = [f"({a:g}, {b:g}]" for a, b in itertools.pairwise(bounds)]
        return intervals + [f"={heap:g}" for heap in self.heaps]


def quantile_cells(col: Column, real_values: ArrayLike, cells: int = QUANTILE_CELLS) -> QuantileCells:
    """The column's cells at the quantiles of its real values (missing values ignored): heaps first, then
    `cells` quantile intervals of the rest (fewer where their edges coincide)."""
    if cells < 1:
        raise ValueError(f"cells must be at least 1 (got {cells})")
    numbers = _numbers(real_values, col.decimals)
    numbers = numbers[np.isfinite(numbers)]
    heaps = np.unique(np.round(np.asarray(col.point_masses, dtype=np.float64), col.decimals))
    rest = numbers[~np.isin(numbers, heaps)]
    while len(rest):
        values, counts = np.unique(rest, return_counts=True)
        found = values[counts * cells >= len(rest)]
        if not len(found):
            break
        heaps = np.union1d(heaps, found)
        rest = rest[~np.isin(rest, found)]
    edges = (
        np.unique(np.quantile(rest, np.arange(1, cells) / cells, method="inverted_cdf"))
        if len(rest)
        else np.empty(0, dtype=np.float64)
    )
    return QuantileCells(col.decimals, edges, heaps)


def ks_distance(real_values: ArrayLike, synthetic_values: ArrayLike) -> float | None:
    """The two-sample Kolmogorov-Smirnov statistic, max |F_real(x) - F_synthetic(x)| over the empirical
    distribution functions, missing values ignored (None when either side has no number). SDMetrics'
    KSComplement is 1 minus this; scipy's `ks_2samp` statistic equals it."""
    real = _finite_sorted(real_values)
    synthetic = _finite_sorted(synthetic_values)
    if not len(real) or not len(synthetic):
        return None
    points = np.concatenate([real, synthetic])
    gap = np.searchsorted(real, points, side="right") / len(real) - np.searchsorted(
        synthetic, points, side="right"
    ) / len(synthetic)
    return float(np.abs(gap).max())


def _finite_sorted(values: ArrayLike) -> np.ndarray:
    numbers = pd.to_numeric(pd.Series(np.asarray(values, dtype=object)), errors="coerce").to_numpy(np.float64)
    return np.sort(numbers[np.isfinite(numbers)])


__all__ = ["MISSING", "QUANTILE_CELLS", "QuantileCells", "ks_distance", "quantile_cells"]
