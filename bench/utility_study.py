"""Utility of finished releases at their published epsilon (docs/utility-study.md).

For each release run folder given (`<home>/runs/release/<id>`, published, or a finished trial: then the
rows its sample stage drew from the DP-chosen checkpoint), reads its summary (whole-release
epsilon, the AUC of the Algorithm 3 protocol on real test rows, the real-data AUC) and compares the
published synthetic table (the bundle's) with the release's real test rows, which never reached
preprocessing, the generator or the choice:

* Spearman mean absolute difference over pairs of continuous columns (and over all column pairs, with
  discrete columns as level codes, as the internal report shows it);
* mean total-variation distance over the discrete columns;
* mean Wasserstein distance over the continuous columns, values scaled to [0, 1] by the public bounds;
* the fidelity figures that carry targets (models/evaluation/fidelity.py: 1-way and 2-way total-variation distances
  on public cells, lost levels, point-mass gaps, Spearman gap between continuous columns, and the numeric
  shapes: 1-way and 2-way TVD with numeric columns on 20 cells at the real table's quantiles, a heap a cell
  of its own, and the Kolmogorov-Smirnov distance), each judged
  "met" or "missed" against `FIDELITY_TARGETS` with its traffic light (green met, amber within twice the
  target, red worse), the worst pair's 2-way TVD, and SDMetrics' QualityReport scores (Column Shapes,
  Column Pair Trends, overall; on at most `SDMETRICS_MAX_ROWS` rows of each table) so that the figures
  compare with other tools; --json adds each run's whole fidelity summary;
* per numeric column, the public-bin TVD beside the real-quantile-cell TVD and the KS distance.

Then mean and standard deviation per profile. Internal figures: every number depends on real rows.

    python -m bench.utility_study --config configs/cardio.yaml RUN_DIR [RUN_DIR ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.evaluation.fidelity import (
    FIDELITY_TARGETS,
    MISSED,
    fidelity_summary,
    fidelity_verdicts,
    sdmetrics_quality,
)
from dpsynth.models.evaluation.quality import (
    spearman_mad,
    spearman_matrix,
    tvd_by_feature,
    wasserstein_by_feature,
)


def real_test_rows(schema: DatasetSchema, run: Path) -> pd.DataFrame:
    """The release's test rows as preprocessing left them (gaps imputed within the test split only)."""
    split = dict(np.load(run / "split" / "split.npz"))
    encoded = np.load(run / "preprocess" / "encoded.npy")
    return TableEncoder(schema).decode(encoded[split["test"]])


def continuous_spearman_mad(schema: DatasetSchema, real: pd.DataFrame, synthetic: pd.DataFrame) -> float:
    names = [c.name for c in schema.columns if c.is_continuous]
    real_rho, _ = spearman_matrix(schema, real, max_rows=None)
    synth_rho, _ = spearman_matrix(schema, synthetic, max_rows=None)
    return spearman_mad(real_rho.loc[names, names], synth_rho.loc[names, names])


def released_rows(run: Path, record: dict) -> pd.DataFrame:
    """A published release's bundle rows; for a finished trial (`--no-publish`), the rows its sample stage
    drew from the checkpoint the DP choice took: what a release of that run would have published."""
    summary = record.get("summary") or {}
    if record.get("status") == "published" and summary:
        return pd.read_parquet(run / "bundle" / "synthetic.parquet")
    if record.get("status") == "trial" and summary:
        return pd.read_parquet(
            run / f"sample-{summary['setting']}" / f"synthetic_{int(summary['iteration']):06d}.parquet"
        )
    raise SystemExit(f"{run}: not a finished release or trial (status {record.get('status')!r})")


def measure(schema: DatasetSchema, run: Path) -> dict:
    record = json.loads((run / "run.json").read_text())
    summary = record.get("summary") or {}
    synthetic = released_rows(run, record)
    real = real_test_rows(schema, run)
    real_rho, _ = spearman_matrix(schema, real, max_rows=None)
    synth_rho, _ = spearman_matrix(schema, synthetic, max_rows=20000)
    # A run id is <dataset>-<profile>-<random hex>.
    profile = record["run_id"].removeprefix(f"{schema.name}-").rsplit("-", 1)[0]
    return {
        "run": run.name,
        "profile": profile,
        "epsilon": summary["epsilon"],
        "auc": summary["auc"],
        "real_auc": summary["real_auc"],
        "iteration": summary["iteration"],
        "spearman_mad_continuous": continuous_spearman_mad(schema, real, synthetic),
        "spearman_mad_all": spearman_mad(real_rho, synth_rho),
        "mean_tvd": float(tvd_by_feature(schema, real, synthetic).mean()),
        "mean_wasserstein": float(wasserstein_by_feature(schema, real, synthetic).mean()),
        "levels_lost": lost_levels(schema, real, synthetic),
        **fidelity_figures(schema, real, synthetic),
    }


# Columns of `fidelity_figures` beside the run's other figures: one per target (lost levels by their number),
# the worst pair's 2-way TVD, and SDMetrics' three scores (NaN when sdmetrics is not installed).
SDMETRICS_SCORES = ("column_shapes", "column_pair_trends", "overall")
SHAPE_MEANS = ("continuous_quantile_tvd_mean", "continuous_ks_mean")
FIDELITY_COLUMNS = [
    *(f"fidelity_{figure}" for figure in FIDELITY_TARGETS),
    "fidelity_pairwise_tvd_worst",
    *(f"fidelity_{figure}" for figure in SHAPE_MEANS),
    *(f"sdmetrics_{score}" for score in SDMETRICS_SCORES),
]


