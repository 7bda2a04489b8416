"""The model registry: budget refusal, champion alias, tags, idempotency, and sampling a registered
generator, in this process and in a fresh one where dpsynth is not importable."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.tracking import MlflowClient

from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.errors import BudgetExceededError, ConfigError, MissingInputError
from dpsynth.models.generators.gswgan.generator_files import GeneratorSpec
from dpsynth.tasks.registry import registry_client
from tests.conftest import CARDIO_SCHEMA, ROOT

MODEL = "cardio-gswgan"


def make_generator_file(path: Path, schema, *, epsilon: float, seed: int, iteration: int = 20) -> Path:
    """A tiny untrained generator saved exactly as training checkpoints are."""
    encoder = TableEncoder(schema)
    spec = GeneratorSpec(4, (8,), encoder.width, "tanh", tuple((b.start, b.stop) for b in encoder.blocks))
    torch.manual_seed(seed)
    gen = spec.build()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "spec": spec.to_dict(),
            "state_dict": gen.state_dict(),
            "iteration": iteration,
            "epsilon": epsilon,
            "delta": 1e-5,
        },
        path,
    )
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One MLflow store (SQLite + local artifacts) for the module; each test uses its own model name."""
    work = tmp_path_factory.mktemp("registry")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
        mp.setenv("DPSYNTH_REGISTRY_URI", f"sqlite:///{work / 'registry' / 'registry.db'}")
        yield work
        mlflow.set_tracking_uri(None)  # MLflow keeps the URI globally (and in os.environ): forget this store


@pytest.fixture(scope="module")
def release_run(store):
    from dpsynth.tasks import tracking

    return tracking.start_run("cardio-release", "registry-test", {"dpsynth.kind": "release"})


def tags_for(release_id: str, cardio_schema, epsilon: float) -> dict:
    """The tags of a release of a K = 10 GS-WGAN trained to iteration 20, where it was released."""
    from dpsynth.models.config import Profile, Setting
    from dpsynth.tasks.registry import release_tags
    from tests.tasks.test_public_release import make_release

    profile = Profile(name="test", settings=(Setting("k10", 10),))
    return release_tags(
        make_release(
            cardio_schema,
            profile=profile,
            release_id=release_id,
            epsilon=epsilon,
            ledger=[{"iteration": 0, "epsilon": 0.0}, {"iteration": 20, "epsilon": epsilon}],
        )
    )


def register(
    release_run, cardio_schema, store, name, release_id, *, epsilon=3.5, budget=10.0, seed=0, file_epsilon=None
):
    from dpsynth.tasks.registry import register_release

    gen = make_generator_file(
        store / name / f"{release_id}.pt",
        cardio_schema,
        epsilon=epsilon if file_epsilon is None else file_epsilon,
        seed=seed,
    )
    return register_release(
        run_id=release_run,
        model_name=name,
        generator_file=gen,
        schema_path=CARDIO_SCHEMA,
        tags=tags_for(release_id, cardio_schema, epsilon),
        description=f"release {release_id}",
        epsilon=epsilon,
        epsilon_budget=budget,
    )


def champion(name):
    return registry_client().get_model_version_by_alias(name, "champion")


