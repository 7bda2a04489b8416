"""Fidelity figures on generated tables whose answers are known by hand: shifted shares, point masses,
lost levels, a dependence broken behind unchanged marginals, public bounds, JSON and target verdicts."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from dpsynth.models.data.demo import SHAPES, make_demo_table
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.evaluation.fidelity import (
    AMBER,
    FIDELITY_TARGETS,
    GREEN,
    RED,
    column_tvd,
    continuous_spearman_mad,
    fidelity_summary,
    fidelity_verdicts,
    lost_levels,
    pairwise_tvd,
    point_mass_gaps,
    scored_pairs,
    sdmetrics_metadata,
    sdmetrics_quality,
    traffic_light,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

# A small schema whose cells are easy to count by hand: "amount" has 20 bins of 50 over [0, 1000] and a
# point mass at 0; "age" 20 bins of 5 over [0, 100].
SMALL = {
    "name": "small",
    "target": "flag",
    "columns": {
        "colour": {"type": "categorical", "levels": ["red", "green", "blue", "grey"]},
        "flag": {"type": "binary", "levels": [0, 1]},
        "amount": {"type": "continuous", "bounds": [0.0, 1000.0], "point_masses": [0.0]},
        "age": {"type": "continuous", "bounds": [0.0, 100.0]},
    },
}


@pytest.fixture(scope="module")
def small() -> DatasetSchema:
    return DatasetSchema.from_dict(SMALL)


@pytest.fixture(scope="module")
def census() -> DatasetSchema:
    """The census demo schema with its money columns' 0 declared as a point mass."""
    raw = yaml.safe_load((CONFIGS / "census-demo.yaml").read_text())
    for name in ("capital_gain", "capital_loss"):
        raw["columns"][name]["point_masses"] = [0.0]
    return DatasetSchema.from_dict(raw)


@pytest.fixture(scope="module")
def census_real(census) -> pd.DataFrame:
    return make_demo_table(census, 3000, seed=1, shape=SHAPES["hard"])


def small_table(colour=None, flag=None, amount=None, age=None, rows: int = 1000) -> pd.DataFrame:
    """`rows` rows of the small schema; any column not given is the same fixed pattern every time."""
    cycle = np.arange(rows)
    return pd.DataFrame(
        {
            "colour": colour if colour is not None else np.array(["red", "green", "blue", "grey"])[cycle % 4],
            "flag": flag if flag is not None else cycle % 2,
            "amount": amount if amount is not None else (cycle % 10) * 100.0,
            "age": age if age is not None else 20.0 + cycle % 50,
        }
    )


def repeat(counts: dict) -> np.ndarray:
    return np.concatenate([np.full(n, value, dtype=object) for value, n in counts.items()])


def test_identical_tables_score_zero_everywhere(census, census_real):
    summary = fidelity_summary(census, census_real, census_real.copy())
    assert set(summary["column_tvd"].values()) == {0.0}
    for figure in (
        "categorical_tvd_mean",
        "categorical_tvd_worst",
        "continuous_tvd_mean",
        "continuous_tvd_worst",
        "pairwise_tvd_mean",
        "pairwise_tvd_worst",
        "point_mass_gap_max",
        "spearman_mad_continuous",
    ):
        assert summary[figure] == 0.0, figure
    assert summary["lost_levels"] == []
    assert set(summary["point_mass_gaps"]) == {"capital_gain=0", "capital_loss=0"}
    assert summary["pairs_scored"] == summary["pairs_total"] == 15 * 14 // 2
    assert {v["verdict"] for v in fidelity_verdicts(summary).values()} == {"met"}


def test_shifted_shares_give_the_hand_computed_tvd(small):
    real = small_table(colour=repeat({"red": 500, "green": 300, "blue": 150, "grey": 50}))
    # 70 rows move from red to blue, 20 from red to an undeclared value (its own extra cell):
    # 0.5 * (|500 - 410| + |150 - 220| + |0 - 20|) / 1000 = 0.09.
    synth = small_table(colour=repeat({"red": 410, "green": 300, "blue": 220, "grey": 50, "purple": 20}))
    tvd = column_tvd(small, real, synth)
    assert list(tvd.index) == ["colour", "flag", "amount", "age"]
    assert tvd["colour"] == pytest.approx(0.09, abs=1e-12)
    assert (tvd.drop("colour") == 0.0).all()
    summary = fidelity_summary(small, real, synth)
    assert summary["categorical_tvd_worst"] == pytest.approx(0.09, abs=1e-12)
    assert summary["categorical_tvd_worst_column"] == "colour"
    assert summary["categorical_tvd_mean"] == pytest.approx(0.045, abs=1e-12)  # colour and flag
    assert summary["continuous_tvd_mean"] == 0.0