def fidelity_figures(schema: DatasetSchema, real: pd.DataFrame, synthetic: pd.DataFrame) -> dict:
    """The fidelity figures, flat for the tables (NaN where one does not apply, so that profiles average),
    the targets missed and each target's light, and the whole summary with its verdicts and SDMetrics'
    scores under "fidelity"."""
    summary = fidelity_summary(schema, real, synthetic)
    verdicts = fidelity_verdicts(summary)
    sdmetrics = sdmetrics_quality(schema, real, synthetic)
    figures = {f"fidelity_{figure}": np.nan if v["value"] is None else v["value"] for figure, v in verdicts.items()}
    figures["fidelity_pairwise_tvd_worst"] = _or_nan(summary["pairwise_tvd_worst"])
    figures |= {f"fidelity_{figure}": _or_nan(summary[figure]) for figure in SHAPE_MEANS}
    figures |= {f"sdmetrics_{score}": _or_nan((sdmetrics or {}).get(score)) for score in SDMETRICS_SCORES}
    missed = [figure for figure, v in verdicts.items() if v["verdict"] == MISSED]
    lights = ", ".join(f"{figure}={v['light']}" for figure, v in verdicts.items())
    return {
        **figures,
        "fidelity_missed": ", ".join(missed) or "none",
        "fidelity_lights": lights,
        "fidelity": {**summary, "verdicts": verdicts, "sdmetrics": sdmetrics},
    }


# Per numeric column: the public-bin TVD (as earlier figures were measured) beside the shape figures.
SHAPE_COLUMNS = ("public_bin_tvd", "quantile_tvd", "ks")


def numeric_shapes(measured: list[dict]) -> pd.DataFrame:
    """One row per run and numeric column: public-bin TVD, TVD on cells at the real quantiles, KS
    distance, and the values that got a cell of their own (heaps, declared point masses)."""
    rows = []
    for m in measured:
        fidelity = m["fidelity"]
        for column, quantile_tvd in fidelity["continuous_quantile_tvd"].items():
            rows.append(
                {
                    "run": m["run"],
                    "profile": m["profile"],
                    "column": column,
                    "public_bin_tvd": _or_nan(fidelity["column_tvd"][column]),
                    "quantile_tvd": _or_nan(quantile_tvd),
                    "ks": _or_nan(fidelity["continuous_ks"][column]),
                    "own_cells": ", ".join(f"{v:g}" for v in fidelity["quantile_heaps"][column]) or "none",
                }
            )
    return pd.DataFrame(rows, columns=["run", "profile", "column", *SHAPE_COLUMNS, "own_cells"])


def _or_nan(value: float | None) -> float:
    return np.nan if value is None else float(value)


def lost_levels(schema: DatasetSchema, real: pd.DataFrame, synthetic: pd.DataFrame, floor: float = 0.01) -> str:
    """Levels with at least `floor` share among the real rows that the synthetic table lacks."""
    lost = []
    for column in schema.columns:
        if column.is_continuous:
            continue
        shares = real[column.name].value_counts(normalize=True)
        present = set(synthetic[column.name].unique())
        lost += [f"{column.name}={level}" for level, share in shares.items() if share >= floor and level not in present]
    return ", ".join(lost) or "none"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--config", default="configs/cardio.yaml")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    schema = DatasetSchema.from_yaml(args.config)
    measured = [measure(schema, run) for run in args.runs]
    everything = pd.DataFrame([{k: v for k, v in m.items() if k != "fidelity"} for m in measured])
    fidelity = everything[["run", "profile", *FIDELITY_COLUMNS, "fidelity_missed"]]
    lights = everything[["run", "fidelity_lights"]]
    rows = everything.drop(columns=[*FIDELITY_COLUMNS, "fidelity_missed", "fidelity_lights"])
    metrics = [
        "epsilon",
        "auc",
        "real_auc",
        "spearman_mad_continuous",
        "spearman_mad_all",
        "mean_tvd",
        "mean_wasserstein",
    ]
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(rows.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        print()
        print(rows.groupby("profile")[metrics].agg(["mean", "std"]).round(4).to_string())
        print()
        print("Fidelity (targets: " + ", ".join(f"{k} <= {v:g}" for k, v in FIDELITY_TARGETS.items()) + ")")
        print(
            fidelity.rename(columns=lambda c: c.removeprefix("fidelity_")).to_string(
                index=False, float_format=lambda v: f"{v:.4f}"
            )
        )
        print()
        print("Traffic lights (green: target met, amber: within 2x the target, red: worse)")
        print(lights.rename(columns={"fidelity_lights": "lights"}).to_string(index=False))
        print()
        print(
            fidelity.groupby("profile")[FIDELITY_COLUMNS]
            .agg(["mean", "std"])
            .round(4)
            .rename(columns=lambda c: c.removeprefix("fidelity_"))
            .to_string()
        )
        shapes = numeric_shapes(measured)
        if not shapes.empty:
            print()
            print(
                "Numeric columns: TVD on public bins, TVD on 20 cells at the real quantiles (own_cells: values "
                "with a cell of their own), KS distance"
            )
            print(shapes.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
            print()
            print(shapes.groupby(["profile", "column"])[list(SHAPE_COLUMNS)].agg(["mean", "std"]).round(4).to_string())
    if args.json:
        runs = [
            {**record, "fidelity": m["fidelity"]}
            for record, m in zip(rows.to_dict(orient="records"), measured, strict=False)
        ]
        print(json.dumps({"runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
