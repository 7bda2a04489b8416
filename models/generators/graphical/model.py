"""A released MST model and its sampler: numpy, pandas and the public cells (dpsynth.models.data.binning)
only, so that sampling imports neither jax, private-pgm (`mbi`) nor torch.

The model is the estimated graphical model's junction-tree clique marginals over each column's reduced
codes (MST's domain reduction: the cells a column kept after its noisy 1-way measurement, plus one "other"
code for the rest), listed so that each clique's parent comes before it, and each column's map from
cells to reduced codes. Everything in it is a function of the noisy measurements and public facts.

Rows are drawn by ancestral sampling over the cliques. Within each conditioning configuration the
uniforms are stratified (as private-pgm's `synthetic_data(method="round")`): a configuration's rows match
its conditional distribution to within one row per cell, and each row's draw is still marginally exact.
An "other" code becomes one of its cells uniformly (MST's reverse of the domain reduction), and a cell
becomes a value through `binning.cell_values`: a level, a point mass exactly, or a value on the bin's
decimal grid, drawn uniformly; or, when the model carries the columns' measured fine histograms
(`shapes`, dpsynth.models.marginals.shapes), a value placed inside its cell as the histogram says. When
the model carries `couplings` (pairs of continuous columns with a Gaussian copula correlation fitted to its
own tables, dpsynth.models.generators.graphical.coupling), those values are then handed to the rows inside
each cell in the order of latent scores drawn for the pair, so that a monotone pair stays monotone inside
its cells; a model fitted before couplings has none and decodes as it did.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dpsynth.models.data.binning import cell_codes, cell_values, writable_cells
from dpsynth.models.data.schema import Column
from dpsynth.models.generators.graphical.coupling import latent_scores, one_way, ordered_within_cells, pair_couplings
from dpsynth.models.marginals.shapes import CELL_MEAN, ColumnShapes

FORMAT = "dpsynth-mst/1"
# Draws of a bin's value that float edges code to another cell are redrawn at most this often.
_REDRAWS = 8


@dataclass
class MSTModel:
    """`maps[j][cell]`: column j's reduced code of each of its cells (-1: a cell that holds no value of the
    column's decimal grid, never written); `cliques[k]`: column positions, `tables[k]` the clique's
    probabilities over reduced codes (axes in the clique's order); `parents[k]`: the clique listed
    before it that it is sampled after (-1 for a root)."""

    columns: tuple[Column, ...]
    bins: int
    maps: list[np.ndarray]
    cliques: list[tuple[int, ...]]
    tables: list[np.ndarray]
    parents: list[int]
    # The continuous columns' noisy fine histograms (None: values uniform within their cells).
    shapes: ColumnShapes | None = None
    # (i, j, r): continuous columns i and j coupled inside their cells at copula correlation r (`couple`);
    # empty for a model fitted before couplings (values inside cells independent across columns).
    couplings: tuple[tuple[int, int, float], ...] = ()

    def couple(self) -> None:
        """Fit the couplings of the pairs of continuous columns that share a clique, from the model's own
        tables (coupling.pair_couplings): post-processing of what the model released."""
        self.couplings = pair_couplings(self.columns, self.bins, self.maps, self.cliques, self.tables)

    @classmethod
    def uniform(cls, columns: Sequence[Column], bins: int) -> MSTModel:
        """Independent columns, each uniform over its writable cells: a model that read no row."""
        maps, tables = [], []
        for col in columns:
            writable = writable_cells(col, bins)
            mapping = np.full(len(writable), -1, dtype=np.int64)
            mapping[writable] = np.arange(int(writable.sum()))
            maps.append(mapping)
            tables.append(np.full(int(writable.sum()), 1.0 / int(writable.sum())))
        return cls(tuple(columns), bins, maps, [(j,) for j in range(len(columns))], tables, [-1] * len(columns))

    # ----------------------------------------------------------------------------------- sampling

    def sample(self, n: int, rng: np.random.Generator) -> pd.DataFrame:
        """`n` decoded rows: the columns in order, with the values and dtypes `TableEncoder.decode` gives."""
        n = int(n)
        reduced = np.full((n, len(self.columns)), -1, dtype=np.int64)
        done: set[int] = set()
        for clique, table in zip(self.cliques, self.tables, strict=True):
            known = [a for a in clique if a in done]
            new = [a for a in clique if a not in done]
            if not new:
                continue
            # Axes: the columns drawn before first, then the new ones.
            probs = np.transpose(np.asarray(table, dtype=np.float64), [clique.index(a) for a in known + new])
            new_shape = probs.shape[len(known) :]
            probs = probs.reshape(-1, int(np.prod(new_shape)))
            if known:
                sizes = tuple(np.shape(table)[clique.index(a)] for a in known)
                group = np.ravel_multi_index(tuple(reduced[:, a] for a in known), sizes)
            else:
                group = np.zeros(n, dtype=np.int64)
            picks = conditional_draws(probs, group, rng)
            for a, codes in zip(new, np.unravel_index(picks, new_shape), strict=True):
                reduced[:, a] = codes
                done.add(a)
        data = {}
        drawn_cells = {}
        for j, col in enumerate(self.columns):
            cells = expand(self.maps[j], reduced[:, j], rng)
            drawn_cells[j] = cells
            if col.is_continuous:
                if self.shapes is not None and col.name in self.shapes.counts:
                    drawn = self.shapes.values(col, cells, rng)
                else:
                    drawn = _values_in_cells(col, cells, rng, self.bins)
                values = np.round(drawn, col.decimals)
                data[col.name] = values.astype(np.int64) if col.decimals == 0 else values
            else:
                data[col.name] = np.array(col.levels)[cells]
        if self.couplings and n:  # after every old draw, so that a model without couplings decodes as before
            coupled = {i for i, _, _ in self.couplings} | {j for _, j, _ in self.couplings}
            probabilities = {j: one_way(self.maps, self.cliques, self.tables, j) for j in coupled}
            scores = latent_scores(self.columns, self.bins, self.couplings, drawn_cells, probabilities, rng)
            for j, score in scores.items():
                name = self.columns[j].name
                data[name] = ordered_within_cells(data[name], drawn_cells[j], score)
        return pd.DataFrame(data, columns=[c.name for c in self.columns])

    # -------------------------------------------------------------------------------- persistence

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict]:
        """(numpy arrays, JSON-ready metadata): all the sampler needs, no pickle."""
        arrays = {f"map_{j}": np.asarray(m, dtype=np.int64) for j, m in enumerate(self.maps)}
        arrays.update({f"table_{k}": np.asarray(t, dtype=np.float64) for k, t in enumerate(self.tables)})
        meta = {
            "format": FORMAT,
            "bins": self.bins,
            "columns": [_column_dict(c) for c in self.columns],
            "cliques": [list(c) for c in self.cliques],
            "parents": list(self.parents),
        }
        if self.shapes is not None:
            names = list(self.shapes.counts)
            for k, name in enumerate(names):
                arrays[f"shape_{k}"] = np.asarray(self.shapes.counts[name], dtype=np.float64)
            meta["shapes"] = {
                "columns": names,
                "noise_multiplier": self.shapes.noise_multiplier,
                "whole_cells": self.shapes.whole_cells,
                "denoiser": self.shapes.denoiser,
            }
        if self.couplings:  # absent when empty: such a model decodes exactly as one fitted before couplings
            meta["couplings"] = [[int(i), int(j), float(r)] for i, j, r in self.couplings]
        return arrays, meta

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], meta: dict) -> MSTModel:
        if meta.get("format") != FORMAT:
            raise ValueError(f"not an MST model of format {FORMAT!r}: {meta.get('format')!r}")
        columns = tuple(_column_of(c) for c in meta["columns"])
        cliques = [tuple(int(a) for a in c) for c in meta["cliques"]]
        shapes = None
        if "shapes" in meta:  # a model fitted before shapes were measured has none: uniform within cells
            names = [str(n) for n in meta["shapes"]["columns"]]
            counts = {n: tuple(float(v) for v in arrays[f"shape_{k}"]) for k, n in enumerate(names)}
            # Without "whole_cells": fitted before whole numbers had fine cells of their own (binning.whole_split).
            whole_cells = bool(meta["shapes"].get("whole_cells", False))
            # Without "denoiser": fitted before the neighbours' denoiser, so its shapes decode as they did.
            denoiser = str(meta["shapes"].get("denoiser", CELL_MEAN))
            shapes = ColumnShapes(
                counts, float(meta["shapes"]["noise_multiplier"]), int(meta["bins"]), whole_cells, denoiser
            )
        return cls(
            columns=columns,
            bins=int(meta["bins"]),
            maps=[np.asarray(arrays[f"map_{j}"], dtype=np.int64) for j in range(len(columns))],
            cliques=cliques,
            tables=[np.asarray(arrays[f"table_{k}"], dtype=np.float64) for k in range(len(cliques))],
            parents=[int(p) for p in meta["parents"]],
            shapes=shapes,
            couplings=tuple((int(i), int(j), float(r)) for i, j, r in meta.get("couplings", ())),
        )


def conditional_draws(probs: np.ndarray, group: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """For each row i, an outcome drawn from row `group[i]` of `probs` (rows: conditioning configurations,
    columns: outcomes), by inverse CDF; a configuration without mass draws uniformly. The rows of one
    configuration, in random order, take u = (rank + U) / count: stratified, so each configuration's
    outcomes match its distribution to within one row per cell, while each row's u is uniform. Each
    configuration's CDF is shifted by twice its index so that one sorted search serves all."""
    probs = np.clip(probs, 0.0, None)
    probs = np.where(probs.sum(axis=1, keepdims=True) > 0, probs, 1.0)
    cdf = np.cumsum(probs, axis=1)
    cdf /= cdf[:, -1:]
    outcomes = cdf.shape[1]
    shifted = (cdf + np.arange(cdf.shape[0])[:, None] * 2.0).ravel()
    u = rng.random(len(group))
    if len(group):
        shuffled = rng.permutation(len(group))
        ordered = shuffled[np.argsort(group[shuffled], kind="stable")]
        counts = np.bincount(group, minlength=cdf.shape[0])
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        rank = np.empty(len(group), dtype=np.int64)
        rank[ordered] = np.arange(len(group)) - starts[group[ordered]]
        u = (rank + u) / counts[group]
    flat = np.searchsorted(shifted, group * 2.0 + u, side="right")
    return np.minimum(flat - group * outcomes, outcomes - 1)


def expand(mapping: np.ndarray, reduced: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Cells for reduced codes: the one cell mapped to a code, or one of an "other" code's cells uniformly."""
    mapping = np.asarray(mapping, dtype=np.int64)
    valid = np.flatnonzero(mapping >= 0)
    order = valid[np.argsort(mapping[valid], kind="stable")]
    sizes = np.bincount(mapping[valid], minlength=int(mapping.max()) + 1)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    offset = np.minimum((rng.random(len(reduced)) * sizes[reduced]).astype(np.int64), sizes[reduced] - 1)
    return order[starts[reduced] + offset]


def _values_in_cells(col: Column, codes: np.ndarray, rng: np.random.Generator, bins: int) -> np.ndarray:
    """A continuous column's `binning.cell_values`, redrawing the rare value that float edges code to
    another cell."""
    values = np.asarray(cell_values(col, codes, rng, bins), dtype=np.float64)
    for _ in range(_REDRAWS):
        bad = cell_codes(col, values, bins) != codes
        if not bad.any():
            break
        values[bad] = cell_values(col, codes[bad], rng, bins)
    return values


def _column_dict(col: Column) -> dict:
    return {
        "name": col.name,
        "kind": col.kind,
        "bounds": list(col.bounds) if col.bounds else None,
        "levels": list(col.levels),
        "decimals": col.decimals,
        "unit": col.unit,
        "point_masses": list(col.point_masses),
    }


def _column_of(raw: dict) -> Column:
    return Column(
        raw["name"],
        raw["kind"],
        bounds=(float(raw["bounds"][0]), float(raw["bounds"][1])) if raw["bounds"] else None,
        levels=tuple(raw["levels"]),
        decimals=int(raw["decimals"]),
        unit=raw.get("unit", ""),
        point_masses=tuple(float(m) for m in raw["point_masses"]),
    )


def released_cliques(
    tree: Any, positions: Callable[[Any], tuple[int, ...]], table_of: Callable[[Any], np.ndarray]
) -> tuple[list[tuple[int, ...]], list[np.ndarray], list[int]]:
    """A junction tree (a networkx graph) as `MSTModel` holds it: each clique's column `positions`, its
    table (`table_of`, clipped at 0 and normalised) and the index of its parent (-1 for a root), every
    clique after its parent (`_parents_first`). MST and AIM release their models through this."""
    cliques: list[tuple[int, ...]] = []
    tables: list[np.ndarray] = []
    parents: list[int] = []
    for node, parent in _parents_first(tree):
        table = np.clip(table_of(node), 0.0, None)
        cliques.append(positions(node))
        tables.append(table / table.sum())
        parents.append(-1 if parent is None else cliques.index(positions(parent)))
    return cliques, tables, parents


def _parents_first(tree: Any) -> list[tuple[Any, Any | None]]:
    """(clique, its parent or None) of a junction tree (a networkx graph), breadth first from each
    component's smallest clique, neighbours in sorted order: the same order in every process."""
    order: list[tuple[Any, Any | None]] = []
    seen: set = set()
    for root in sorted(tree.nodes):
        if root in seen:
            continue
        seen.add(root)
        queue: list[tuple[Any, Any | None]] = [(root, None)]
        while queue:
            node, parent = queue.pop(0)
            order.append((node, parent))
            for neighbour in sorted(tree.neighbors(node)):
                if neighbour not in seen:
                    seen.add(neighbour)
                    queue.append((neighbour, node))
    return order
