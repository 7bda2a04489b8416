"""A release of a wide table end to end: the census-like demo schema (108 encoded columns, a 42-level
column, heavy-tailed continuous columns) with the smoke profile, as a release that publishes. It keeps every stage
honest at a width
far from Cardio's 16, and its duration (pytest --durations) shows a width regression in CI: about 50 s
on the 2-core development machine."""

import json
import time

import pandas as pd

from dpsynth.flows.cli import main
from dpsynth.models.data.demo import make_demo_table
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.tasks.registry import load_released_model, registry_client
from tests.conftest import ROOT, publishing_smoke

CENSUS_SCHEMA = ROOT / "configs" / "census-demo.yaml"


def test_wide_table_releases_end_to_end(isolated_workdir, capfd):
    schema = DatasetSchema.from_yaml(CENSUS_SCHEMA)
    assert TableEncoder(schema).width >= 100
    data = isolated_workdir / "census.csv"
    make_demo_table(schema, 3000, seed=2).to_csv(data, sep=schema.separator, index=False)

    started = time.perf_counter()
    code = main(
        [
            "release",
            "--config",
            str(CENSUS_SCHEMA),
            "--data",
            str(data),
            "--profile",
            publishing_smoke(isolated_workdir / "profiles"),
            "--json",
        ]
    )
    seconds = time.perf_counter() - started
    assert code == 0
    summary = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    print(f"wide release: {seconds:.1f} s")
    out = isolated_workdir / summary["run_dir"]
    assert summary["epsilon"] > 0 and 0.0 <= summary["auc"] <= 1.0
    for stage in ("pretrain-k10", "train-k10", "sample-k10", "evaluate-k10/000", "report"):
        assert (out / stage / "manifest.json").exists(), stage

    champion = registry_client().get_model_version_by_alias("census_demo-gswgan", "champion")
    assert float(champion.tags["epsilon"]) == summary["epsilon"]
    rows = load_released_model("models:/census_demo-gswgan@champion").predict(
        pd.DataFrame({"n_rows": [200], "seed": [1]})
    )
    assert list(rows.columns) == [c.name for c in schema.columns]
    for column in schema.columns:
        if column.is_continuous:
            low, high = column.bounds
            assert rows[column.name].between(low, high).all(), column.name
        else:
            assert set(rows[column.name].astype(str)) <= {str(level) for level in column.levels}, column.name


def test_the_harder_table_releases_with_a_dp_sgd_generator(isolated_workdir, capfd):
    """The utility study's harder table (--shape hard: mostly-zero long tails, rare levels, a 25/75 target)
    through DP-auto-GAN: every level it emits is declared, every value inside its bounds. Six steps a phase
    (the smoke size's 20 cost 40 s of DP-SGD at this width): the claim is on what it emits, not how well."""
    from dpsynth.models.data.demo import SHAPES

    schema = DatasetSchema.from_yaml(CENSUS_SCHEMA)
    data = isolated_workdir / "census-hard.csv"
    make_demo_table(schema, 3000, seed=3, shape=SHAPES["hard"]).to_csv(data, sep=schema.separator, index=False)
    assert (
        main(
            [
                "release",
                "--config",
                str(CENSUS_SCHEMA),
                "--data",
                str(data),
                "--profile",
                publishing_smoke(
                    isolated_workdir / "profiles",
                    dpautogan={"autoencoder_steps": 6, "generator_steps": 6, "checkpoint_every": 3},
                ),
                "--generator",
                "dpautogan",
                "--json",
            ]
        )
        == 0
    )
    summary = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert summary["model_uri"] == "models:/census_demo-dpautogan/1"
    rows = pd.read_parquet(isolated_workdir / summary["run_dir"] / "bundle" / "synthetic.parquet")
    for column in schema.columns:
        if column.is_continuous:
            assert rows[column.name].between(*column.bounds).all(), column.name
        else:
            assert set(rows[column.name].astype(str)) <= {str(level) for level in column.levels}, column.name
