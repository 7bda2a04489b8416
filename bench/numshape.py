"""Where the worst numeric column's error comes from in MST's and AIM's releases at epsilon 1, and what
the fine shapes' denoisers make of it (docs/utility-study.md section 18; issue 41's numeric 1-way target
of 0.03 on the scorer's quantile cells).

A release's value of a continuous column is (a) a coarse cell, drawn from the model's 1-way on its
public bins, (b) a fine cell inside it, drawn by the column's noisy fine shape (`ColumnShapes.values`),
(c) at the release's row count. The fit is the profile's own (the fit functions of models/generators/mst
and aim on the training rows' exact counts, the shapes at the profile's share, noise from a fixed secret
per draw; the split is bench.floors' `training_split`); then, per continuous column, decoded

* `release`: the model sampled at R rows with its noisy shapes under the cell-mean rule (the shapes as
  released before section 18; the couplings reorder values inside a cell and leave the 1-way alone), and
  `release, 10R` at ten times the rows (sampling's share);
* `model coarse, ...`: that sample's coarse cells, their values drawn again by a shape: the noisy one
  (cell-mean rule), the training rows' exact fine histogram (`true shapes`: only the coarse counts
  wrong), or another denoiser of the same noisy counts (paired);
* `true coarse, ...`: the training rows' own coarse cells placed at R rows with no sampling error
  (rounded), decoded the same ways (`true coarse, noisy shapes`: only the shape wrong; `true coarse, true
  shapes`: the split and a value's draw inside its fine cell alone).

Each figure is the scorer's 1-way TVD on 20 cells at the WHOLE table's quantiles (bench.floors'
`scoring_cells`, tied to `fidelity_summary` by tests/models/test_floors.py), and each draw also gives the
scorer's summary of the release sampled with the cell-mean and the neighbours' rule (same seed).

`--run DIR` (a finished `release --no-publish` trial, repeatable) instead decodes that trial's released
model again at its released rows' count with each denoiser, the same `--decodes` seeds for each: paired
figures, free of the trials' spread.

Internal figures on generated tables only: never run it on a real table.

    python -m bench.numshape --config CONFIG --data CSV [--profile mst-eps1] [--draws 3] [--denoiser NAME]
    python -m bench.numshape --config CONFIG --data CSV --run RUN_DIR [--run RUN_DIR ...]
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from bench.floors import released_rows, rounded, scoring_cells, summary_figures, training_split, tvd_of_counts
from dpsynth.models.config import Profile
from dpsynth.models.data.binning import cell_codes, fine_cell_count, fine_codes, fine_whole, shaped_cell_values
from dpsynth.models.data.cell_counts import count_frame
from dpsynth.models.data.schema import Column, DatasetSchema
from dpsynth.models.evaluation.fidelity import fidelity_summary
from dpsynth.models.evaluation.shapes import quantile_cells
from dpsynth.models.generators.graphical.model import MSTModel
from dpsynth.models.generators.graphical.zcdp_adapter import model_rho, shape_rho
from dpsynth.models.marginals.shapes import (
    CELL_MEAN,
    ColumnShapes,
    neighbour_denoised,
    noisy_shapes,
    shape_noise_multiplier,
    shaped_columns,
)
from dpsynth.models.marginals.shapes import (
    DENOISERS as RELEASED,
)
from dpsynth.models.privacy.secret import PrivacySecret
from dpsynth.models.profiles import load_named

Denoiser = Callable[[np.ndarray, np.ndarray, float, np.ndarray], np.ndarray]


def fitted_model(profile: Profile, schema: DatasetSchema, train: pd.DataFrame, seed: int) -> MSTModel:
    """The profile's model and shapes on `train`, as its adapter fits them, noise from a fixed secret;
    the shapes under the cell-mean rule (the alternatives decode the same noisy counts)."""
    name = profile.generator
    columns = tuple(schema.columns)
    secret = PrivacySecret(hashlib.sha256(f"bench.numshape {seed}".encode()).digest())
    config = profile.section(name)
    shaped = shaped_columns(columns)
    fine = [j for j, col in enumerate(columns) if col in shaped]
    rho = model_rho(profile, profile.settings[0], name)
    if name == "mst":
        from dpsynth.models.generators.mst.adapter import MST
        from dpsynth.models.generators.mst.fit import fit_counts

        counts = count_frame(train, columns, config.bins, MST().cliques(profile, schema), fine)
        model = fit_counts(
            counts, columns, rho, secret.numpy, config.bins, config.iterations, config.noise_penalty,
            (config.one_way_share, config.selection_share),
        ).model  # fmt: skip
    else:
        from dpsynth.models.generators.aim.adapter import AIM, rounds
        from dpsynth.models.generators.aim.fit import fit_counts as aim_fit

        counts = count_frame(train, columns, config.bins, AIM().cliques(profile, schema), fine)
        model = aim_fit(
            counts, columns, schema.target, rho, secret.numpy, bins=config.bins, rounds=rounds(config, len(columns)),
            max_model_mb=config.max_model_mb, round_iterations=config.round_iterations,
            iterations=config.iterations, workload=config.workload,
            numeric_pair_weight=config.numeric_pair_weight, numeric_pair_groups=config.numeric_pair_groups,
            one_way_share=config.one_way_share, numeric_pair_share=config.numeric_pair_share,
            pair_round_groups=config.pair_round_groups,
        ).model  # fmt: skip
    positions = {col.name: j for j, col in enumerate(columns)}
    exact = {col.name: counts.fine[positions[col.name]] for col in shaped}
    sigma = shape_noise_multiplier(shape_rho(profile, profile.settings[0], name), len(shaped))
    model.shapes = replace(noisy_shapes(exact, shaped, sigma, secret.numpy("shapes"), config.bins), denoiser=CELL_MEAN)
    return model


# ---------------------------------------------------------------------- denoisers tried (section 18)


def _running_median(y: np.ndarray, half: int) -> np.ndarray:
    return np.array([np.median(y[max(i - half, 0) : i + half + 1]) for i in range(len(y))])


def _runs(parents: np.ndarray, whole: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Coarse-cell groups (whole-number cells apart) and, per kind, the fine cells of shared groups."""
    groups = np.asarray(parents, dtype=np.int64) * 2 + np.asarray(whole, dtype=np.int64)
    shared = np.bincount(groups)[groups] >= 2
    return groups, [np.flatnonzero(shared & (groups % 2 == kind)) for kind in (0, 1)]


