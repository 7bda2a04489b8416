"""bench/floors.py (docs/utility-study.md section 17) on a tiny generated census table: its cells are the
scorer's, its rho is the accountant's, its floors carry the mechanism's noise, and its command prints the
table's lines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench import floors
from dpsynth.models.data.demo import SHAPES, make_demo_table
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.evaluation.fidelity import fidelity_summary
from dpsynth.models.generators.graphical.mechanisms import gaussian_std, rho_for_epsilon
from dpsynth.models.profiles import load_named

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "census-demo.yaml"


@pytest.fixture(scope="module")
def table() -> tuple[DatasetSchema, pd.DataFrame]:
    schema = DatasetSchema.from_yaml(CONFIG)
    whole = make_demo_table(schema, 2000, seed=5, shape=SHAPES["heaped"])
    return schema, whole[[c.name for c in schema.columns]]


def test_counts_on_the_scorers_cells_score_as_the_scorer(table):
    # The training rows at their own size: rounding changes no count, so the count path must give
    # fidelity_summary's figures exactly; a cell cut differently (not the whole table's quantiles, the
    # missing cell dropped) would not.
    schema, whole = table
    profile = load_named("mst-eps1", CONFIG)
    train = floors.training_split(len(whole), profile, seed=0)["train"]
    summary = fidelity_summary(schema, whole, whole.iloc[train].reset_index(drop=True))
    counted = floors.exact_count_figures(floors.scoring_cells(schema, whole), train, len(train))
    assert counted["cat_1way"] == pytest.approx(summary["categorical_tvd_mean"], abs=1e-12)
    assert counted["num_worst"] == pytest.approx(summary["continuous_quantile_tvd_worst"], abs=1e-12)
    assert counted["twoway_mean"] == pytest.approx(summary["pairwise_quantile_tvd_mean"], abs=1e-12)
    assert counted["twoway_worst"] == pytest.approx(summary["pairwise_quantile_tvd_worst"], abs=1e-12)


def test_rounded_places_every_row():
    placed = floors.rounded(np.array([1.0, 1.0, 1.0]), 10)
    assert placed.sum() == 10 and sorted(placed) == [3, 3, 4]


def test_the_split_and_rho_are_the_releases(table):
    schema, whole = table
    profile = load_named("mst-eps1", CONFIG)
    split = floors.training_split(len(whole), profile, seed=0)
    assert sorted(np.concatenate(list(split.values()))) == list(range(len(whole)))
    assert 0.75 < len(split["train"]) / len(whole) < 0.85
    assert floors.released_rows(split) == len(split["train"]) + len(split["val"])
    assert floors.release_rho(profile) == pytest.approx(rho_for_epsilon(1.0, 1e-5))


def test_a_floor_carries_the_mechanisms_noise(table):
    # Spending rho on the 1-way counts costs something: the floor is above the exact counts', and more so at
    # a larger noise std; with no noise it would equal them.
    schema, whole = table
    profile = load_named("mst-eps1", CONFIG)
    train = floors.training_split(len(whole), profile, seed=0)["train"]
    cells = floors.scoring_cells(schema, whole)
    exact = floors.exact_count_figures(cells, train, 1800)
    rng = np.random.default_rng(0)
    rho = floors.release_rho(profile)
    discrete = sum(not c.is_continuous for c in schema.columns)

    def draws(std: float) -> list[dict]:
        return [floors.one_way_floor(cells, train, 1800, std, True, rng) for _ in range(4)]

    at_rho, at_tenth = draws(gaussian_std(rho / discrete)), draws(gaussian_std(rho / 10 / discrete))
    mean_at_rho = np.mean([d["cat_1way"] for d in at_rho])
    assert mean_at_rho > exact["cat_1way"] + 0.005
    assert np.mean([d["cat_1way"] for d in at_tenth]) > mean_at_rho
    assert floors.one_way_floor(cells, train, 1800, 1e-9, True, rng)["cat_1way"] == pytest.approx(exact["cat_1way"])
    pairs = floors.two_way_floor(cells, train, 1800, gaussian_std(rho), rng)
    assert pairs["twoway_mean"] > exact["twoway_mean"] + 0.01


def test_the_command_prints_the_tables_lines(table, tmp_path, capsys):
    schema, whole = table
    data = tmp_path / "tiny.csv"
    whole.to_csv(data, index=False)
    floors.main(["--config", str(CONFIG), "--data", str(data), "--draws", "1", "--rows-released", "1800"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["line"] for line in lines] == [
        "training rows",
        "bootstrap",
        "exact counts",
        "one-way floor, categorical, all rho",
        "one-way floor, categorical, half rho",
        "one-way floor, categorical, MST's 1-way std",
        "one-way floor, categorical, all rho, std by cells^(-1/3)",
        "one-way floor, numeric, all rho",
        "one-way floor, numeric, MST's 1-way std",
        "two-way floor, each pair alone, all rho",
        "two-way, all 105 pairs at rho / 105",
    ]
    assert all(line["released"] == 1800 and line["rho"] == pytest.approx(0.020812, abs=1e-6) for line in lines)
    assert lines[3]["share"] == pytest.approx(1.0) and lines[4]["share"] == pytest.approx(0.5)
    assert lines[6]["share"] == pytest.approx(1.0) and len(set(lines[6]["std"])) > 1
    assert all(isinstance(line.get("cat_1way", 0.0), float) for line in lines)
