"""`dpsynth.release`: one release (or trial) of a table from Python, governed as `dpsynth release` is.

It runs the command line's own preflight (flows/cli.py: the lifetime budget a publishing profile must
set, the planned cost against the budget and the table's ledger, the release window, the same input
refused again unless `allow_same_input`, the table against its schema, the tracking store) and then the
release flow (flows/release.py) with the same console handling. Where the command line would exit
non-zero, this raises the project's error (dpsynth.models.errors: ConfigError, BudgetExceededError,
ReleaseNotApprovedError, ...); a failing file or tracking store is a StorageError. A publishing release
enters its cost in the table's privacy ledger; a trial (`publish=False`, or a profile with `trial: true`)
spends nothing and publishes nothing.

A DataFrame is written, as CSV, into the home's internal store (`<home>/inputs/`, owner-only) under a
name that is its content's hash, so the same rows make the same file (and the ledger's same-input check
sees them); a schema that is not a file yet is written there too. A path is used as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from dpsynth.api.schema import Schema
from dpsynth.models.defaults import DEFAULT_RELEASE_PROFILE
from dpsynth.models.errors import ConfigError, DpsynthError, StorageError

if TYPE_CHECKING:
    import pandas as pd

    from dpsynth.api.load import Sampler
    from dpsynth.models.privacy.secret import PrivacySecret
    from dpsynth.tasks.context import RunContext

INPUTS_FOLDER = "inputs"
QUALITY_NOTE = (
    "internal: computed on real rows (AUC of a classifier trained on synthetic rows and tested on real "
    "ones, fidelity against the real table); for the data owner, not for publication"
)


@dataclass(frozen=True)
class Quality:
    """The release's quality figures from the run's summary. Internal: they read real rows, so the
    privacy guarantee does not cover them; the bundle and the registry never hold them."""

    auc: float | None
    real_auc: float | None
    fidelity: dict[str, Any] = field(default_factory=dict)
    internal: bool = True
    note: str = QUALITY_NOTE


# What `Release.sampler()` on a trial warns: its generator was never published.
TRIAL_ROWS_WARNING = (
    "{release_id} is a trial: its generator was never published and its rows are for the data steward's eyes "
    "only (they are not covered by a published release and must not leave the internal store). Release with "
    "publish=True to publish a generator."
)


@dataclass(frozen=True)
class Release:
    """A finished release or trial. `epsilon` is the whole release's (inf: not private) at `delta`;
    `statement` says what it covers; `bundle` and `model_uri` are None for a trial, which published
    nothing. `run_dir` is the internal run folder (owner-only: real rows and the run's secret);
    `generator_file` the chosen generator in it, with `schema_path` the schema its rows decode through."""

    release_id: str
    published: bool
    epsilon: float
    delta: float
    statement: str
    bundle: Path | None
    model_uri: str | None
    run_dir: Path
    quality: Quality
    table: str = ""
    generator_file: Path | None = None
    schema_path: Path | None = None

    @property
    def fidelity(self) -> dict[str, Any]:
        """The internal report's fidelity figures for the released setting (`quality.fidelity`): 1-way and
        2-way TVD, point masses, lost levels, Spearman, and SDMetrics' scores under "sdmetrics". Internal."""
        return self.quality.fidelity

    def sampler(self) -> Sampler:
        """The released generator (`dpsynth.load(bundle)`). A trial's generator, from its run folder, with a
        warning: its rows are for the steward's eyes only; sampling writes nothing anywhere."""
        from dpsynth.api.load import load

        if self.bundle is not None:
            return load(self.bundle)
        if self.generator_file is None or not self.generator_file.is_file():
            raise ConfigError(
                f"{self.release_id} was a trial that kept no generator in its run folder (it ran before trials "
                "kept theirs): run the trial again to sample it, or release with publish=True."
            )
        warnings.warn(TRIAL_ROWS_WARNING.format(release_id=self.release_id), UserWarning, stacklevel=2)
        return load(self.generator_file, schema=self.schema_path)

    def __repr__(self) -> str:
        what = f"published, bundle {self.bundle}" if self.published else "trial, nothing published"
        epsilon = "inf" if math.isinf(self.epsilon) else f"{self.epsilon:.4g}"
        return f"Release({self.table or self.release_id}: epsilon {epsilon}, delta {self.delta:g}, {what})"


def release(
    data: pd.DataFrame | str | Path,
    schema: Schema | str | Path,
    profile: str = DEFAULT_RELEASE_PROFILE,
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    home: str | Path | None = None,
    publish: bool = True,
    generator: str | None = None,
    out: str | Path | None = None,
    allow_same_input: bool = False,
    cluster: str | None = None,
    secret: PrivacySecret | None = None,
    progress: bool = True,
    verbose: bool = False,
) -> Release:
    """Train, evaluate and release one setting of `profile` on `data`, as `dpsynth release` does.

    `profile`: a name (beside a schema file, as on the command line; else among the shipped profiles)
    or a YAML path. `epsilon`, `delta`: the whole release's epsilon budget and delta in place of the
    profile's (its `privacy.epsilon_budget` and `privacy.delta`): the accountant plans the release to them,
    and refuses before any work a budget the generator cannot keep. `home`: the installation's home
    (ledger, stores, run folders) for this process and the ones it starts (default $DPSYNTH_HOME, else
    ~/.dpsynth). `publish=False`: a trial. `out`: the run folder (default `<home>/runs/release/<run id>`;
    an interrupted run of the same inputs resumes). `cluster`: a Dask scheduler's address, as
    `dpsynth release --cluster` (the marginal generators' counting, or GS-WGAN's pretraining, on its
    workers, to the same counts and critics).
    `secret`: a fixed privacy secret, for tests of trials only (a publishing release always draws its
    own: ConfigError otherwise). `progress`: the progress display on standard error; `verbose`: the
    libraries' logs too."""
    from dpsynth.tasks.private_files import owner_only

    owner_only()
    if home is not None:
        from dpsynth.tasks.home import set_home

        set_home(home)
    with _as_project_errors():
        schema_path, beside_schema = _schema_file(schema)
        data_path = _private_table(data, schema_path) if not isinstance(data, str | Path) else Path(data)
        profile_arg = _profile_argument(profile, schema_path, beside_schema)
        if epsilon is not None or delta is not None:
            profile_arg = _with_budget(profile_arg, schema_path, epsilon, delta)
        if secret is not None:
            _require_trial(profile_arg, schema_path, publish)
        args = SimpleNamespace(
            config=str(schema_path),
            data=str(data_path),
            profile=profile_arg,
            out=None if out is None else str(out),
            generator=generator,
            no_publish=not publish,
            allow_same_input=allow_same_input,
            cluster=cluster,
        )
        from dpsynth.flows import prefect_server
        from dpsynth.flows.cli import preflight
        from dpsynth.flows.console import flow_console
        from dpsynth.tasks.run_lock import unlock_run
        from dpsynth.tasks.tracking import mlflow_process_uris_kept

        with mlflow_process_uris_kept(), flow_console(json_output=not progress, verbose=verbose):
            # As the command line: Prefect's server (one per process) starts only once the preflight passed.
            ctx, server = preflight(args, "release")
            if secret is not None:
                _plant_secret(ctx, secret)
            _warn_real_table_trial(ctx)
            from dpsynth.flows.release import release as release_flow

            try:
                with prefect_server.use(server):
                    summary = release_flow(
                        config=args.config,
                        data=args.data,
                        profile=profile_arg,
                        out=str(ctx.run_dir),
                        generator=generator,
                        publish=publish,
                        allow_same_input=allow_same_input,
                        cluster=cluster,
                    )
            finally:
                unlock_run(ctx.run_dir)  # held since the preflight; this process may live on (a notebook)
        return _release_of(ctx, summary)


# The command line's words in the messages of the checks both share, and what a Python caller passes.
API_WORDS = (
    ("pass --allow-same-input", "pass allow_same_input=True"),
    ("`dpsynth release --no-publish`", "publish=False"),
    ("--no-publish", "publish=False"),
    ("--allow-same-input", "allow_same_input=True"),
    ("another --out", "another `out`"),
    ("an empty --out", "an empty `out`"),
    ("--home", "home="),
    ("--generator ", "generator="),
)


def in_api_words(message: str) -> str:
    """A message of the shared checks with the command line's flags named as this API's arguments."""
    for cli, api in API_WORDS:
        message = message.replace(cli, api)
    return message


@contextlib.contextmanager
def _as_project_errors() -> Iterator[None]:
    """The command line's exit paths as exceptions: a failing file or tracking store is a StorageError; a
    message names this API's arguments, not the command line's flags."""
    try:
        yield
    except DpsynthError as exc:
        exc.args = tuple(in_api_words(a) if isinstance(a, str) else a for a in exc.args)
        raise
    except OSError as exc:
        where = f" {exc.filename!r}" if exc.filename else ""
        raise StorageError(
            f"dpsynth cannot use{where}: {exc.strerror or exc}. Completed stages are kept; fix the cause "
            "(permissions, free disk space) and call again to resume."
        ) from exc
    except Exception as exc:
        from mlflow.exceptions import MlflowException

        if not isinstance(exc, MlflowException):
            raise
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise StorageError(
            f"The MLflow tracking store failed ({reason}). Nothing was published from this attempt; "
            "completed stages are kept: once the store answers, call again to resume."
        ) from exc


def _inputs_folder() -> Path:
    from dpsynth.tasks.home import home
    from dpsynth.tasks.private_files import private_dir

    return private_dir(home() / INPUTS_FOLDER)


def _schema_file(schema: Schema | str | Path) -> tuple[Path, bool]:
    """The schema's YAML file (validated) and whether profile names resolve beside it: a file given or
    read stays as it is; a schema made in code is written into the internal store under its hash."""
    if not isinstance(schema, Schema):
        schema = Schema.from_yaml(schema)
    schema.validated()
    if schema.path is not None:
        return schema.path, True
    text = schema.yaml_text()
    path = _inputs_folder() / f"{schema.name}-schema-{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
    if not path.exists():
        path.write_text(text)
    return path, False


def _private_table(df: pd.DataFrame, schema_path: Path) -> Path:
    """`df` as a CSV file, owner-only, named by its content's hash (the same rows: the same file)."""
    from dpsynth.models.data.schema import DatasetSchema
    from dpsynth.tasks.stage import sha256_file
    from dpsynth.tasks.table_io import write_table

    schema = DatasetSchema.from_yaml(schema_path)
    folder = _inputs_folder()
    tmp = write_table(df, folder / f".{schema.name}-{os.getpid()}.tmp.csv", separator=schema.separator)
    target = folder / f"{schema.name}-{sha256_file(tmp)[:16]}.csv"
    if target.exists():
        tmp.unlink()
    else:
        os.replace(tmp, target)
    return target


def _profile_argument(profile: str, schema_path: Path, beside_schema: bool) -> str:
    """A path as it is; a name beside a schema file as the command line takes it; otherwise the shipped
    profile of that name, as a path (a schema written into the store has no profiles beside it)."""
    from dpsynth.models.config import profile_path

    if Path(profile).suffix in (".yaml", ".yml") or (beside_schema and profile_path(profile, schema_path).is_file()):
        return profile
    import dpsynth.configs

    shipped = Path(dpsynth.configs.__file__).resolve().parent / "profiles" / f"{profile}.yaml"
    return str(shipped) if shipped.is_file() else profile


def _with_budget(profile_arg: str, schema_path: Path, epsilon: float | None, delta: float | None) -> str:
    """The profile with the whole release's epsilon budget and delta given to `release`, written into the
    internal store under its content's hash (the same budget: the same file, so an interrupted run
    resumes), as a path. The profile keeps its name: its ledger entries and planned releases count as its own."""
    import dataclasses

    import yaml

    from dpsynth.models.profiles import load_named

    for name, value in (("epsilon", epsilon), ("delta", delta)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0
        ):
            raise ConfigError(f"{name}= must be a positive number, not {value!r}.")
    if delta is not None and delta >= 1:
        raise ConfigError(f"delta= must be below 1, not {delta!r}.")
    prof = load_named(profile_arg, schema_path)
    privacy = prof.privacy
    if epsilon is not None:
        privacy = dataclasses.replace(privacy, epsilon_budget=float(epsilon))
        # A release setting with a budget of its own would keep it: the given one replaces it too.
        target = prof.release_target()
        settings = tuple(
            dataclasses.replace(s, epsilon_budget=None) if s.name == target.name else s for s in prof.settings
        )
        prof = dataclasses.replace(prof, settings=settings)
    if delta is not None:
        privacy = dataclasses.replace(privacy, delta=float(delta))
    prof = dataclasses.replace(prof, privacy=privacy)
    text = yaml.safe_dump(json.loads(json.dumps(prof.to_dict())), sort_keys=True)
    path = _inputs_folder() / f"{prof.name}-budget-{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
    if not path.exists():
        path.write_text(text)
    return str(path)


def _require_trial(profile_arg: str, schema_path: Path, publish: bool) -> None:
    from dpsynth.models.profiles import load_named

    if publish and not load_named(profile_arg, schema_path).trial:
        raise ConfigError(
            "A release that publishes never takes a given privacy secret: it draws its own. A fixed secret "
            "is for trials (publish=False) in tests only."
        )


def _plant_secret(ctx: RunContext, secret: PrivacySecret) -> None:
    """Put a trial's given secret in place of the one its new run folder just drew; a run that already
    used its secret (resumed, or reused) keeps it, and must be that one."""
    from dpsynth.models.privacy import secret as secrets_mod
    from dpsynth.tasks.context import RUN_RECORD
    from dpsynth.tasks.run_lock import LOCK_FILE

    untouched = {p.name for p in ctx.run_dir.iterdir()} <= {RUN_RECORD, secrets_mod.SECRET_FILE, LOCK_FILE}
    if untouched:
        secrets_mod.secret_path(ctx.run_dir).unlink()
        secrets_mod.store(ctx.run_dir, secret)
    elif secrets_mod.load(ctx.run_dir) != secret:
        raise ConfigError(
            f"The run folder {str(ctx.run_dir)!r} already ran with another secret; a run keeps its secret. "
            "Choose another `out`."
        )


def _warn_real_table_trial(ctx: RunContext) -> None:
    from dpsynth.tasks.context import REAL_TABLE_TRIAL, finished_summary, is_demo_table

    if ctx.profile.trial and finished_summary(ctx) is None and not is_demo_table(ctx.data_path, ctx.data_hash):
        # Attributed to this package, so that the quiet console (flows/console.py) lets it through.
        warnings.warn(REAL_TABLE_TRIAL, stacklevel=2)


def _release_of(ctx: RunContext, summary: dict[str, Any]) -> Release:
    """The Release from the flow's summary and, for a published release, its bundle's release.json."""
    quality = Quality(
        auc=summary.get("auc"),
        real_auc=summary.get("real_auc"),
        fidelity=(summary.get("fidelity") or {}).get(summary.get("setting"), {}),
    )
    generator_file = Path(summary["generator_file"]) if summary.get("generator_file") else None
    if summary.get("published"):
        from dpsynth.models.privacy.statement import PrivacyStatement
        from dpsynth.tasks.bundle import RELEASE_JSON

        bundle = Path(summary["bundle_dir"])
        record = json.loads((bundle / RELEASE_JSON).read_text())
        statement = PrivacyStatement(
            record["epsilon_covers"], tuple(record["epsilon_does_not_cover"]), record["internal_only"]
        )
        return Release(
            release_id=str(summary["release_id"]),
            published=True,
            epsilon=math.inf if record["epsilon"] is None else float(record["epsilon"]),
            delta=float(record["delta"]),
            statement=statement.markdown(),
            bundle=bundle,
            model_uri=summary.get("model_uri") or record.get("model_uri"),
            run_dir=Path(summary["run_dir"]),
            quality=quality,
            table=ctx.schema.name,
            generator_file=generator_file,
            schema_path=ctx.schema_path,
        )
    from dpsynth.tasks.decision import statement_for

    prof = ctx.profile
    return Release(
        release_id=str(summary["release_id"]),
        published=False,
        epsilon=math.inf if summary.get("epsilon") is None else float(summary["epsilon"]),
        delta=float(summary["delta"]),
        statement=statement_for(prof, prof.release_target(), release=True).markdown(),
        bundle=None,
        model_uri=None,
        run_dir=Path(summary["run_dir"]),
        quality=quality,
        table=ctx.schema.name,
        generator_file=generator_file,
        schema_path=ctx.schema_path,
    )