def test_point_mass_gap_is_the_difference_of_shares_at_the_mass(small):
    real = small_table(amount=np.r_[np.zeros(920), np.full(80, 500.0)])
    synth = small_table(amount=np.r_[np.zeros(800), np.full(200, 500.0)])
    gaps = point_mass_gaps(small, real, synth)
    assert list(gaps.index) == ["amount=0"]
    assert gaps["amount=0"] == pytest.approx(0.12, abs=1e-12)
    summary = fidelity_summary(small, real, synth)
    assert summary["point_mass_gap_max"] == pytest.approx(0.12, abs=1e-12)
    assert fidelity_verdicts(summary)["point_mass_gap_max"]["verdict"] == "missed"


def test_a_value_at_the_point_mass_is_counted_in_its_own_cell_not_in_its_bin(small):
    # 0 and 1 lie in the same bin [0, 50): only the point mass's own cell tells them apart.
    real, synth = small_table(amount=np.zeros(1000)), small_table(amount=np.ones(1000))
    assert column_tvd(small, real, synth)["amount"] == 1.0
    assert point_mass_gaps(small, real, synth)["amount=0"] == 1.0
    without_mass = dataclasses.replace(
        small, columns=tuple(dataclasses.replace(c, point_masses=()) for c in small.columns)
    )
    assert column_tvd(without_mass, real, synth)["amount"] == 0.0
    assert point_mass_gaps(without_mass, real, synth).empty


def test_lost_levels_from_one_percent_of_the_real_rows(small):
    real = small_table(
        colour=repeat({"red": 900, "green": 81, "blue": 10, "grey": 9}),
        age=np.r_[np.full(950, 40.0), np.full(50, 92.0)],
    )
    synth = small_table(colour=repeat({"red": 910, "green": 90}), age=np.full(1000, 40.0))
    # blue holds exactly 1% of the real rows, grey 0.9%; the age cell [90, 95) 5%.
    assert lost_levels(small, real, synth) == [("colour", "blue"), ("age", "[90, 95)")]
    assert lost_levels(small, real, synth, floor=0.005) == [("colour", "blue"), ("colour", "grey"), ("age", "[90, 95)")]
    kept_one = small_table(colour=repeat({"red": 909, "green": 90, "blue": 1}), age=np.full(1000, 40.0))
    assert lost_levels(small, real, kept_one) == [("age", "[90, 95)")]


def test_pairwise_tvd_sees_a_dependence_that_the_marginals_hide(census):
    real = make_demo_table(census, 4000, seed=3)
    real["sex"] = np.where(
        real["relationship"] == "husband", "male", np.where(real["relationship"] == "wife", "female", real["sex"])
    )
    synth = real.copy()
    synth["sex"] = np.random.default_rng(0).permutation(real["sex"].to_numpy())
    assert (column_tvd(census, real, synth) == 0.0).all()
    pairs = pairwise_tvd(census, real, synth)
    involves_sex = [("sex" in pair) for pair in pairs.tvd.index]
    assert (pairs.tvd[[not s for s in involves_sex]] == 0.0).all()
    assert pairs.tvd[("relationship", "sex")] > 0.1
    assert pairs.worst_pair == ("relationship", "sex")
    assert not pairs.capped


def test_max_pairs_scores_evenly_spaced_pairs_and_says_so(census, census_real):
    assert scored_pairs(4, None) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    # Of the 10 pairs of 5 columns, positions 0, 3, 6 and 9.
    assert scored_pairs(5, 4) == [(0, 1), (0, 4), (1, 4), (3, 4)]
    capped = pairwise_tvd(census, census_real, census_real, max_pairs=10)
    assert len(capped.tvd) == 10 and capped.pairs_total == 105 and capped.capped
    assert capped.tvd.index[0] == ("age", "final_weight") and capped.tvd.index[-1] == ("native_country", "income")
    summary = fidelity_summary(census, census_real, census_real, max_pairs=10)
    assert (summary["pairs_scored"], summary["pairs_total"], summary["pairs_capped"]) == (10, 105, True)
    with pytest.raises(ValueError, match="max_pairs"):
        scored_pairs(4, 0)


def test_continuous_cells_come_from_the_public_bounds(small):
    real = small_table(age=np.r_[np.full(500, 40.0), np.full(500, 50.0)])
    # 85 lies outside the real rows' range [40, 50] but inside the bounds [0, 100]: its own bin [85, 90).
    synth = small_table(age=np.r_[np.full(500, 40.0), np.full(250, 50.0), np.full(250, 85.0)])
    assert column_tvd(small, real, synth)["age"] == pytest.approx(0.25, abs=1e-12)


