"""The Python API (docs/api.md): `import dpsynth` stays light, a drafted schema takes no bound or level
from the rows, `load` samples a generator file as the pyfunc model does (seeded, fresh, conditioned; the
format version checked, in a fresh process too), and the documented example runs end to end: fit on a
DataFrame, release, load from the bundle and the registry, sample with and without a seed and under a
condition. The two releases run a Prefect flow (`flow`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import dpsynth
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.gswgan.generator_files import GeneratorSpec
from dpsynth.models.generators.samplers import (
    FORMAT_VERSION_KEY,
    GENERATOR_FORMAT_VERSION,
    load_sampler,
    sample_rows,
)
from tests.conftest import CARDIO_SCHEMA, ROOT, publishing_smoke


def write_generator(folder: Path, schema, *, conditional: bool, format_version: int | None = 1) -> Path:
    """A tiny untrained GS-WGAN generator file as a release writes it, with the schema beside it."""
    encoder = TableEncoder(schema)
    condition = (encoder.target_index, 0.5) if conditional else None
    spec = GeneratorSpec(4, (8,), encoder.width, "tanh", tuple((b.start, b.stop) for b in encoder.blocks), condition)
    torch.manual_seed(0)
    blob = {"spec": spec.to_dict(), "state_dict": spec.build().state_dict(), "generator_type": "gswgan"}
    blob.update({"iteration": 20, "epsilon": 3.0, "delta": 1e-5})
    if format_version is not None:
        blob[FORMAT_VERSION_KEY] = format_version
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(blob, folder / "generator.pt")
    (folder / "schema.yaml").write_text(CARDIO_SCHEMA.read_text())
    return folder / "generator.pt"


def test_import_dpsynth_loads_no_torch_prefect_or_mlflow():
    code = (
        "import sys, dpsynth; heavy = [m for m in ('torch', 'prefect', 'mlflow') if m in sys.modules]; "
        "assert not heavy, heavy; assert {'Schema', 'release', 'Release', 'load', 'Sampler'} <= set(dir(dpsynth))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_drafted_schema_has_types_and_placeholders_never_values(demo_frame, tmp_path):
    draft = dpsynth.Schema.draft(demo_frame, name="cardio", id_column="id")
    kinds = {name: entry["type"] for name, entry in draft.to_dict()["columns"].items()}
    # Kinds from dtypes alone: every numeric column is continuous, codes too (the steward makes them
    # categorical), with its bounds and its decimals to fill.
    assert kinds["age"] == kinds["ap_hi"] == kinds["gender"] == kinds["cholesterol"] == "continuous"
    assert {"column 'age': bounds", "column 'age': decimals", "column 'gender': decimals"} <= set(draft.placeholders())
    assert draft.target is None and "target" in draft.placeholders()
    with pytest.raises(ConfigError, match="(?i)fill each from public knowledge"):
        draft.validated()
    # Nothing of the rows is in it: no column's extremes or levels.
    text = draft.yaml_text()
    for column in ("age", "ap_hi", "height"):
        for value in (demo_frame[column].min(), demo_frame[column].max()):
            assert not re.search(rf"(?<![\d.]){re.escape(str(value))}(?![\d.])", text), (column, value)
    # Saved for editing, read back with its placeholders, refused by a release before any work.
    saved = dpsynth.Schema.from_yaml(draft.to_yaml(tmp_path / "draft.yaml"))
    assert saved.placeholders() == draft.placeholders()
    with pytest.raises(ConfigError, match="placeholders"):
        dpsynth.release(demo_frame, saved, profile="smoke", publish=False)
    assert not (tmp_path / "dpsynth-home" / "runs").exists()
    # Filled from the published schema (public knowledge here), it is the same schema.
    public = dpsynth.Schema.from_yaml(CARDIO_SCHEMA).to_dict()
    filled = draft.with_target(public["target"])
    for name, entry in public["columns"].items():
        filled = filled.fill(
            name,
            bounds=entry.get("bounds"),
            levels=entry.get("levels"),
            decimals=entry.get("decimals"),
            kind=entry["type"],
        )

    def essentials(schema):
        return schema.target, schema.id_column, [(c.name, c.kind, c.bounds, c.levels) for c in schema.columns]

    assert essentials(filled.validated()) == essentials(dpsynth.Schema.from_yaml(CARDIO_SCHEMA).validated())
    # Naming the target declares it binary, whatever its values.
    assert dpsynth.Schema.draft(demo_frame, target="age").to_dict()["columns"]["age"]["type"] == "binary"


def test_a_draft_is_the_same_for_two_tables_that_differ_in_one_row():
    """Issue 39 point 4: a draft reads no value, so replacing one row changes nothing in it (before, a
    numeric column with 20 distinct values was drafted categorical and with 21 continuous)."""
    codes = pd.DataFrame({"code": np.arange(40) % 20, "pair": np.arange(40) % 2, "text": ["a", "b"] * 20})
    replaced = codes.copy()
    replaced.loc[0, ["code", "pair", "text"]] = [99, 7, "c"]  # a 21st code, a third value, a third level
    assert dpsynth.Schema.draft(codes).yaml_text() == dpsynth.Schema.draft(replaced).yaml_text()
    assert (
        dpsynth.Schema.draft(codes, target="pair").to_dict() == dpsynth.Schema.draft(replaced, target="pair").to_dict()
    )


def test_load_samples_as_the_pyfunc_model_fresh_without_a_seed(tmp_path, cardio_schema):
    generator_file = write_generator(tmp_path / "bundle", cardio_schema, conditional=False)
    sampler = dpsynth.load(tmp_path / "bundle")
    assert sampler.format_version == GENERATOR_FORMAT_VERSION and sampler.epsilon == 3.0
    seeded = sampler.sample(200, seed=5)
    expected = sample_rows(load_sampler(generator_file), TableEncoder(cardio_schema), 200, 5)
    pd.testing.assert_frame_equal(seeded, expected)
    pd.testing.assert_frame_equal(dpsynth.load(generator_file).sample(200, seed=5), expected)
    assert list(seeded.columns) == cardio_schema.column_names
    assert not sampler.sample(200).equals(sampler.sample(200))  # fresh randomness each call
    # Not a conditional generator: the target's condition is drawn by rejection, still exact.
    assert set(sampler.sample(300, seed=1, conditions={"cardio": 1})["cardio"]) == {1}
    with pytest.raises(ConfigError, match="not a level"):
        sampler.sample(10, conditions={"cardio": 7})
    with pytest.raises(ConfigError, match="too rare"):
        sampler.sample(10, seed=0, conditions={"ap_hi": (123.25, 123.25)})


def test_conditional_generator_sets_the_label_and_other_columns_go_by_rejection(tmp_path, cardio_schema):
    write_generator(tmp_path / "bundle", cardio_schema, conditional=True)
    sampler = dpsynth.load(tmp_path / "bundle")
    both = sampler.sample(2000, seed=3)
    assert set(both["cardio"]) == {0, 1}
    sick = sampler.sample(500, seed=3, conditions={"cardio": 1})
    assert len(sick) == 500 and set(sick["cardio"]) == {1}
    pd.testing.assert_frame_equal(sick, sampler.sample(500, seed=3, conditions={"cardio": 1}))
    assert set(sampler.sample(500, seed=3, conditions={"cardio": 0})["cardio"]) == {0}
    old = sampler.sample(300, seed=4, conditions={"cardio": 1, "age": (15000, 20000), "gluc": 1})
    assert len(old) == 300 and set(old["cardio"]) == {1} and set(old["gluc"]) == {1}
    assert old["age"].between(15000, 20000).all()


def test_format_version_newer_refused_older_loads_as_version_one(tmp_path, cardio_schema):
    write_generator(tmp_path / "old", cardio_schema, conditional=False, format_version=None)
    assert dpsynth.load(tmp_path / "old").format_version == 1
    write_generator(tmp_path / "new", cardio_schema, conditional=False, format_version=GENERATOR_FORMAT_VERSION + 1)
    with pytest.raises(ConfigError, match="upgrade dpsynth"):
        dpsynth.load(tmp_path / "new")


@pytest.mark.slow
def test_generator_file_loads_in_a_fresh_process_without_its_run_folder(tmp_path, cardio_schema):
    generator_file = write_generator(tmp_path / "copy", cardio_schema, conditional=True)
    code = "import sys, dpsynth; print(dpsynth.load(sys.argv[1]).sample(20, seed=9).to_json())"
    out = subprocess.run([sys.executable, "-c", code, str(generator_file)], check=True, capture_output=True, text=True)
    fresh = pd.read_json(__import__("io").StringIO(out.stdout.strip().splitlines()[-1]))
    here = dpsynth.load(generator_file).sample(20, seed=9)
    np.testing.assert_allclose(fresh.to_numpy(dtype=float), here.to_numpy(dtype=float))


def test_pyfunc_seed_is_optional_and_a_given_seed_keeps_its_rows(tmp_path, cardio_schema):
    import mlflow.pyfunc

    from dpsynth.models.pyfunc import GENERATOR_ARTIFACT, SCHEMA_ARTIFACT, SyntheticTableModel, model_signature

    generator_file = write_generator(tmp_path / "bundle", cardio_schema, conditional=False)
    expected = sample_rows(load_sampler(generator_file), TableEncoder(cardio_schema), 5, 0)
    mlflow.pyfunc.save_model(
        path=str(tmp_path / "model"),
        python_model=SyntheticTableModel(),
        artifacts={GENERATOR_ARTIFACT: str(generator_file), SCHEMA_ARTIFACT: str(tmp_path / "bundle" / "schema.yaml")},
        signature=model_signature(expected),
    )
    model = mlflow.pyfunc.load_model(str(tmp_path / "model"))
    pd.testing.assert_frame_equal(model.predict(pd.DataFrame({"n_rows": [5], "seed": [0]})), expected)
    unseeded = model.predict(pd.DataFrame({"n_rows": [5]}))
    assert len(unseeded) == 5 and not unseeded.equals(model.predict(pd.DataFrame({"n_rows": [5]})))


def test_a_publishing_release_refuses_a_given_secret_before_any_work(demo_csv, smoke_release, test_secret):
    with pytest.raises(ConfigError, match="never takes a given privacy secret"):
        dpsynth.release(demo_csv, CARDIO_SCHEMA, profile=smoke_release, secret=test_secret)
    assert not (Path(demo_csv).parent / "dpsynth-home" / "runs").exists()


def _documented_example() -> str:
    text = (ROOT / "docs" / "api.md").read_text()
    return re.search(r"## Example\n.*?```python\n(.*?)```", text, re.S).group(1)


def test_readme_shows_the_example_this_module_runs():
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"## From Python\n\n```python\n(.*?)```", readme, re.S).group(1) == _documented_example()


@pytest.mark.flow
def test_documented_example_runs_release_load_sample(prefect_backend, isolated_workdir, tmp_path):
    example = _documented_example()
    profile = publishing_smoke(tmp_path / "publishing")
    for old, new in (
        ('"configs/cardio.yaml"', repr(str(CARDIO_SCHEMA))),
        ('profile="eps1", home="~/.dpsynth"', f"profile={profile!r}, home={str(isolated_workdir)!r}"),
    ):
        assert old in example, f"docs/api.md's example no longer says {old}"
        example = example.replace(old, new)
    scope: dict = {}
    exec(compile(example, "docs/api.md", "exec"), scope)  # noqa: S102 - the documented example itself
    rel, sampler = scope["rel"], scope["sampler"]
    assert rel.published and rel.bundle.is_dir() and rel.model_uri.startswith("models:/")
    record = json.loads((rel.bundle / "release.json").read_text())
    assert rel.epsilon == record["epsilon"] and rel.delta == record["delta"]
    assert record["epsilon_covers"] in rel.statement
    assert rel.quality.internal and 0.0 <= rel.quality.auc <= 1.0
    # The DataFrame went into the home's internal store, owner-only, and the release is in the ledger.
    inputs = list((isolated_workdir / "inputs").glob("*.csv"))
    assert len(inputs) == 1 and inputs[0].stat().st_mode & 0o077 == 0
    from dpsynth.tasks.ledger import entries

    assert [e.release_id for e in entries("cardio")] == [rel.release_id]
    # Seeded rows repeat and are the bundle's own (sampled with the profile's seed 0); unseeded ones do not.
    pd.testing.assert_frame_equal(scope["fixed"], sampler.sample(1000, seed=7))
    assert not scope["fresh"].equals(sampler.sample(1000))
    bundle_rows = pd.read_parquet(rel.bundle / "synthetic.parquet")
    pd.testing.assert_frame_equal(sampler.sample(len(bundle_rows), seed=0), bundle_rows, check_dtype=False)
    # The smoke file carries measured marginals: the condition goes by rejection from calibrated rows.
    assert len(scope["sick"]) == 500 and set(scope["sick"]["cardio"]) == {1}
    # The registered model: the same rows as the bundle's generator, and as its pyfunc predict.
    registered = dpsynth.load(rel.model_uri)
    pd.testing.assert_frame_equal(registered.sample(300, seed=7), sampler.sample(300, seed=7))
    from dpsynth.tasks.registry import load_released_model

    predicted = load_released_model(rel.model_uri).predict(pd.DataFrame({"n_rows": [300], "seed": [7]}))
    pd.testing.assert_frame_equal(predicted, sampler.sample(300, seed=7), check_dtype=False)
    assert registered.format_version == GENERATOR_FORMAT_VERSION
    assert torch.load(rel.bundle / "generator.pt", weights_only=True)[FORMAT_VERSION_KEY] == GENERATOR_FORMAT_VERSION


@pytest.mark.flow
def test_trial_from_python_spends_nothing_and_takes_the_test_secret(prefect_backend, demo_frame, test_secret):
    from dpsynth.models.privacy.secret import load as load_secret
    from dpsynth.tasks.ledger import entries

    store_before = os.environ.get("MLFLOW_TRACKING_URI")
    with pytest.warns(UserWarning, match="trial on a real table"):
        rel = dpsynth.release(demo_frame, dpsynth.Schema.from_yaml(CARDIO_SCHEMA), profile="smoke", secret=test_secret)
    # MLflow writes the store it was pointed at into os.environ, where the next release (from another home,
    # say) would read it first: the caller's environment comes back as it was.
    assert os.environ.get("MLFLOW_TRACKING_URI") == store_before
    assert not rel.published and rel.bundle is None and rel.model_uri is None
    assert rel.epsilon > 0 and "Epsilon does NOT cover" in rel.statement
    assert load_secret(rel.run_dir) == test_secret
    assert entries("cardio") == []
    # A trial's sampler is its internal generator's, for the steward's eyes only (Great Expectations routes
    # warnings to logging when first imported: back to warnings here).
    __import__("logging").captureWarnings(False)
    with pytest.warns(UserWarning, match="for the data steward's eyes only"):
        assert len(rel.sampler().sample(10, seed=0)) == 10


def test_epsilon_is_a_shortcut_over_the_profiles_budget_planned_by_the_accountant(demo_csv, smoke_release):
    from dpsynth.models.errors import BudgetExceededError

    # Smoke's ten critics cost epsilon about 71 by their first checkpoint: a budget of 0.5 reaches the
    # planner, which refuses it before any work.
    with pytest.raises(BudgetExceededError, match="budget 0.5"):
        dpsynth.release(demo_csv, CARDIO_SCHEMA, profile=smoke_release, epsilon=0.5)
    for bad in (0, -1.0, float("nan"), "1"):
        with pytest.raises(ConfigError, match="epsilon= must be a positive number"):
            dpsynth.release(demo_csv, CARDIO_SCHEMA, profile=smoke_release, epsilon=bad)
    with pytest.raises(ConfigError, match="delta= must be below 1"):
        dpsynth.release(demo_csv, CARDIO_SCHEMA, profile=smoke_release, delta=1.5)
    assert not (Path(demo_csv).parent / "dpsynth-home" / "runs").exists()


def test_api_errors_name_the_apis_own_arguments(demo_csv, smoke_release):
    from dpsynth.models.errors import BudgetExceededError
    from dpsynth.models.privacy.lifetime import ReleaseCost, TrainingCurve
    from dpsynth.tasks import ledger
    from dpsynth.tasks.stage import sha256_file

    cost = ReleaseCost(4.0, 1e-5, TrainingCurve(1000, 5000, 32, 1.07, "per_row"), 1.0, True)
    ledger.enter("cardio", "earlier", cost, None, input_sha256=sha256_file(Path(demo_csv)))
    with pytest.raises(BudgetExceededError) as refused:
        dpsynth.release(demo_csv, CARDIO_SCHEMA, profile=smoke_release)
    assert "allow_same_input=True" in str(refused.value) and "--allow-same-input" not in str(refused.value)


def test_release_repr_is_one_line_and_fidelity_reads_the_quality(tmp_path):
    from dpsynth.api.release import Quality, Release

    quality = Quality(auc=0.8, real_auc=0.81, fidelity={"pairwise_tvd_mean": 0.02})
    common = dict(statement="Epsilon covers...\n\nEpsilon does NOT cover:\n- x", run_dir=tmp_path, quality=quality)
    published = Release(
        "r1", True, 0.98, 1e-5, bundle=tmp_path / "bundle", model_uri="models:/t/1", table="t", **common
    )
    trial = Release("r2", False, 0.98, 1e-5, bundle=None, model_uri=None, table="t", **common)
    assert repr(published) == f"Release(t: epsilon 0.98, delta 1e-05, published, bundle {tmp_path / 'bundle'})"
    assert repr(trial) == "Release(t: epsilon 0.98, delta 1e-05, trial, nothing published)"
    assert "\n" not in repr(published) + str(trial)
    assert published.fidelity == {"pairwise_tvd_mean": 0.02}


@pytest.mark.flow
def test_a_trial_samples_its_internal_generator_at_the_given_epsilon_with_fidelity_for_mst(
    prefect_backend, demo_frame, tmp_path, private_home
):
    import logging
    import warnings

    profile = publishing_smoke(tmp_path / "publishing")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the trial on a real table's (another test checks it)
        rel = dpsynth.release(
            demo_frame,
            dpsynth.Schema.from_yaml(CARDIO_SCHEMA),
            profile=profile,
            generator="mst",
            epsilon=2.0,
            publish=False,
        )
    # Libraries may have routed warnings to logging (logging.captureWarnings): back to warnings here.
    logging.captureWarnings(False)
    # The accountant planned MST's rho to the given budget: the whole release within it, training at it.
    assert not rel.published and 1.0 <= rel.epsilon <= 2.0
    summary = json.loads((rel.run_dir / "run.json").read_text())["summary"]
    assert 1.9 < summary["epsilon_training"] <= 2.0
    assert repr(rel).startswith("Release(cardio: epsilon ") and "trial" in repr(rel)
    # The report's fidelity figures, for MST too: 1-way, 2-way, Spearman and SDMetrics' scores.
    for key in ("column_tvd", "categorical_tvd_mean", "pairwise_tvd_mean", "spearman_mad_continuous", "sdmetrics"):
        assert key in rel.fidelity, key
    assert 0.0 <= rel.fidelity["pairwise_tvd_mean"] <= 1.0
    # A trial's generator samples, with a warning, and writes nothing anywhere.
    before = sorted(p for p in private_home.rglob("*"))
    with pytest.warns(UserWarning, match="for the data steward's eyes only"):
        sampler = rel.sampler()
    rows = sampler.sample(200, seed=1)
    assert len(rows) == 200 and list(rows.columns) == demo_frame.columns.drop("id").tolist()
    assert sorted(p for p in private_home.rglob("*")) == before
    assert rel.generator_file is not None and rel.generator_file.is_relative_to(rel.run_dir)
