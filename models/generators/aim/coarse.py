"""Coarse cells for AIM's pairs of continuous columns.

A pair of two continuous columns on their fine cells (20 x 20 bins and more) is a marginal whose own
measurement noise, at epsilon 1, is larger than any error a model can have on it: its score (weight x
(L1 error - sqrt(2 / pi) std x cells)) stays negative and no round chooses it, so the columns' rank
correlations rest on the target alone. The same pair summed into a few groups of adjacent cells per
column (5 x 5 by default) carries the dependence at a noise the rounds can afford.

The groups are cut at equal shares of the model's 1-way estimate, which comes from the noisy 1-way
measurements only (post-processing): no row is read to place them. A group is a run of adjacent cells; a
column with no more cells than groups keeps its cells. A measurement over groups is a linear query of the
pair's fine marginal (the group matrices' product), so the estimator fits the model's fine cells to it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np


def quantile_groups(estimate: np.ndarray, groups: int) -> np.ndarray:
    """Fine cell -> group (0, 1, ... in cell order): each cell joins the group of the share of the 1-way
    `estimate` at its middle, so the groups hold about equal shares and a heavy cell one of its own."""
    shares = np.clip(np.asarray(estimate, dtype=np.float64), 0.0, None)
    total = float(shares.sum())
    if len(shares) <= groups or total <= 0.0:
        return np.arange(len(shares)) if len(shares) <= groups else (np.arange(len(shares)) * groups) // len(shares)
    middle = (np.cumsum(shares) - shares / 2.0) / total
    raw = np.minimum((middle * groups).astype(np.int64), groups - 1)
    return np.unique(raw, return_inverse=True)[1].astype(np.int64)


def group_matrix(group_of_cell: np.ndarray) -> np.ndarray:
    """The 0/1 matrix (cells x groups) that sums a column's cells into its groups."""
    group_of_cell = np.asarray(group_of_cell, dtype=np.int64)
    matrix = np.zeros((len(group_of_cell), int(group_of_cell.max()) + 1))
    matrix[np.arange(len(group_of_cell)), group_of_cell] = 1.0
    return matrix


def aggregate(table: np.ndarray, matrices: Sequence[np.ndarray]) -> np.ndarray:
    """`table` (one axis per column) with each axis summed into its column's groups."""
    for axis, matrix in enumerate(matrices):
        table = np.moveaxis(np.tensordot(table, matrix, axes=([axis], [0])), -1, axis)
    return table


def spread(table: np.ndarray, matrices: Sequence[np.ndarray]) -> np.ndarray:
    """The adjoint of `aggregate`: each group's value copied to every cell of the group."""
    for axis, matrix in enumerate(matrices):
        table = np.moveaxis(np.tensordot(table, matrix.T, axes=([axis], [0])), -1, axis)
    return table


def operator_norm_sq(matrices: Sequence[np.ndarray]) -> float:
    """||Q||^2 of the aggregation: the product over axes of the largest group's cell count."""
    return float(np.prod([matrix.sum(axis=0).max() for matrix in matrices]))


@dataclasses.dataclass(frozen=True, eq=False)
class GroupQuery:
    """`mbi`'s linear query of a measurement over groups: a Factor over the clique's `attributes` summed
    into the groups of `matrices` (one per attribute), flat. Hashed by identity, as `mbi`'s own
    WeightedQuery, so that jax can treat it as static."""

    attributes: tuple[str, ...]
    matrices: tuple[np.ndarray, ...]
    use_for_total_estimation: bool = True

    def __call__(self, factor: Any) -> Any:  # an mbi Factor in, a jax array out
        import jax.numpy as jnp

        table = factor.project(self.attributes).datavector(flatten=False)
        for axis, matrix in enumerate(self.matrices):
            table = jnp.moveaxis(jnp.tensordot(table, jnp.asarray(matrix), axes=([axis], [0])), -1, axis)
        return table.reshape(-1)

    def op_norm_sq(self) -> float:
        return operator_norm_sq(self.matrices)

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other