def test_spearman_gap_between_continuous_columns(census, census_real):
    assert continuous_spearman_mad(census, census_real, census_real) == 0.0
    reversed_age = census_real.copy()
    reversed_age["age"] = 107 - census_real["age"]  # reverses age's ranks: every correlation with it flips sign
    assert continuous_spearman_mad(census, census_real, reversed_age) > 0.05
    only_one = dataclasses.replace(census, columns=(census.column("age"), census.column("income")))
    assert continuous_spearman_mad(only_one, census_real, census_real) is None


def plain_types(value) -> bool:
    """Only what json writes back as it read: no numpy scalar (np.float64 passes json.dumps silently)."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and plain_types(v) for k, v in value.items())
    if isinstance(value, list):
        return all(plain_types(v) for v in value)
    return value is None or type(value) in (bool, int, float, str)


def test_summary_is_plain_json_even_with_figures_that_do_not_apply(census, census_real, small):
    synth = make_demo_table(census, 2000, seed=2, shape=SHAPES["hard"])
    synth["native_country"] = "united-states"  # loses levels; a constant column has no rank correlation
    synth["capital_gain"] = 0
    summary = fidelity_summary(census, census_real, synth)
    assert plain_types(summary)
    assert json.loads(json.dumps(summary, allow_nan=False)) == summary
    assert ["native_country", "mexico"] in summary["lost_levels"]
    discrete_only = dataclasses.replace(small, columns=tuple(small.discrete))
    summary = fidelity_summary(discrete_only, small_table(), small_table())
    json.dumps(summary, allow_nan=False)
    assert summary["continuous_tvd_mean"] is None and summary["spearman_mad_continuous"] is None
    assert summary["point_mass_gap_max"] is None
    verdicts = fidelity_verdicts(summary)
    assert verdicts["continuous_tvd_mean"]["verdict"] == "n/a"
    assert plain_types(verdicts)


@pytest.mark.parametrize("figure", [f for f in FIDELITY_TARGETS if f != "lost_levels"])
def test_verdicts_flip_at_the_target(figure):
    target = FIDELITY_TARGETS[figure]
    assert fidelity_verdicts({figure: target})[figure]["verdict"] == "met"
    assert fidelity_verdicts({figure: float(np.nextafter(target, 1.0))})[figure]["verdict"] == "missed"
    assert fidelity_verdicts({})[figure] == {"value": None, "target": target, "verdict": "n/a", "light": "n/a"}


def test_any_lost_level_misses_its_target():
    assert fidelity_verdicts({"lost_levels": []})["lost_levels"]["verdict"] == "met"
    missed = fidelity_verdicts({"lost_levels": [["colour", "blue"]]})["lost_levels"]
    assert missed == {"value": 1, "target": 0, "verdict": "missed", "light": "red"}


def test_tables_without_rows_or_columns_are_refused(small):
    with pytest.raises(ValueError, match="synthetic table has no rows"):
        column_tvd(small, small_table(), small_table().iloc[:0])
    with pytest.raises(ValueError, match=r"lacks schema columns \['age'\]"):
        column_tvd(small, small_table().drop(columns="age"), small_table())


def test_the_fidelity_bench_scores_every_census_pair_as_the_naive_crosstab_does(census, capsys):
    """bench/fidelity.py at a tiny size (its speed is measured by running it: docs/measurements.md): every
    pair of the census schema scored, the same 2-way TVDs as pandas' crosstab, its schema the test's."""
    from bench.fidelity import census_schema, main

    assert census_schema() == census
    summary = main(["--rows", "400", "--json"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == summary
    assert summary["pairs"] == 105 and summary["rows"] == 400
    assert summary["max_abs_diff"] < 1e-12
    assert summary["ratio"] > 0 and summary["summary_seconds"] > 0


def test_sdmetrics_quality_is_none_without_sdmetrics(small, monkeypatch):
    for name in ("sdmetrics", "sdmetrics.reports", "sdmetrics.reports.single_table"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed (even once imported)
    assert sdmetrics_quality(small, small_table(), small_table()) is None


def test_sdmetrics_quality_runs_the_quality_report_with_the_schemas_metadata(census, census_real):
    """The real QualityReport: a table scores about 1 against itself, lower against a table whose columns
    were shuffled apart (shapes kept, pair trends broken); the metadata follows the schema's kinds."""
    metadata = sdmetrics_metadata(census)
    assert metadata["columns"]["age"] == {"sdtype": "numerical"}
    assert metadata["columns"]["income"] == {"sdtype": "categorical"}
    real = census_real.iloc[:1000]
    same = sdmetrics_quality(census, real, real)
    assert same is not None and plain_types(same)
    assert same["column_shapes"] == pytest.approx(1.0) and same["column_pair_trends"] == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    shuffled = real.apply(lambda column: column.to_numpy()[rng.permutation(len(column))])
    broken = sdmetrics_quality(census, real, shuffled)
    assert broken["column_shapes"] == pytest.approx(1.0)  # every column's values are the real ones
    assert broken["column_pair_trends"] < 0.97
    assert broken["overall"] == pytest.approx((broken["column_shapes"] + broken["column_pair_trends"]) / 2)


