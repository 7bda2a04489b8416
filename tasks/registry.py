"""The model registry: register a released generator (refusing one over budget) and sample from it.

The registry is an MLflow store of its own, apart from the internal store that tracks runs (real-data
metrics, the data's hash, the internal report): `DPSYNTH_REGISTRY_URI`, by default
`sqlite:///<home>/registry/registry.db` with its artifacts beside it. It holds nothing but published
facts: each version's logged model is created there with no source run, its tags name no internal run,
and no run is ever logged to it. Whoever may browse the registry can follow no link into the internals.

A registered version holds only public things: the released generator (spec and weights, no critic),
the dataset schema (public bounds and levels) and the code that samples it (`dpsynth.models`, through
`code_paths`). It is an MLflow pyfunc model (`dpsynth.models.pyfunc.SyntheticTableModel`), so anyone with the
registry samples it with `mlflow.pyfunc.load_model("models:/NAME@champion")`, without dpsynth.

Budget rule (models/privacy/budget.py `check_registration`, the last guard): a release whose epsilon exceeds the
budget is refused before anything is
written, so the previous `champion` stays. Infinity (a non-private generator) exceeds every finite
budget; with `epsilon_budget=None`, which the caller must pass explicitly, there is no budget and any
epsilon, including infinity, is registered (its tags then say `private=false`, `epsilon=inf`). An
epsilon that is not a number is always refused.

Registration is idempotent on the tag `release_id`: a second call with the same release id reuses the
version registered first (nothing new is logged) and points `champion` at it again.

The internal run that published the release shows the same model as its own logged model
(`log_run_model`): a second copy in the internal store, linked to the run (its source run and model
output), so MLflow's run page lists it. The registered version points at the registry's copy, never at
that one: the link goes from the internal run to the published version only.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import mlflow
import mlflow.pyfunc
import pandas as pd
import torch
import yaml
from mlflow.entities import LoggedModel, LoggedModelStatus
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.models import Model
from mlflow.pyfunc import PyFuncModel
from mlflow.tracking import MlflowClient

import dpsynth
from dpsynth import models
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import ConfigError, MissingInputError
from dpsynth.models.privacy.budget import check_registration
from dpsynth.models.pyfunc import (
    GENERATOR_ARTIFACT,
    SCHEMA_ARTIFACT,
    SyntheticTableModel,
    load_generator_file,
    model_signature,
    sample_table,
)
from dpsynth.tasks.home import home
from dpsynth.tasks.private_files import restrict, restrict_tree
from dpsynth.tasks.public_release import PublicRelease, code_version
from dpsynth.tasks.table_io import PARQUET_SUFFIXES, write_table
from dpsynth.tasks.tracking import (
    local_artifacts,
    local_store_lock,
    mlflow_process_uris_kept,
    rounded_epsilon,
    tracking_uri,
)

CHAMPION = "champion"
MODEL_ARTIFACT = "synthetic-table-model"
RUN_MODEL = "released-generator"  # the internal run's logged model
MODEL_TYPE = "dpsynth-generator"
REGISTRY_VARIABLE = "DPSYNTH_REGISTRY_URI"
# The registry store's one experiment: MLflow files logged models under an experiment; no run goes there.
PUBLISHED_EXPERIMENT = "dpsynth-published-generators"
_OPENED_STORES: set[str] = set()  # registry stores this process has opened (created, migrated) under the lock
# Version tags a release carries (`release_tags` renders them from the release's public record;
# `register_release` checks the epsilon against the generator file's and adds what a caller left out).
# Published: each is public (the profile, the code) or covered by epsilon; never a hash of the private
# file, a real-data metric, a row count or an internal path (those stay in the internal MLflow run).
# Every release's version carries these; each generator adds its own public accountant inputs
# (GS-WGAN: K, sigma, C, batch_size, discriminator_draw; DP-CGAN: q, sigma, C; DP-auto-GAN: q1, ...).
RELEASE_TAG_KEYS = ("release_id", "generator", "epsilon", "delta", "accountant", "T", "schema_version", "code_version")
SAMPLE_SUFFIXES = PARQUET_SUFFIXES + (".csv",)


# ---------------------------------------------------------------------------------------------- tags


def release_tags(release: PublicRelease) -> dict[str, str]:
    """The version tags of a release, rendered from its public record: the accountant's public inputs
    and the measured marginals' numbers as text, never a fact about the rows. A non-private setting's
    noise and clipping read "none"."""
    parameters = {k: (repr(v) if isinstance(v, float) else str(v)) for k, v in release.parameters.items()}
    if not release.private:
        parameters.update({k: "none" for k in ("sigma", "C") if k in parameters})
    return {
        "release_id": release.release_id,
        "generator": release.generator,
        "delta": repr(release.delta),
        "accountant": release.mechanism if release.private else "none (non-private training)",
        **parameters,
        "T": str(int(release.trained_iterations)),  # what the accountant composed, not the chosen iteration
        "schema_version": str(release.schema_version),
        "setting": release.setting,
        "profile": release.profile,
        **{k: (repr(v) if isinstance(v, float) else str(v)) for k, v in release.measured.items()},
        "epsilon": _epsilon_text(release.epsilon),
        "private": str(not math.isinf(release.epsilon)).lower(),
        "epsilon_budget": "none" if release.epsilon_budget is None else repr(float(release.epsilon_budget)),
        "iteration": str(release.iteration),
        "code_version": release.code_version,
    }


def release_description(release: PublicRelease) -> str:
    """The registered version's description: what was released, at what epsilon, and the statement."""
    return (
        f"{release.release_id}: {release.generator_name}, setting {release.setting}, iteration "
        f"{release.iteration} of {release.trained_iterations}, epsilon {rounded_epsilon(release.epsilon)} at delta "
        f"{release.delta:g} for the whole release.\n\n{release.statement.markdown()}"
    )


