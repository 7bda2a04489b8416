"""MLflow: where runs are tracked (internal store: real-data metrics allowed) and small logging helpers.

Tracking defaults to `sqlite:///<home>/mlflow.db` (tasks/home.py) with artifacts beside it in
`mlartifacts/`; `MLFLOW_TRACKING_URI` overrides it (a store that is not a local file then needs an
explicit home). Published model versions live in a registry store of their own (tasks/registry.py).

What MLflow's UI shows: our experiments are tagged as classic ML ones (`mlflow.experimentKind`), each
release run carries a Markdown description (`mlflow.note.content`, `describe_run`) and a name with its
epsilon to 2 decimals (tags and metrics keep the exact figure), and a published release's run has the
released generator as its logged model (tasks/registry.py `log_run_model`).
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from dpsynth.tasks.environment import environment
from dpsynth.tasks.home import home, require_explicit_home_for

if TYPE_CHECKING:
    import pandas as pd
    from mlflow.tracking import MlflowClient

    from dpsynth.tasks.public_release import PublicRelease

DEFAULT_ARTIFACTS = "mlartifacts"
# The experiment type MLflow 3's UI reads from an experiment's tags: a classic ML experiment (training
# runs, logged models), not a GenAI one (traces, evaluation runs).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
CLASSIC_ML = "custom_model_development"
RUN_NOTE_TAG = "mlflow.note.content"  # the run page's description (Markdown)


def tracking_uri() -> str:
    explicit = os.environ.get("MLFLOW_TRACKING_URI")
    if explicit:
        require_explicit_home_for(explicit)
        return explicit
    return f"sqlite:///{home() / 'mlflow.db'}"


def named_store() -> bool:
    """Whether the store is one the user named (MLFLOW_TRACKING_URI), not the home's own SQLite file."""
    return bool(os.environ.get("MLFLOW_TRACKING_URI"))


def local_artifacts(uri: str) -> Path | None:
    """Where a local (SQLite) store keeps its artifacts: `mlartifacts/` beside its database."""
    return Path(uri[len("sqlite:///") :]).parent / DEFAULT_ARTIFACTS if uri.startswith("sqlite:///") else None


def _client() -> MlflowClient:
    # MLflow is imported on first use, not with this module: a release's flow loads it in the background,
    # alongside its first stages (flows/release.py), not before them.
    from mlflow.tracking import MlflowClient

    # Always the store named now: the environment may point elsewhere than at import time.
    return MlflowClient(tracking_uri=tracking_uri())


def local_store_paths() -> list[Path]:
    """The files and folders of a local (SQLite) store: the database, its journals, the artifacts."""
    uri = tracking_uri()
    if not uri.startswith("sqlite:///"):
        return []
    db = Path(uri[len("sqlite:///") :])
    artifacts = local_artifacts(uri)
    assert artifacts is not None  # a SQLite store has them beside its database
    return [db, *(db.with_name(db.name + suffix) for suffix in ("-journal", "-wal", "-shm")), artifacts]


@contextlib.contextmanager
def local_store_lock(uri: str | None = None) -> Iterator[None]:
    """Hold an exclusive lock beside a local SQLite store while a client first opens it, creates an
    experiment or registers a release: MLflow creates and migrates the schema on first use, and two
    releases at once on one store would otherwise both migrate it (one fails: "Online migration expected
    to match one row"), both create the experiment, or both create the registered model or move its
    alias (one fails: "UNIQUE constraint failed: registered_model_aliases"). A server store serialises
    these itself. `uri`: the store (default: the internal one)."""
    uri = uri or tracking_uri()
    if not uri.startswith("sqlite:///"):
        yield
        return
    db = Path(uri[len("sqlite:///") :])
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def check_store(timeout_seconds: int = 10) -> None:
    """Raise StorageError unless the tracking store answers now: asked before any work, so that a release
    never trains for an hour and then cannot register. One quick try (MLflow would otherwise retry an
    HTTP store for minutes)."""
    from mlflow.tracking import MlflowClient

    from dpsynth.models.errors import StorageError

    uri = tracking_uri()
    quick: dict[str, str | None] = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout_seconds),
    }
    try:
        with environment(quick), local_store_lock():
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - any failure means the store cannot be used
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise StorageError(
            f"The MLflow tracking store at {uri} cannot be used ({reason}). Nothing was started. Start the "
            "tracking server or fix MLFLOW_TRACKING_URI, then rerun."
        ) from None