def one_level(noisy: np.ndarray, parents: np.ndarray, std: float, whole: np.ndarray, half: int = 8) -> np.ndarray:
    """The neighbours' rule without shrinking the smooth level towards the cell's mean (its noise kept)."""
    w = np.asarray(noisy, dtype=np.float64).copy()
    groups, runs = _runs(parents, whole)
    for run in runs:
        if len(run) < 3:
            continue
        y, cells = w[run], groups[run]
        heaps = np.abs(y - _running_median(y, half)) > 3.0 * std
        keep = np.where(heaps, 0.0, 1.0)
        kernel = np.ones(2 * half + 1)
        level = np.convolve(np.where(heaps, 0.0, y), kernel, "same") / np.maximum(np.convolve(keep, kernel, "same"), 1)
        out = y.copy()
        for cell in np.unique(cells):
            plain = np.flatnonzero((cells == cell) & ~heaps)
            residual = y[plain] - level[plain]
            spread = float((residual**2).sum())
            factor = max(0.0, 1.0 - len(plain) * std**2 / spread) if spread > 0 else 0.0
            out[plain] = level[plain] + factor * residual
        w[run] = out
    return np.clip(w, 0.0, None)


def neighbour_slope(
    noisy: np.ndarray, parents: np.ndarray, std: float, whole: np.ndarray, slope: bool = True, heaps_apart: bool = True
) -> np.ndarray:
    """Within each coarse cell a line through the cell's mean (heaps aside) with the slope of its two
    neighbour cells' means; deviations from it shrunk by James-Stein, heaps kept as measured."""
    w = np.asarray(noisy, dtype=np.float64).copy()
    groups, runs = _runs(parents, whole)
    for run in runs:
        if len(run) < 2:
            continue
        y, cells = w[run], groups[run]
        heaps = np.abs(y - _running_median(y, 5)) > 3.0 * std if heaps_apart else np.zeros(len(y), dtype=bool)
        units = list(dict.fromkeys(cells.tolist()))
        means, centres = [], []
        for unit in units:
            members = cells == unit
            use = members & ~heaps if (members & ~heaps).any() else members
            means.append(float(y[use].mean()))
            centres.append(float(np.flatnonzero(members).mean()))
        out = y.copy()
        for u, unit in enumerate(units):
            lo, hi = max(u - 1, 0), min(u + 1, len(units) - 1)
            b = (means[hi] - means[lo]) / (centres[hi] - centres[lo]) if slope and hi > lo else 0.0
            at = np.flatnonzero(cells == unit)
            target = means[u] + b * (at - centres[u])
            residual, plain = y[at] - target, ~heaps[at]
            spread = float((residual[plain] ** 2).sum())
            factor = max(0.0, 1.0 - max(int(plain.sum()) - 2, 1) * std**2 / spread) if spread > 0 else 0.0
            out[at] = np.where(plain, target + factor * residual, y[at])
        w[run] = out
    return np.clip(w, 0.0, None)