def _epsilon_text(epsilon: float) -> str:
    return "inf" if math.isinf(epsilon) else repr(float(epsilon))


# ------------------------------------------------------------------------------------------ register


def registry_uri() -> str:
    """The registry store: `DPSYNTH_REGISTRY_URI`, else `<home>/registry/registry.db`."""
    return os.environ.get(REGISTRY_VARIABLE) or f"sqlite:///{home() / 'registry' / 'registry.db'}"


def registry_client() -> MlflowClient:
    """A client whose tracking and registry are both the registry store (never the internal one). The
    first one in a process opens the store under its lock: MLflow creates and migrates a new store's
    tables on first use, and two releases doing that at once fail (see `local_store_lock`)."""
    uri = registry_uri()
    if uri in _OPENED_STORES:
        return MlflowClient(tracking_uri=uri, registry_uri=uri)
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    with local_store_lock(uri):  # making the client already opens (creates, migrates) the tracking store
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        client.search_experiments(max_results=1)
        client.search_registered_models(max_results=1)
    _OPENED_STORES.add(uri)
    return client


def _published_experiment(client: MlflowClient) -> str:
    """The registry store's experiment for logged models (created on first use, under the store's lock)."""
    with local_store_lock(registry_uri()):
        existing = client.get_experiment_by_name(PUBLISHED_EXPERIMENT)
        if existing is not None:
            return existing.experiment_id
        artifacts = local_artifacts(registry_uri())
        return client.create_experiment(
            PUBLISHED_EXPERIMENT, artifact_location=artifacts.as_uri() if artifacts is not None else None
        )


@contextlib.contextmanager
def registry_as_default() -> Iterator[None]:
    """MLflow's process-wide URIs on the registry store for the block (so `models:/NAME@champion` loads
    from it), then back as they were. MLflow writes them into os.environ too, where the internal store's
    URI is read: leaving them would send internal runs to the registry."""
    with mlflow_process_uris_kept():
        registry_client()  # creates the store's folder
        mlflow.set_tracking_uri(registry_uri())
        mlflow.set_registry_uri(registry_uri())
        yield


def load_released_model(model_uri: str) -> PyFuncModel:
    """The registered pyfunc model at `model_uri` (e.g. models:/cardio-gswgan@champion), from the registry."""
    with registry_as_default():
        return mlflow.pyfunc.load_model(model_uri)


def find_release_version(client: MlflowClient, model_name: str, release_id: str) -> ModelVersion | None:
    """The registered version of `model_name` tagged with `release_id`, or None."""
    quoted = model_name.replace("'", "\\'")
    versions = client.search_model_versions(f"name = '{quoted}'")
    matches = [v for v in versions if v.tags.get("release_id") == release_id]
    return min(matches, key=lambda v: int(v.version)) if matches else None