def test_register_sets_champion_tags_and_samples_valid_rows(release_run, cardio_schema, store):
    import mlflow.pyfunc

    from dpsynth.tasks.registry import RELEASE_TAG_KEYS, load_released_model, registry_as_default
    from dpsynth.tasks.training import sample_generator_file

    result = register(release_run, cardio_schema, store, MODEL, "rel-1")
    assert result["version"] == 1 and result["model_uri"] == f"models:/{MODEL}/1" and not result["reused"]
    mv = champion(MODEL)
    assert str(mv.version) == "1" and mv.description == "release rel-1"
    for key in RELEASE_TAG_KEYS:
        assert key in mv.tags, key
    assert mv.tags["epsilon"] == "3.5" and mv.tags["K"] == "10" and mv.tags["T"] == "20"
    assert mv.tags["private"] == "true" and mv.tags["code_version"] != "unknown"
    assert MlflowClient().get_run(release_run).info.status == "RUNNING"  # the flow ends its own run
    # The registry holds no link into the internal store: no source run, no run id among the tags, and no
    # run of its own; the internal store holds no registered model.
    assert not mv.run_id and "mlflow_run_id" not in mv.tags
    registry = registry_client()
    assert registry.get_logged_model(mv.model_id or mv.source.removeprefix("models:/")).source_run_id is None
    assert registry.search_runs([e.experiment_id for e in registry.search_experiments()]) == []
    assert MlflowClient().search_registered_models() == []
    assert MlflowClient().get_run(release_run).data.tags["dpsynth.model_version"] == f"{MODEL}/1"
    # The internal run shows the released generator as its logged model (source run and model output),
    # which loads from the internal store; the registry's copy above stays unlinked.
    from dpsynth.tasks.registry import RUN_MODEL, run_model

    logged = run_model(release_run)
    assert logged is not None and logged.name == RUN_MODEL and logged.source_run_id == release_run
    assert logged.tags["dpsynth.model_version"] == f"{MODEL}/1" and logged.model_id != mv.model_id
    outputs = MlflowClient().get_run(release_run).outputs.model_outputs
    assert [(o.model_id, o.step) for o in outputs] == [(logged.model_id, 20)]
    internal = mlflow.pyfunc.load_model(f"models:/{logged.model_id}")
    assert len(internal.predict(pd.DataFrame({"n_rows": [5], "seed": [0]}))) == 5

    # Only the generator, the schema and the code travel with the model: no critic, no data.
    with registry_as_default():
        local = Path(mlflow.artifacts.download_artifacts(f"models:/{MODEL}/1"))
    assert sorted(p.name for p in (local / "artifacts").iterdir()) == ["cardio.yaml", "rel-1.pt"]
    code = local / "code" / "dpsynth" / "models"
    assert (code / "pyfunc.py").is_file() and (code / "data" / "encoding.py").is_file()
    assert not list(local.rglob("__pycache__"))
    # No critic travels (the code's critic kernel source, under code/, is no trained part).
    assert not [p for p in local.rglob("*critic*") if p.relative_to(local).parts[0] != "code"]

    model = load_released_model(f"models:/{MODEL}@champion")
    rows = model.predict(pd.DataFrame({"n_rows": [300], "seed": [7]}))
    assert list(rows.columns) == cardio_schema.column_names and len(rows) == 300
    for col in cardio_schema.columns:
        if col.kind == "continuous":
            assert rows[col.name].between(*col.bounds).all(), col.name
        else:
            assert set(rows[col.name]) <= set(col.levels), col.name
    # The registered model samples exactly what the pipeline's own sampler gives for the same seed.
    pipeline = sample_generator_file(store / MODEL / "rel-1.pt", cardio_schema, 300, 7)
    pd.testing.assert_frame_equal(rows, pipeline)


def test_second_release_moves_champion_and_same_release_id_is_reused(release_run, cardio_schema, store):
    name = "moves-champion"
    first = register(release_run, cardio_schema, store, name, "rel-a")
    second = register(release_run, cardio_schema, store, name, "rel-b", epsilon=4.0, seed=1)
    assert (first["version"], second["version"]) == (1, 2)
    assert str(champion(name).version) == "2" and champion(name).tags["release_id"] == "rel-b"

    again = register(release_run, cardio_schema, store, name, "rel-b", epsilon=4.0, seed=1)
    assert again["version"] == 2 and again["reused"]
    assert len(registry_client().search_model_versions(f"name = '{name}'")) == 2


def test_over_budget_release_is_refused_and_champion_stays(release_run, cardio_schema, store):
    name = "over-budget"
    register(release_run, cardio_schema, store, name, "ok")
    with pytest.raises(BudgetExceededError, match="exceeds the privacy budget"):
        register(release_run, cardio_schema, store, name, "too-much", epsilon=12.0, budget=10.0)
    with pytest.raises(BudgetExceededError, match="non-private"):
        register(release_run, cardio_schema, store, name, "non-private", epsilon=math.inf, budget=10.0)
    # The generator file's own ledger counts: a smaller declared epsilon does not get it through.
    with pytest.raises(BudgetExceededError):
        register(release_run, cardio_schema, store, name, "understated", epsilon=2.0, file_epsilon=50.0)
    assert champion(name).tags["release_id"] == "ok"
    assert len(registry_client().search_model_versions(f"name = '{name}'")) == 1


def test_budget_rule():
    from dpsynth.models.privacy.budget import check_registration

    check_registration(10.0, 10.0)
    check_registration(math.inf, None)  # no budget, passed explicitly: a non-private release is allowed
    for eps, budget in ((10.01, 10.0), (math.inf, 1e9), (math.nan, None)):
        with pytest.raises(BudgetExceededError):
            check_registration(eps, budget)