DENOISERS: dict[str, Denoiser] = {
    "neighbours": neighbour_denoised,
    "neighbours-free": functools.partial(neighbour_denoised, anchored=False),
    "neighbours-h5": functools.partial(neighbour_denoised, half=5),
    "neighbours-h12": functools.partial(neighbour_denoised, half=12),
    "smooth8": one_level,
    "linear": neighbour_slope,
    "linear-noheap": functools.partial(neighbour_slope, heaps_apart=False),
    "flat-heaps": functools.partial(neighbour_slope, slope=False),
    "raw": lambda noisy, parents, std, whole: np.clip(np.asarray(noisy, dtype=np.float64), 0.0, None),
}


def weights_of(denoiser: Denoiser, shapes: ColumnShapes, col: Column) -> np.ndarray:
    counts = np.asarray(shapes.counts[col.name], dtype=np.float64)
    return denoiser(counts, shapes.parents(col), shapes.noise_std, fine_whole(col, shapes.bins, shapes.whole_cells))


# ---------------------------------------------------------------------------------------- lines


def column_lines(
    schema: DatasetSchema, whole: pd.DataFrame, train: pd.DataFrame, model: MSTModel, total: int, seed: int,
    denoisers: Sequence[str],
) -> dict[str, dict[str, float]]:  # fmt: skip
    """Each continuous column's figures (the module notes) for one fitted model."""
    cells = scoring_cells(schema, whole)
    rng = np.random.default_rng(seed)
    synthetic = model.sample(total, rng)
    big = model.sample(10 * total, rng)
    shapes = model.shapes
    assert shapes is not None
    bins = model.bins
    out: dict[str, dict[str, float]] = {}
    for j, col in enumerate(schema.columns):
        if not col.is_continuous:
            continue
        real, size = cells.counts()[j], cells.sizes[j]
        scorer = quantile_cells(col, whole[col.name].to_numpy())

        def score(values: np.ndarray, scorer=scorer, real=real, size=size) -> float:  # type: ignore[no-untyped-def]
            codes = scorer.codes(values)
            return tvd_of_counts(real, np.bincount(np.where(codes < 0, size - 1, codes), minlength=size).astype(float))

        def decode(codes: np.ndarray, weights: np.ndarray, col: Column = col) -> np.ndarray:
            return np.round(shaped_cell_values(col, codes, weights, rng, bins, shapes.whole_cells), col.decimals)

        model_cells = cell_codes(col, synthetic[col.name].to_numpy(), bins)
        # The training rows' coarse cells at R rows with no sampling error (rounded, as bench.floors places
        # rows), in a random order: only the shape decides what differs from the training rows.
        train_cells = cell_codes(col, train[col.name].to_numpy(), bins)
        placed = rounded(np.bincount(train_cells[train_cells >= 0]).astype(np.float64), total).astype(np.int64)
        true_cells = rng.permutation(np.repeat(np.arange(len(placed)), placed))
        codes = fine_codes(col, train[col.name].to_numpy(), bins)
        truth = np.bincount(codes[codes >= 0], minlength=fine_cell_count(col, bins)).astype(np.float64)
        noisy = shapes.shape(col)
        line = {
            "release": score(synthetic[col.name].to_numpy()),
            "release, 10R": score(big[col.name].to_numpy()),
            "model coarse, noisy shapes (redrawn)": score(decode(model_cells, noisy)),
            "model coarse, true shapes": score(decode(model_cells, truth)),
            "true coarse, noisy shapes": score(decode(true_cells, noisy)),
            "true coarse, true shapes": score(decode(true_cells, truth)),
            "training rows": tvd_of_counts(real, cells.counts(np.asarray(train.index))[j]),
        }
        for name in denoisers:
            weights = weights_of(DENOISERS[name], shapes, col)
            line[f"model coarse, {name}"] = score(decode(model_cells, weights))
            line[f"true coarse, {name}"] = score(decode(true_cells, weights))
        out[col.name] = {k: round(v, 4) for k, v in line.items()}
    return out