def release_registered(model_name: str, release_id: str) -> bool:
    """Whether a version of `model_name` carries `release_id`; True when the registry cannot be asked (a
    caller deciding whether anything was published must then assume it was)."""
    try:
        return find_release_version(registry_client(), model_name, release_id) is not None
    except Exception:  # noqa: BLE001 - any failure to ask is "perhaps", never "no"
        return True


def _staged_code(directory: Path) -> Path:
    """`dpsynth/` with `dpsynth/models/` only, without caches: what `code_paths` ships with the model
    (`dpsynth/__init__.py` imports nothing of the pipeline, so the sampler needs no Prefect or flows)."""
    target = directory / "dpsynth"
    target.mkdir()
    shutil.copy2(Path(dpsynth.__file__).resolve(), target / "__init__.py")
    shutil.copytree(
        Path(models.__file__).resolve().parent,
        target / "models",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.tmp"),
    )
    return target


def _pip_requirements() -> list[str]:
    def pin(dist: str) -> str:
        try:
            return f"{dist}=={importlib.metadata.version(dist).split('+')[0]}"
        except importlib.metadata.PackageNotFoundError:
            return dist

    return [f"torch=={torch.__version__.split('+')[0]}", pin("mlflow"), pin("pandas"), pin("numpy"), pin("pyyaml")]


def _scrub_artifact_uris(model_dir: Path) -> None:
    """MLflow records where each artifact was copied from (its absolute path in the run folder) beside
    the copy it loads; the copy is all a loader needs, and that path is internal: drop it."""
    mlmodel = model_dir / "MLmodel"
    spec = yaml.safe_load(mlmodel.read_text())
    for artifact in spec.get("flavors", {}).get("python_function", {}).get("artifacts", {}).values():
        artifact.pop("uri", None)
    mlmodel.write_text(yaml.safe_dump(spec, default_flow_style=False, sort_keys=False))


def _save_model(model_dir: Path, generator_file: Path, schema_path: Path, model: Model) -> None:
    """Write the pyfunc model (generator + schema + `dpsynth.models` code, nothing else) to `model_dir`,
    without caches or the artifacts' source paths, owner-only. `model`: its MLmodel's identity."""
    gen, _ = load_generator_file(generator_file)
    encoder = TableEncoder(DatasetSchema.from_yaml(schema_path))
    example = pd.DataFrame({"n_rows": [5], "seed": [0]})
    with tempfile.TemporaryDirectory(prefix="dpsynth-model-") as tmp, warnings.catch_warnings():
        # MLflow's hints about type hints and integer columns do not apply: the input is (n_rows, seed).
        warnings.simplefilter("ignore", UserWarning)
        signature = model_signature(sample_table(gen, encoder, 5, 0))
        code = _staged_code(Path(tmp))
        mlflow.pyfunc.save_model(
            path=str(model_dir),
            mlflow_model=model,
            python_model=SyntheticTableModel(),
            artifacts={GENERATOR_ARTIFACT: str(generator_file), SCHEMA_ARTIFACT: str(schema_path)},
            code_paths=[str(code)],
            signature=signature,
            input_example=example,
            pip_requirements=_pip_requirements(),
        )
    for pycache in model_dir.rglob("__pycache__"):
        shutil.rmtree(pycache, ignore_errors=True)
    _scrub_artifact_uris(model_dir)
    restrict_tree(model_dir)  # copied into a local store with these modes


def log_release_model(
    client: MlflowClient, experiment_id: str, generator_file: Path, schema_path: Path, metadata: dict | None = None
) -> str:
    """Log the pyfunc model as a logged model in the registry store, with no source run, and return its
    `models:/<model id>` URI.

    Saved locally and uploaded by hand rather than through `Model.log(run_id=...)`, which would link the
    internal run, copy its metrics at step 0 (real-data AUCs) onto the published model and keep the
    artifacts' internal paths in its MLmodel file.
    """
    logged = client.create_logged_model(experiment_id=experiment_id, name=MODEL_ARTIFACT, model_type=MODEL_TYPE)
    with tempfile.TemporaryDirectory(prefix="dpsynth-model-") as tmp:
        model_dir = Path(tmp) / "model"
        # artifact_path is a name here: MLflow would write the store's internal location.
        identity = Model(
            artifact_path=MODEL_ARTIFACT, model_uuid=logged.model_id, model_id=logged.model_id, metadata=metadata or {}
        )
        _save_model(model_dir, generator_file, schema_path, identity)
        client.log_model_artifacts(logged.model_id, str(model_dir))
    client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
    return f"models:/{logged.model_id}"


