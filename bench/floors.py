"""Floors for issue 41's fidelity targets at whole-release epsilon 1 (docs/utility-study.md section 17).

What can a release that trains on the training split and publishes R rows score against the WHOLE table,
at best? Each line of the table is one JSON line, scored on the project's own cells (discrete columns on
their levels, numeric ones on 20 cells at the whole table's quantiles, as `fidelity_summary` cuts them):

* `training rows`: the training rows themselves (context; section 11's first line);
* `bootstrap`: R rows drawn with replacement from the training rows, a perfect model of the training
  rows' empirical joint sampled as a release samples, scored by `fidelity_summary` and
  `continuous_spearman_mad` (bench/utility_study.py), several draws;
* `exact counts`: the training rows' exact 1-way counts, and each pair's exact 2-way counts, scaled to R
  rows and rounded (no sampling error, no noise): the best any model of the training rows can do;
* `one-way floor`: all of a rho on one kind of column's 1-way counts (the categorical columns on their
  public cells, or the numeric columns on the scorer's cells), by the project's Gaussian mechanism
  (replace-one, L2 sensitivity sqrt(2): `graphical.mechanisms.gaussian_counts`), MST's domain
  reduction and simplex projection (`mst.fit.reduce_domain`, `one_way_estimate`: what MST's estimate
  makes of 1-way measurements alone), placed with no sampling error at R rows; at the whole release's
  rho split evenly or by the columns' cells (std proportional to cells^(-1/3)), half of it, and MST's own
  1-way std (the profile's shares);
* `two-way floor, each pair alone`: all of rho on one pair's 2-way counts on the scorer's cells,
  projected and rounded, pair by pair: no release with this mechanism beats a pair's figure on that
  pair, so the mean and worst over pairs are floors for the 2-way mean and worst;
* `two-way, every pair at rho / pairs`: the naive strategy that measures every scored pair at once (an
  attainable release, not a floor).

rho is the release's, from the project's one accountant: `zcdp_adapter.training_rho` of the profile's
generator section (`rho_for_epsilon` at the profile's budget and delta; the DP choice reads disjoint
rows), here MST's under `mst-eps1`. The training split is the release's own `row_local_split` at the
profile's fractions, drawn from a fixed secret (a bench on a generated table); R is the number of rows
a release samples, training plus validation rows (tasks/evaluate.py `synthetic_rows`).

Internal figures on generated tables only: never run it on a real table.

    python -m bench.floors --config CONFIG --data CSV [--profile mst-eps1] [--draws 5] [--rows-released R]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bench.utility_study import continuous_spearman_mad
from dpsynth.models.config import Profile
from dpsynth.models.data.binning import DEFAULT_BINS, cell_codes, cell_count
from dpsynth.models.data.preprocessing import row_local_split
from dpsynth.models.data.schema import Column, DatasetSchema
from dpsynth.models.evaluation.fidelity import fidelity_summary
from dpsynth.models.evaluation.quality import total_variation
from dpsynth.models.evaluation.shapes import quantile_cells
from dpsynth.models.generators.graphical.mechanisms import gaussian_counts, gaussian_rho, gaussian_std
from dpsynth.models.generators.graphical.zcdp_adapter import model_rho, training_rho
from dpsynth.models.generators.mst.fit import one_way_estimate, reduce_domain
from dpsynth.models.generators.mst.privacy import MSTBudget
from dpsynth.models.marginals.calibration import largest_remainders
from dpsynth.models.privacy.secret import PrivacySecret
from dpsynth.models.profiles import load_named


@dataclass(frozen=True)
class ScoringCells:
    """A table's cell codes on the scorer's shape cells (`fidelity_summary`'s quantile scoring: discrete
    columns on their levels, numeric ones on cells at the WHOLE table's quantiles), missing values in an
    extra last cell. `codes[:, j]` indexes column j's `sizes[j]` cells."""

    columns: tuple[Column, ...]
    codes: np.ndarray
    sizes: tuple[int, ...]

    def counts(self, rows: np.ndarray | None = None) -> list[np.ndarray]:
        codes = self.codes if rows is None else self.codes[rows]
        return [np.bincount(codes[:, j], minlength=size).astype(np.float64) for j, size in enumerate(self.sizes)]

    def joint(self, a: int, b: int, rows: np.ndarray | None = None) -> np.ndarray:
        codes = self.codes if rows is None else self.codes[rows]
        flat = codes[:, a] * self.sizes[b] + codes[:, b]
        return np.bincount(flat, minlength=self.sizes[a] * self.sizes[b]).astype(np.float64)


def scoring_cells(schema: DatasetSchema, whole: pd.DataFrame) -> ScoringCells:
    """The whole table's codes on the scorer's cells (the numeric cells cut at its own quantiles)."""
    codes, sizes = [], []
    for col in schema.columns:
        values = whole[col.name].to_numpy()
        if col.is_continuous:
            shape = quantile_cells(col, values)
            column_codes, size = shape.codes(values), shape.size
        else:
            column_codes, size = cell_codes(col, values), cell_count(col)
        codes.append(np.where(column_codes < 0, size, column_codes))  # missing: the extra last cell
        sizes.append(size + 1)
    return ScoringCells(tuple(schema.columns), np.stack(codes, axis=1).astype(np.int64), tuple(sizes))


def rounded(counts: np.ndarray, total: int) -> np.ndarray:
    """`counts` scaled to `total` rows and rounded to whole rows that add up to it (largest remainders):
    rows placed with no sampling error."""
    exact = np.asarray(counts, dtype=np.float64) * (total / float(np.sum(counts)))
    return largest_remainders(exact, total).astype(np.float64)


def tvd_of_counts(real: np.ndarray, released: np.ndarray) -> float:
    """The scorer's TVD (`quality.total_variation`) between two count vectors over the same cells."""
    return total_variation(real / real.sum(), released / released.sum())


def training_split(n_rows: int, profile: Profile, seed: int) -> dict[str, np.ndarray]:
    """The release's split (`row_local_split` at the profile's fractions) from a fixed secret."""
    secret = PrivacySecret(hashlib.sha256(f"bench.floors {seed}".encode()).digest())
    return row_local_split(n_rows, profile.split, secret)


def released_rows(split: dict[str, np.ndarray]) -> int:
    """How many rows a release samples: as many as its training and validation rows (tasks/evaluate.py
    `synthetic_rows`; every row of a table under 125,000 rows is evaluated)."""
    return len(split["train"]) + len(split["val"])


def release_rho(profile: Profile) -> float:
    """The rho the profile's first setting spends on training: the project's accountant's."""
    return training_rho(profile, profile.settings[0], profile.generator)


def mst_one_way_std(profile: Profile, columns: int) -> float:
    """The noise std MST (the `mst` section's shares and shape share) puts on each 1-way marginal."""
    config = profile.mst
    fit_rho = model_rho(profile, profile.settings[0], "mst")
    return MSTBudget(fit_rho, columns, config.one_way_share, config.selection_share).one_way_std


# ---------------------------------------------------------------------------------------------- lines


def summary_figures(schema: DatasetSchema, whole: pd.DataFrame, synthetic: pd.DataFrame) -> dict:
    """The targets' figures of one synthetic table by the project's scorer."""
    f = fidelity_summary(schema, whole, synthetic)
    return {
        "cat_1way": f["categorical_tvd_mean"],
        "num_worst": f["continuous_quantile_tvd_worst"],
        "num_worst_column": f["continuous_quantile_tvd_worst_column"],
        "twoway_mean": f["pairwise_quantile_tvd_mean"],
        "twoway_worst": f["pairwise_quantile_tvd_worst"],
        "spearman": continuous_spearman_mad(schema, whole, synthetic),
    }


def exact_count_figures(cells: ScoringCells, train: np.ndarray, total: int) -> dict:
    """The training rows' exact 1-way and 2-way counts rounded to `total` rows, against the whole table."""
    whole, trained = cells.counts(), cells.counts(train)
    one_way = [tvd_of_counts(w, rounded(t, total)) for w, t in zip(whole, trained, strict=True)]
    discrete = [x for x, col in zip(one_way, cells.columns, strict=True) if not col.is_continuous]
    numeric = {col.name: x for x, col in zip(one_way, cells.columns, strict=True) if col.is_continuous}
    pairs = {
        pair_name(cells, a, b): tvd_of_counts(cells.joint(a, b), rounded(cells.joint(a, b, train), total))
        for a, b in itertools.combinations(range(len(cells.columns)), 2)
    }
    return {
        "cat_1way": float(np.mean(discrete)) if discrete else None,
        "num_worst": max(numeric.values()) if numeric else None,
        "num_worst_column": max(numeric, key=numeric.__getitem__) if numeric else None,
        **mean_and_worst(pairs),
    }


def pair_name(cells: ScoringCells, a: int, b: int) -> str:
    return f"{cells.columns[a].name} x {cells.columns[b].name}"


def mean_and_worst(pairs: dict[str, float]) -> dict:
    worst = max(pairs, key=pairs.__getitem__)
    return {
        "twoway_mean": float(np.mean(list(pairs.values()))),
        "twoway_worst": pairs[worst],
        "twoway_worst_pair": worst,
    }


def projected_one_way(
    counts: np.ndarray, col: Column, std: float, rng: np.random.Generator, total: int, public_cells: bool
) -> np.ndarray:
    """One column's released counts at `total` rows when its 1-way counts are measured alone at noise
    `std`: the Gaussian mechanism, MST's domain reduction on public cells (an "other" code spread evenly
    over its cells, as MST's sampler places it), the simplex projection at the training rows' total,
    rounded. `counts` holds the scorer's cells, the missing cell last (no row of a generated table)."""
    n = float(counts.sum())
    measured = counts[:-1]  # a release imputes gaps first: it measures no missing cell
    noisy = gaussian_counts(measured, std, rng)
    if public_cells:
        reduced = reduce_domain(noisy, col, DEFAULT_BINS, std)
        mu = one_way_estimate(reduced.y, reduced.w, n)
        # A kept cell is a code of its own; the "other" code's estimate is spread evenly over its cells.
        written = reduced.mapping >= 0
        per_code = np.bincount(reduced.mapping[written], minlength=len(mu))
        cells = np.zeros(len(measured))
        cells[written] = mu[reduced.mapping[written]] / per_code[reduced.mapping[written]]
    else:
        cells = one_way_estimate(noisy, np.ones(len(noisy)), n)
    return rounded(np.append(cells, 0.0), total)


def one_way_floor(
    cells: ScoringCells,
    train: np.ndarray,
    total: int,
    std: float | Sequence[float],
    discrete: bool,
    rng: np.random.Generator,
) -> dict:
    """One draw of the 1-way floor on the discrete (or the numeric) columns, each at noise `std` (or at
    its own, one std per such column in schema order)."""
    whole, trained = cells.counts(), cells.counts(train)
    chosen = [j for j, col in enumerate(cells.columns) if col.is_continuous != discrete]
    stds = [float(std)] * len(chosen) if isinstance(std, int | float) else [float(s) for s in std]
    tvd = {
        cells.columns[j].name: tvd_of_counts(
            whole[j], projected_one_way(trained[j], cells.columns[j], s, rng, total, discrete)
        )
        for j, s in zip(chosen, stds, strict=True)
    }
    if discrete:
        return {"cat_1way": float(np.mean(list(tvd.values())))}
    worst = max(tvd, key=tvd.__getitem__)
    return {"num_worst": tvd[worst], "num_worst_column": worst}


def two_way_floor(cells: ScoringCells, train: np.ndarray, total: int, std: float, rng: np.random.Generator) -> dict:
    """One draw of every pair's 2-way counts on the scorer's cells measured at noise `std`, projected onto
    the simplex at the training rows' total and rounded: mean and worst over pairs."""
    pairs = {}
    for a, b in itertools.combinations(range(len(cells.columns)), 2):
        joint = cells.joint(a, b, train)
        noisy = gaussian_counts(joint, std, rng)
        estimate = one_way_estimate(noisy, np.ones(len(noisy)), float(joint.sum()))
        pairs[pair_name(cells, a, b)] = tvd_of_counts(cells.joint(a, b), rounded(estimate, total))
    return mean_and_worst(pairs)


def over_draws(draws: Sequence[dict]) -> dict:
    """Mean and range of each figure over the draws (a text figure: the most frequent)."""
    out: dict = {"draws": len(draws)}
    for key in draws[0]:
        values = [d[key] for d in draws]
        if all(isinstance(v, int | float) for v in values):
            out[key] = round(float(np.mean(values)), 5)
            out[f"{key}_range"] = [round(float(min(values)), 5), round(float(max(values)), 5)]
        elif any(v is not None for v in values):
            out[key] = max(set(values), key=values.count)
    return out


def floor_lines(
    schema: DatasetSchema, whole: pd.DataFrame, profile: Profile, draws: int, total: int | None, seed: int
) -> Iterable[dict]:
    """Every line of the table (see the module notes), in order."""
    split = training_split(len(whole), profile, seed)
    train = split["train"]
    total = released_rows(split) if total is None else total
    rho = release_rho(profile)
    cells = scoring_cells(schema, whole)
    rng = np.random.default_rng(seed)
    d_discrete = sum(not col.is_continuous for col in schema.columns)
    d_numeric = len(schema.columns) - d_discrete
    pairs = len(schema.columns) * (len(schema.columns) - 1) // 2
    base = {"rows": len(whole), "train": len(train), "released": total, "rho": round(rho, 6)}

    training = whole.iloc[train].reset_index(drop=True)
    yield {"line": "training rows", **base, **summary_figures(schema, whole, training)}
    boot = [
        summary_figures(schema, whole, training.iloc[rng.integers(0, len(train), total)].reset_index(drop=True))
        for _ in range(draws)
    ]
    yield {"line": "bootstrap", **base, **over_draws(boot)}
    yield {"line": "exact counts", **base, **exact_count_figures(cells, train, total)}

    mst_std = mst_one_way_std(profile, len(schema.columns)) if profile.generator == "mst" else None
    stds = {"all rho": gaussian_std(rho / d_discrete), "half rho": gaussian_std(rho / 2 / d_discrete)}
    if mst_std is not None:
        stds["MST's 1-way std"] = mst_std
    for label, std in stds.items():
        figures = [one_way_floor(cells, train, total, std, True, rng) for _ in range(draws)]
        share = d_discrete * gaussian_rho(std) / rho
        yield {"line": f"one-way floor, categorical, {label}", **base, "share": round(share, 4), "std": round(std, 2),
               **over_draws(figures)}  # fmt: skip
    # The noise a column adds to the mean grows with its cells: all of rho spread so that a column of k
    # cells gets std proportional to k^(-1/3) (which minimises sum k_j s_j at a fixed sum 1 / s_j^2, the
    # cells being public) is the other allocation a release could choose.
    levels = np.array([cell_count(col) for col in schema.columns if not col.is_continuous], dtype=np.float64)
    shape = levels ** (-1.0 / 3.0)
    # sum 1 / s_j^2 = rho (gaussian_rho(s) = 1 / s^2)
    by_cells = [float(s) for s in shape * np.sqrt(float(np.sum(1.0 / shape**2)) / rho)]
    figures = [one_way_floor(cells, train, total, by_cells, True, rng) for _ in range(draws)]
    share = float(np.sum([gaussian_rho(s) for s in by_cells])) / rho
    yield {"line": "one-way floor, categorical, all rho, std by cells^(-1/3)", **base, "share": round(share, 4),
           "std": [round(float(s), 2) for s in by_cells], **over_draws(figures)}  # fmt: skip
    numeric_stds = {"all rho": gaussian_std(rho / d_numeric)} if d_numeric else {}
    if d_numeric and mst_std is not None:
        numeric_stds["MST's 1-way std"] = mst_std
    for label, std in numeric_stds.items():
        figures = [one_way_floor(cells, train, total, std, False, rng) for _ in range(draws)]
        share = d_numeric * gaussian_rho(std) / rho
        yield {"line": f"one-way floor, numeric, {label}", **base, "share": round(share, 4), "std": round(std, 2),
               **over_draws(figures)}  # fmt: skip
    std = gaussian_std(rho)
    figures = [two_way_floor(cells, train, total, std, rng) for _ in range(draws)]
    yield {"line": "two-way floor, each pair alone, all rho", **base, "std": round(std, 2), **over_draws(figures)}
    std = gaussian_std(rho / pairs)
    figures = [two_way_floor(cells, train, total, std, rng) for _ in range(draws)]
    yield {"line": f"two-way, all {pairs} pairs at rho / {pairs}", **base, "std": round(std, 2), **over_draws(figures)}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="the table's schema (YAML)")
    ap.add_argument("--data", required=True, help="a generated table (CSV): never a real one")
    ap.add_argument("--profile", default="mst-eps1", help="the release profile whose rho and split are used")
    ap.add_argument("--draws", type=int, default=5, help="noise draws (and bootstrap draws) per line")
    ap.add_argument("--rows-released", type=int, default=None, help="default: training + validation rows")
    ap.add_argument("--seed", type=int, default=0, help="the split's secret and the draws' seed")
    args = ap.parse_args(argv)
    schema = DatasetSchema.from_yaml(args.config)
    whole = pd.read_csv(args.data, sep=schema.separator)[[c.name for c in schema.columns]]
    profile = load_named(args.profile, args.config)
    for line in floor_lines(schema, whole, profile, args.draws, args.rows_released, args.seed):
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