@contextlib.contextmanager
def mlflow_process_uris_kept() -> Iterator[None]:
    """MLflow's process-wide tracking and registry URIs, and the environment variables it writes them
    into, as they were before the block. `use_experiment` points MLflow at the home's store, and MLflow
    copies that into os.environ, where `tracking_uri` reads an explicit store first: a Python caller's
    next release from another home would log its internal runs to this one's store."""
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    saved_env = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    saved = (tracking_utils._tracking_uri, registry_utils._registry_uri)
    try:
        yield
    finally:
        tracking_utils._tracking_uri, registry_utils._registry_uri = saved
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def use_experiment(name: str) -> str:
    """Point MLflow at the store and return the id of experiment `name` (created if needed). A local
    store holds real-data metrics and internal artifacts: it is made owner-only."""
    import mlflow

    from dpsynth.tasks.private_files import owner_only, restrict

    owner_only()
    mlflow.set_tracking_uri(tracking_uri())
    client = _client()
    for path in local_store_paths():
        restrict(path)
    artifacts = local_artifacts(tracking_uri())
    location = artifacts.as_uri() if artifacts is not None else None
    # Under the lock: two releases starting at once must not both create the experiment.
    with local_store_lock():
        existing = client.get_experiment_by_name(name)
        if existing is None:
            return client.create_experiment(name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: CLASSIC_ML})
        if EXPERIMENT_KIND_TAG not in existing.tags:  # made by an older dpsynth
            client.set_experiment_tag(existing.experiment_id, EXPERIMENT_KIND_TAG, CLASSIC_ML)
        return existing.experiment_id


def flat_params(prefix: str, obj: object) -> dict[str, str]:
    """Nested dicts/lists to MLflow's flat string parameters."""
    out: dict[str, str] = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            out.update(flat_params(f"{prefix}.{key}" if prefix else str(key), value))
    elif isinstance(obj, (list, tuple)) and obj and isinstance(obj[0], dict):
        for i, value in enumerate(obj):
            out.update(flat_params(f"{prefix}.{i}", value))
    else:
        out[prefix] = str(obj)[:500]
    return out


def finite(value: float) -> float | None:
    """MLflow cannot store inf/nan metrics; callers skip those."""
    return value if value is not None and math.isfinite(value) else None


def start_run(experiment: str, run_name: str, tags: dict[str, str], resume: str | None = None) -> str:
    """A new MLflow run, or the run `resume` (an interrupted attempt's) marked running again, so that
    a resumed dpsynth run stays one MLflow run with one copy of its artifacts."""
    from mlflow.exceptions import MlflowException

    client = _client()
    experiment_id = use_experiment(experiment)
    if resume:
        try:
            client.update_run(resume, status="RUNNING")
            return resume
        except MlflowException:
            pass  # gone from the store (or another store): start a new one
    run = client.create_run(experiment_id, run_name=run_name, tags=tags)
    return run.info.run_id


def end_run(run_id: str, status: str = "FINISHED") -> None:
    _client().set_terminated(run_id, status=status)


def log_params(run_id: str, params: dict) -> None:
    from mlflow.entities import Param

    client = _client()
    items = list(flat_params("", params).items())
    for start in range(0, len(items), 100):
        batch = [Param(k, v) for k, v in items[start : start + 100]]
        client.log_batch(run_id, params=batch)