def run_model(run_id: str) -> LoggedModel | None:
    """The internal run's logged model of the released generator, if it was logged."""
    client = MlflowClient(tracking_uri=tracking_uri())
    experiment_id = client.get_run(run_id).info.experiment_id
    found = client.search_logged_models(
        experiment_ids=[experiment_id], filter_string=f"source_run_id = '{run_id}' AND name = '{RUN_MODEL}'"
    )
    ready = [m for m in found if m.status == LoggedModelStatus.READY]
    return ready[0] if ready else None


def log_run_model(run_id: str, generator_file: Path, schema_path: Path, *, step: int, tags: dict[str, str]) -> str:
    """The released generator as the internal run's logged model (source run and model output `run_id`,
    at step `step`: the released iteration), so MLflow's run page shows it; returns its `models:/<id>`
    URI. Idempotent: a run that has one keeps it (a resumed release logs nothing twice)."""
    from mlflow.entities import LoggedModelOutput

    existing = run_model(run_id)
    if existing is not None:
        return f"models:/{existing.model_id}"
    client = MlflowClient(tracking_uri=tracking_uri())
    experiment_id = client.get_run(run_id).info.experiment_id
    logged = client.create_logged_model(
        experiment_id=experiment_id, name=RUN_MODEL, source_run_id=run_id, model_type=MODEL_TYPE, tags=tags
    )
    with tempfile.TemporaryDirectory(prefix="dpsynth-model-") as tmp:
        model_dir = Path(tmp) / "model"
        identity = Model(artifact_path=RUN_MODEL, model_uuid=logged.model_id, model_id=logged.model_id, run_id=run_id)
        _save_model(model_dir, generator_file, schema_path, identity)
        client.log_model_artifacts(logged.model_id, str(model_dir))
    client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
    client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=step)])
    location = client.get_logged_model(logged.model_id).artifact_location
    if location.startswith("file://"):  # the store made the model's folders with the process's umask
        folder = Path(location.removeprefix("file://")).parent
        restrict_tree(folder)
        restrict(folder.parent)
    return f"models:/{logged.model_id}"