def test_sdmetrics_quality_reads_a_deterministic_subsample_beyond_its_cap(census, census_real):
    synth = make_demo_table(census, 2000, seed=2, shape=SHAPES["hard"])
    first = sdmetrics_quality(census, census_real, synth, max_rows=500, seed=3)
    assert first["rows_scored"] == [500, 500]
    assert sdmetrics_quality(census, census_real, synth, max_rows=500, seed=3) == first
    assert sdmetrics_quality(census, census_real, synth, max_rows=None)["rows_scored"] == [3000, 2000]


@pytest.mark.parametrize(
    ("value", "target", "light"),
    [(0.01, 0.01, GREEN), (0.0101, 0.01, AMBER), (0.02, 0.01, AMBER), (0.0201, 0.01, RED), (0, 0, GREEN), (1, 0, RED)],
)
def test_traffic_light_is_green_at_the_target_amber_within_twice_it_red_beyond(value, target, light):
    assert traffic_light(value, target) == light
    assert traffic_light(None, target) == "n/a"


def published_run(folder: Path, schema: DatasetSchema, config: Path) -> Path:
    """A release folder as bench/utility_study.py reads it, from generated rows only."""
    real = make_demo_table(schema, 600, seed=5)
    (folder / "split").mkdir(parents=True)
    (folder / "preprocess").mkdir()
    (folder / "bundle").mkdir()
    np.savez(folder / "split" / "split.npz", test=np.arange(300, 600))
    np.save(folder / "preprocess" / "encoded.npy", TableEncoder(schema).encode(real))
    make_demo_table(schema, 400, seed=6).to_parquet(folder / "bundle" / "synthetic.parquet")
    summary = {"epsilon": 1.0, "auc": 0.7, "real_auc": 0.8, "iteration": 10}
    (folder / "run.json").write_text(
        json.dumps({"status": "published", "summary": summary, "run_id": f"{schema.name}-smoke-0a1b"})
    )
    return folder


def test_utility_study_reports_fidelity_beside_its_figures(tmp_path, capsys):
    from bench import utility_study

    config = CONFIGS / "cardio.yaml"
    schema = DatasetSchema.from_yaml(config)
    run = published_run(tmp_path / "run", schema, config)
    row = utility_study.measure(schema, run)
    assert row["profile"] == "smoke"
    assert {"mean_tvd", "levels_lost", *utility_study.FIDELITY_COLUMNS, "fidelity_missed"} <= set(row)
    assert row["fidelity"]["real_rows"] == 300 and row["fidelity"]["synthetic_rows"] == 400
    assert set(row["fidelity"]["verdicts"]) == set(FIDELITY_TARGETS)
    assert np.isnan(row["fidelity_point_mass_gap_max"])  # cardio declares no point mass
    # The numeric shapes beside the public-bin figures: per column, and their targets among the verdicts.
    numeric = [col.name for col in schema.continuous]
    for figure in ("continuous_quantile_tvd_worst", "continuous_ks_worst", "pairwise_quantile_tvd_mean"):
        assert 0 < row[f"fidelity_{figure}"] <= 1 and figure in row["fidelity"]["verdicts"]
    shapes = utility_study.numeric_shapes([row])
    assert list(shapes["column"]) == numeric
    assert list(shapes["ks"]) == [row["fidelity"]["continuous_ks"][name] for name in numeric]
    assert list(shapes["public_bin_tvd"]) == [row["fidelity"]["column_tvd"][name] for name in numeric]

    assert utility_study.main(["--config", str(config), str(run), "--json"]) == 0
    printed = capsys.readouterr().out
    assert "Fidelity (targets:" in printed
    assert "Numeric columns: TVD on public bins, TVD on 20 cells at the real quantiles" in printed
    runs = json.loads(printed.strip().splitlines()[-1])["runs"]
    assert runs[0]["fidelity"]["pairs_total"] == 12 * 11 // 2
    assert "fidelity_missed" not in runs[0] and runs[0]["mean_tvd"] >= 0


def test_a_discrete_columns_tvd_is_the_quality_modules(census):
    """One per-column distance: fidelity's 1-way TVD of a binary or categorical column is the sample-quality
    module's (both over the declared levels plus one cell for anything else, missing values included)."""
    from dpsynth.models.evaluation.quality import tvd_by_feature

    real, synth = make_demo_table(census, 800, seed=1), make_demo_table(census, 600, seed=2)
    synth.loc[synth.index[:40], census.discrete[0].name] = None
    discrete = [col.name for col in census.discrete]
    pd.testing.assert_series_equal(
        column_tvd(census, real, synth)[discrete],
        tvd_by_feature(census, real, synth),
        check_names=False,
        rtol=0,
        atol=0,
    )