def fit_lines(args: argparse.Namespace, schema: DatasetSchema, whole: pd.DataFrame) -> None:
    profile = load_named(args.profile, args.config)
    split = training_split(len(whole), profile, args.seed)
    train = whole.iloc[np.sort(split["train"])]
    total = released_rows(split)
    for draw in range(args.draws):
        started = time.perf_counter()
        model = fitted_model(profile, schema, train, draw)
        lines = column_lines(schema, whole, train, model, total, draw, args.denoiser)
        summaries = {}
        for rule in RELEASED:
            model.shapes = replace(model.shapes, denoiser=rule)  # type: ignore[arg-type]
            summaries[rule] = summary_figures(schema, whole, model.sample(total, np.random.default_rng(1000 + draw)))
        seconds = round(time.perf_counter() - started)
        line = {"profile": args.profile, "draw": draw, "seconds": seconds, "summary": summaries, "columns": lines}
        print(json.dumps(line), flush=True)


def run_lines(runs: Sequence[str], schema: DatasetSchema, whole: pd.DataFrame, decodes: int) -> None:
    """Each trial's released model decoded again at its released rows' count under each rule, the same
    `decodes` seeds for each rule."""
    import torch

    from bench.utility_study import released_rows as trial_rows
    from dpsynth.models.generators.graphical.sampler import model_of

    for run in map(Path, runs):
        record = json.loads((run / "run.json").read_text())
        summary = record["summary"]
        total = len(trial_rows(run, record))
        files = sorted(
            (run / f"train-{summary['setting']}" / "checkpoints").glob(f"*_{int(summary['iteration']):06d}.pt")
        )
        model = model_of(torch.load(files[0], map_location="cpu", weights_only=True))
        released = model.shapes.denoiser if model.shapes is not None else None
        line: dict = {"run": run.name, "rows": total, "released_denoiser": released}
        for rule in RELEASED:
            if model.shapes is not None:
                model.shapes = replace(model.shapes, denoiser=rule)
            line[rule] = []
            for seed in range(decodes):
                synthetic = model.sample(total, np.random.default_rng(7 + seed))
                columns = fidelity_summary(schema, whole, synthetic)["continuous_quantile_tvd"]
                figures = summary_figures(schema, whole, synthetic)
                line[rule].append({**figures, "columns": {k: round(v, 4) for k, v in columns.items()}})
        print(json.dumps(line), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="the table's schema (YAML)")
    ap.add_argument("--data", required=True, help="a generated table (CSV): never a real one")
    ap.add_argument("--profile", default="mst-eps1", help="an MST or AIM profile (a name or a YAML path)")
    ap.add_argument("--draws", type=int, default=3, help="noise draws (fits)")
    ap.add_argument("--seed", type=int, default=0, help="the split's secret (bench.floors.training_split)")
    ap.add_argument("--denoiser", action="append", default=[], choices=sorted(DENOISERS), help="also decode with")
    ap.add_argument("--run", action="append", default=[], help="a finished trial to decode again (no fit)")
    ap.add_argument("--decodes", type=int, default=3, help="with --run: decode seeds per rule")
    args = ap.parse_args(argv)
    schema = DatasetSchema.from_yaml(args.config)
    whole = pd.read_csv(args.data, sep=schema.separator)[[c.name for c in schema.columns]]
    if args.run:
        run_lines(args.run, schema, whole, args.decodes)
    else:
        fit_lines(args, schema, whole)


if __name__ == "__main__":
    main()