def register_release(
    *,
    run_id: str,
    model_name: str,
    generator_file: Path,
    schema_path: Path,
    tags: dict,
    description: str,
    epsilon: float,
    epsilon_budget: float | None,
) -> dict:
    """Register the released generator as a new version of `model_name` and make it the champion.

    `tags` must hold `release_id` (see `release_tags`). Raises `BudgetExceededError` (registering
    nothing, champion untouched) when `epsilon`, or the epsilon recorded in the generator file if
    larger, exceeds `epsilon_budget`. Returns {"model_uri", "version", "model_name", "alias_uri",
    "reused"}.
    """
    generator_file, schema_path = Path(generator_file), Path(schema_path)
    release_id = str(tags.get("release_id") or "")
    if not release_id:
        raise ValueError("register_release needs tags['release_id'] (it makes registration idempotent).")
    for path, what in ((generator_file, "generator file"), (schema_path, "schema file")):
        if not path.is_file():
            raise MissingInputError(f"The {what} {str(path)!r} to register does not exist.")
    recorded = torch.load(generator_file, map_location="cpu", weights_only=True)
    recorded_eps = recorded.get("epsilon")
    if recorded_eps is not None and not math.isnan(float(recorded_eps)):
        epsilon = max(float(epsilon), float(recorded_eps))
    check_registration(float(epsilon), epsilon_budget)

    client = registry_client()
    experiment_id = _published_experiment(client)  # takes the store's lock itself: not under it below
    # MLflow resolves a logged model through its process-wide URIs when registering it: the registry's,
    # for this block only.
    with registry_as_default(), local_store_lock(registry_uri()):
        version = find_release_version(client, model_name, release_id)
        reused = version is not None
        if version is None:
            version_tags = {k: str(v) for k, v in tags.items() if v is not None}
            version_tags.update(
                {
                    "epsilon": _epsilon_text(epsilon),
                    "private": str(not math.isinf(epsilon)).lower(),
                    "epsilon_budget": "none" if epsilon_budget is None else repr(float(epsilon_budget)),
                    "iteration": str(recorded.get("iteration", "")),
                }
            )
            version_tags.setdefault("delta", repr(recorded.get("delta")))
            version_tags.setdefault("code_version", code_version())
            model_uri = log_release_model(
                client,
                experiment_id,
                generator_file,
                schema_path,
                metadata={"release_id": release_id, "epsilon": version_tags["epsilon"]},
            )
            try:
                client.get_registered_model(model_name)
            except MlflowException:
                client.create_registered_model(model_name)
            version = client.create_model_version(
                model_name, model_uri, tags=version_tags, model_id=model_uri.removeprefix("models:/")
            )
            if description:
                client.update_model_version(model_name, version.version, description=description)
            registered = client.get_registered_model(model_name)
            if not registered.description:
                client.update_registered_model(
                    model_name,
                    description="Differentially private synthetic-table generators. Sample "
                    "with mlflow.pyfunc.load_model(...).predict(pd.DataFrame({'n_rows': [N], 'seed': [S]})).",
                )
        client.set_registered_model_alias(model_name, CHAMPION, version.version)
    # The internal run may name the published version (the link goes one way only), and shows the
    # released generator as its logged model.
    MlflowClient(tracking_uri=tracking_uri()).set_tag(
        run_id, "dpsynth.model_version", f"{model_name}/{version.version}"
    )
    log_run_model(
        run_id,
        generator_file,
        schema_path,
        step=int(recorded.get("iteration") or 0),
        tags={
            "dpsynth.model_version": f"{model_name}/{version.version}",
            "release_id": release_id,
            "epsilon": _epsilon_text(epsilon),
        },
    )
    return {
        "model_uri": f"models:/{model_name}/{version.version}",
        "version": int(version.version),
        "model_name": model_name,
        "alias_uri": f"models:/{model_name}@{CHAMPION}",
        "reused": reused,
    }


# -------------------------------------------------------------------------------------------- sample


def _default_store_missing() -> str | None:
    uri = registry_uri()
    if os.environ.get(REGISTRY_VARIABLE) or not uri.startswith("sqlite:///"):
        return None
    path = Path(uri[len("sqlite:///") :])
    return None if path.exists() else str(path)


def sample_from_registry(model_uri: str, n_rows: int, out: Path, seed: int | None = None) -> Path:
    """Sample `n_rows` synthetic rows from a registered model and write them to `out` (.parquet/.pq or
    .csv, with the schema's separator): for a given `seed` the same rows every time; None (the default)
    draws a fresh seed, so each call gives new rows (as `Sampler.sample` does). Raises `ConfigError` for
    another extension or a bad row count and `MissingInputError` when the model, version or alias does not
    exist."""
    out = Path(out)
    if out.suffix.lower() not in SAMPLE_SUFFIXES:
        raise ConfigError(f"Cannot write {str(out)!r}: the output must end in .parquet, .pq or .csv.")
    if int(n_rows) < 1:
        raise ConfigError(f"The number of rows must be at least 1, not {n_rows}.")
    missing_store = _default_store_missing()
    if missing_store:
        raise MissingInputError(
            f"There is no model registry here: {missing_store!r} does not exist. Name the home that holds it "
            f"(--home or DPSYNTH_HOME), or set {REGISTRY_VARIABLE} to the registry's URI."
        )
    try:
        model = load_released_model(model_uri)
    except (MlflowException, OSError) as exc:
        reason = str(exc).strip().splitlines()[0].rstrip(".") if str(exc).strip() else type(exc).__name__
        raise MissingInputError(
            f"Cannot load the model {model_uri!r} from the registry at {registry_uri()}: {reason}. "
            "Check the model name and the alias or version (e.g. models:/cardio-gswgan@champion)."
        ) from None
    # Without a seed the model draws a fresh one itself (models/pyfunc.py).
    request = {"n_rows": [int(n_rows)]} if seed is None else {"n_rows": [int(n_rows)], "seed": [int(seed)]}
    frame = model.predict(pd.DataFrame(request))
    separator = ","
    try:
        separator = model.unwrap_python_model().schema.separator
    except (AttributeError, MlflowException):
        pass
    return write_table(frame, out, separator=separator)