def log_metrics(run_id: str, metrics: dict[str, float], step: int = 0) -> None:
    from mlflow.entities import Metric

    client = _client()
    batch = [Metric(k, float(v), 0, step) for k, v in metrics.items() if finite(v) is not None]
    if batch:
        client.log_batch(run_id, metrics=batch)


def log_metric_series(run_id: str, name: str, points: list[tuple[int, float]]) -> None:
    from mlflow.entities import Metric

    client = _client()
    batch = [Metric(name, float(v), 0, int(s)) for s, v in points if finite(v) is not None]
    for start in range(0, len(batch), 1000):
        client.log_batch(run_id, metrics=batch[start : start + 1000])


def log_artifact(run_id: str, path: Path, artifact_path: str | None = None) -> None:
    from dpsynth.tasks.private_files import restrict_tree

    path = Path(path)
    client = _client()
    if path.is_dir():
        client.log_artifacts(run_id, str(path), artifact_path)
    else:
        client.log_artifact(run_id, str(path), artifact_path)
    # A local store copies files with their modes (a public schema or the bundle is 0644): keep the
    # internal store owner-only throughout.
    uri = client.get_run(run_id).info.artifact_uri
    if uri.startswith("file://"):
        restrict_tree(Path(uri.removeprefix("file://")))


def describe_run(run_id: str, name: str, description: str) -> None:
    """The run's name and its description (Markdown), as MLflow's run page shows them."""
    client = _client()
    client.update_run(run_id, name=name)
    client.set_tag(run_id, RUN_NOTE_TAG, description)


def rounded_epsilon(epsilon: float) -> str:
    """Epsilon as names and descriptions show it: 2 decimals ("inf" for a non-private generator)."""
    return "inf" if math.isinf(epsilon) else f"{epsilon:.2f}"


def release_run_name(record: PublicRelease, trial: bool) -> str:
    """A release run's name: its id, generator, setting and epsilon (2 decimals)."""
    kind = "trial" if trial else "release"
    return f"{record.release_id} {record.generator} {record.setting} epsilon {rounded_epsilon(record.epsilon)} ({kind})"


def release_run_description(
    record: PublicRelease, trial: bool, outcome: str, bundle_dir: str | None = None, report: str | None = None
) -> str:
    """A release run's description (Markdown): what was released, at what epsilon, and where it went.
    `outcome`: one line on what became of it (published, refused, a trial)."""
    lines = [
        f"**{'Trial of a release' if trial else 'Release'}** `{record.release_id}` of table `{record.dataset}` "
        f"(schema version {record.schema_version}): {record.generator_name}, setting `{record.setting}`, "
        f"profile `{record.profile}`.",
        "",
        f"- epsilon **{rounded_epsilon(record.epsilon)}** at delta {record.delta:g} for the whole release "
        f"(training {rounded_epsilon(record.epsilon_training)}, choice of the checkpoint "
        f"{rounded_epsilon(record.epsilon_choice)}); the exact figures are the metrics `release.epsilon*`",
        f"- released checkpoint: iteration {record.iteration} of {record.trained_iterations}",
        f"- {outcome}",
    ]
    if bundle_dir:
        lines.append(f"- bundle: `{bundle_dir}`")
    if report:
        lines.append(f"- internal report: `{report}`")
    return "\n".join(lines)


def set_tags(run_id: str, tags: dict[str, str]) -> None:
    client = _client()
    for key, value in tags.items():
        client.set_tag(run_id, key, str(value))


def log_table(run_id: str, frame: pd.DataFrame, artifact_file: str) -> None:
    """A table MLflow's UI can browse and compare (inf and NaN become empty cells)."""
    import numpy as np

    clean = frame.replace([np.inf, -np.inf], np.nan).astype(object).where(frame.notna(), None)
    _client().log_table(run_id, data=clean, artifact_file=artifact_file)