def test_sample_from_registry_writes_parquet_and_csv(release_run, cardio_schema, store):
    from dpsynth.tasks.registry import sample_from_registry
    from dpsynth.tasks.table_io import read_table
    from dpsynth.tasks.validate import check_table

    name = "sampling"
    register(release_run, cardio_schema, store, name, "s-1")
    parquet = sample_from_registry(f"models:/{name}@champion", 120, store / "out" / "s.parquet", seed=3)
    csv = sample_from_registry(f"models:/{name}/1", 120, store / "out" / "s.csv", seed=3)
    a, b = pd.read_parquet(parquet), read_table(csv, cardio_schema)
    assert len(a) == len(b) == 120 and list(a.columns) == cardio_schema.column_names
    assert np.allclose(a.to_numpy(dtype=float), b.to_numpy(dtype=float))
    check_table(cardio_schema, b)  # what the registry samples passes the input's own suite

    with pytest.raises(ConfigError, match=r"\.parquet"):
        sample_from_registry(f"models:/{name}@champion", 10, store / "out" / "s.xlsx", seed=0)
    with pytest.raises(MissingInputError, match="no-such-model"):
        sample_from_registry("models:/no-such-model@champion", 10, store / "out" / "x.csv", seed=0)
    with pytest.raises(MissingInputError):
        sample_from_registry(f"models:/{name}@no-such-alias", 10, store / "out" / "x.csv", seed=0)
    assert not (store / "out" / "x.csv").exists()


def test_dpsynth_sample_draws_fresh_rows_unless_a_seed_is_given(release_run, cardio_schema, store, capsys):
    """As the API's `Sampler.sample`: without --seed each call gives new rows (seed 0 gave the same rows
    every time before); a given seed gives the same rows every time."""
    from dpsynth.flows.cli import main

    name = "fresh-sampling"
    register(release_run, cardio_schema, store, name, "fs-1")

    def sample(path, *seed):
        argv = ["sample", "--model-uri", f"models:/{name}@champion", "--rows", "50", "--out", str(path), *seed]
        assert main(argv) == 0
        return pd.read_csv(path, sep=cardio_schema.separator)

    out = store / "out"
    first, second = sample(out / "a.csv"), sample(out / "b.csv")
    assert not first.equals(second)
    pd.testing.assert_frame_equal(sample(out / "c.csv", "--seed", "3"), sample(out / "d.csv", "--seed", "3"))


def test_sample_without_a_registry_here_is_a_readable_error(tmp_path, monkeypatch):
    from dpsynth.tasks.registry import sample_from_registry

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DPSYNTH_REGISTRY_URI", raising=False)
    with pytest.raises(MissingInputError, match="registry.db"):
        sample_from_registry("models:/cardio-gswgan@champion", 10, tmp_path / "x.csv", seed=0)
    assert not list(tmp_path.rglob("*.db"))


def test_registered_model_loads_in_a_fresh_process_without_dpsynth(release_run, cardio_schema, store, tmp_path):
    name = "fresh-process"
    register(release_run, cardio_schema, store, name, "f-1")
    script = textwrap.dedent(f"""
        import importlib.util, json, sys
        # dpsynth is installed in editable mode in this environment: take its import hooks away so that
        # `models` can only come from the registered model's own code.
        sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in repr(f)
                            and "__editable__" not in (getattr(f, "__module__", "") or "")]
        sys.path_hooks[:] = [h for h in sys.path_hooks if "__editable__" not in (getattr(h, "__module__", "") or "")]
        sys.path[:] = [p for p in sys.path if p not in ("", {str(ROOT)!r})]
        sys.path_importer_cache.clear()
        assert importlib.util.find_spec("dpsynth") is None, "dpsynth is still importable"
        assert importlib.util.find_spec("models") is None and importlib.util.find_spec("flows") is None
        import mlflow.pyfunc, pandas as pd
        model = mlflow.pyfunc.load_model("models:/{name}@champion")
        rows = model.predict(pd.DataFrame({{"n_rows": [25], "seed": [1]}}))
        import dpsynth.models as models
        print(json.dumps({{"columns": list(rows.columns), "n": len(rows), "models": models.__file__,
                          "prefect": "prefect" in sys.modules, "flows": "flows" in sys.modules}}))
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{store / 'registry' / 'registry.db'}"  # the registry, plain MLflow
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["columns"] == cardio_schema.column_names and out["n"] == 25
    assert not out["models"].startswith(str(ROOT / "models")) and "/code/dpsynth/models/" in out["models"]
    assert not out["prefect"] and not out["flows"]


def test_models_package_imports_mlflow_only_in_pyfunc():
    modules = sorted(
        ".".join(p.relative_to(ROOT / "models").with_suffix("").parts)
        for p in (ROOT / "models").rglob("*.py")
        if p.stem not in ("__init__", "pyfunc")
    )
    assert "privacy.accountant" in modules and "generators.gswgan.trainer" in modules
    script = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module('dpsynth.models.' + m)\n"
        "print(sorted(k for k in sys.modules if k.split('.')[0] in ('mlflow', 'prefect')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
