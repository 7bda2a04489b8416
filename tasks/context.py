"""What a run needs to know before any stage starts: schema, profile, data hash, its id and folder.

Loaded and checked once, at the edge (the command line or the flow's first step).

A run's identity is random (`<dataset>-<profile>-<12 hex digits>`): nothing about the private file is
in it. Each run folder holds `run.json` (its id, kind, the identity of its inputs and its status) and
the run's privacy secret (models/privacy/secret.py). What the next command does:

* `--out DIR` names the folder: a new run there, or the run already there resumed. A folder holding a
  run of other inputs (another table, schema or profile) is refused: its secret must never serve two
  inputs, since two releases with the same noise would cancel it.
* Without `--out`, an interrupted run of the same inputs (status "running" or "failed": killed or
  crashed) under `<home>/runs/<kind>/` is resumed with its secret, so it continues exactly; otherwise a new
  run starts with a new id and a new secret. A run that published, or that its DP decision refused,
  is final: running the command again is a new release, with new noise. So is a finished trial
  (status "trial", or "trial-refused" where the DP approval would have refused it): a release that
  published nothing (a profile with `trial: true`, or `dpsynth release --no-publish`).

A table written by `dpsynth demo-data` has a sidecar, `<table>.demo.json`, holding the table's sha256
and the generator's parameters; a table is a demo table only when that sidecar's hash is the table's.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from dpsynth.models.config import Profile
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import ConfigError, MissingInputError, RunInProgressError
from dpsynth.models.profiles import load_named
from dpsynth.tasks.run_lock import lock_run, unlock_run
from dpsynth.tasks.stage import read_json, sha256_file, sha256_json, write_json

RUN_RECORD = "run.json"
RESUMABLE = ("running", "failed")
FINAL = ("published", "refused", "completed", "trial", "trial-refused")
DEMO_SIDECAR_SUFFIX = ".demo.json"
# What a trial on a table that is not a demo table says (one line, on standard error from the command line).
REAL_TABLE_TRIAL = (
    "a trial on a real table (not one `dpsynth demo-data` wrote): nothing is published and "
    "nothing is entered in the table's privacy ledger."
)


@dataclass(frozen=True)
class RunContext:
    schema_path: Path
    data_path: Path
    schema: DatasetSchema
    profile: Profile
    data_hash: str
    run_id: str
    run_dir: Path
    kind: str = "release"

    @property
    def model_name(self) -> str:
        """The registered model: the profile's name for it, else "<dataset>-<generator>" of the release."""
        if self.profile.model_name:
            return self.profile.model_name
        return f"{self.schema.name}-{self.profile.generator_of(self.profile.release_target())}"

    @property
    def identity(self) -> dict:
        """What makes two runs the same run (internal: the data hash never leaves the run folder)."""
        return {
            "kind": self.kind,
            "data_sha256": self.data_hash,
            "config_sha256": sha256_json([self.profile.config_hash, self.schema.source_hash]),
        }


def runs_folder(kind: str) -> Path:
    """Where runs of `kind` go without --out: `<home>/runs/<kind>/` (tasks/home.py), from any folder."""
    from dpsynth.tasks.home import home

    return home() / "runs" / kind


def new_run_id(schema: DatasetSchema, profile: Profile) -> str:
    return f"{schema.name}-{profile.name}-{secrets.token_hex(6)}"


def read_run_record(run_dir: Path) -> dict | None:
    path = Path(run_dir) / RUN_RECORD
    try:
        return read_json(path)
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ConfigError(f"The run record {str(path)!r} is damaged; start a new run with another --out.") from None


def _resumable_run(base: Path, identity: dict) -> Path | None:
    """The newest run folder under `base` whose inputs match and which did not end."""
    if not base.is_dir():
        return None
    found = []
    for record_path in base.glob(f"*/{RUN_RECORD}"):
        try:
            record = read_json(record_path)
        except (json.JSONDecodeError, OSError):
            continue
        if record.get("identity") == identity and record.get("status") in RESUMABLE:
            found.append((record.get("created", ""), record_path.parent))
    return max(found)[1] if found else None


def load_context(
    config: str, data: str, profile: str, out: str | None, kind: str, generator: str | None = None, publish: bool = True
) -> RunContext:
    """`generator` (the command line's --generator) puts every setting of the profile on that generator;
    `publish=False` (--no-publish) makes it a trial profile. Both are part of the profile, so of the
    run's identity: a trial's folder is never resumed by a release that publishes, nor the reverse."""
    schema = DatasetSchema.from_yaml(config)
    prof = load_named(profile, config)
    if generator is not None:
        prof = prof.with_generator(generator)
    if not publish and not prof.trial:
        prof = dataclasses.replace(prof, trial=True)
    data_path = Path(data)
    if not data_path.is_file():
        raise MissingInputError(f"The data file {data!r} does not exist (or is not a file).")
    data_hash = sha256_file(data_path)
    probe = RunContext(Path(config), data_path, schema, prof, data_hash, "", Path("."), kind)
    if out:
        run_dir = Path(out)
        record = read_run_record(run_dir)
        if record is not None and record.get("identity") != probe.identity:
            raise ConfigError(
                f"The run folder {out!r} holds a run of other inputs (another table, schema or profile); its "
                "privacy secret must not serve two inputs. Choose another --out, or remove that folder."
            )
        run_id = record["run_id"] if record else new_run_id(schema, prof)
    else:
        base = runs_folder(kind)
        resumable = _resumable_run(base, probe.identity)
        if resumable is not None:
            run_dir = resumable
            record = read_run_record(run_dir)
            assert record is not None  # _resumable_run found it there
            run_id = record["run_id"]
        else:
            run_id = new_run_id(schema, prof)
            run_dir = base / run_id
    return RunContext(Path(config), data_path, schema, prof, data_hash, run_id, run_dir, kind)


def open_run(ctx: RunContext) -> bool:
    """Create or resume the run folder: its record (status "running") and its secret. Returns whether an
    earlier attempt of this run was found (a resume)."""
    from dpsynth.models.privacy.secret import load, load_or_create, secret_path
    from dpsynth.tasks.private_files import owner_only, private_dir

    owner_only()
    default_base = runs_folder(ctx.kind)
    if ctx.run_dir.parent.resolve() == default_base.resolve():
        # runs/ and runs/<kind>/ list the run ids: owner-only too. A folder named with --out keeps its
        # parent as it is (that may be anyone's folder, /tmp included).
        private_dir(default_base.parent)
        private_dir(default_base)
    private_dir(ctx.run_dir)
    # Before the record is read or written: a second process on this run is refused here, having written
    # nothing (tasks/run_lock.py). The lock is let go of in close_run.
    lock_run(ctx.run_dir, ctx.run_id)
    record = read_run_record(ctx.run_dir)
    if record is not None and record.get("run_id") != ctx.run_id:
        # Another process started a new run in this folder between our look at it and our lock.
        unlock_run(ctx.run_dir)
        raise RunInProgressError(
            f"Another process started the run {record.get('run_id')} in {str(ctx.run_dir)!r} while this one "
            "was starting; this one did nothing. Wait for it to end, then run the same command again."
        )
    if finished_summary(ctx) is not None:
        unlock_run(ctx.run_dir)
        raise RunInProgressError(
            f"The run {ctx.run_id} ended while this command was starting (another process ran it); this one "
            "did nothing. Run the same command again to see its result."
        )
    resumed = record is not None
    if resumed:
        # A run continues with the secret it started with, or not at all: a new secret would pair
        # stages done with the old one (the split, the partition) with new noise.
        load(ctx.run_dir)
    elif secret_path(ctx.run_dir).exists():
        # A new run draws its own secret: it never takes one put there beforehand.
        raise ConfigError(
            f"The folder {str(ctx.run_dir)!r} holds a privacy secret but no run of dpsynth's; a new "
            "run draws its own secret. Choose an empty --out."
        )
    else:
        load_or_create(ctx.run_dir)
    now = datetime.now(UTC).isoformat()
    record = record or {"run_id": ctx.run_id, "kind": ctx.kind, "identity": ctx.identity, "created": now}
    write_json({**record, "status": "running", "updated": now}, ctx.run_dir / RUN_RECORD)
    return resumed


def remember(ctx: RunContext, **fields: object) -> None:
    """Add facts to the run record (e.g. its MLflow run id, its final summary)."""
    record = read_run_record(ctx.run_dir)
    if record is not None:
        write_json({**record, **fields}, ctx.run_dir / RUN_RECORD)


def finished_summary(ctx: RunContext) -> dict | None:
    """The summary of a run that already ended for good (published, a finished trial, or completed),
    else None: running its command again on the same folder reuses everything and does nothing new."""
    record = read_run_record(ctx.run_dir) or {}
    if record.get("status") in ("published", "trial", "completed") and isinstance(record.get("summary"), dict):
        return {**record["summary"], "reused": True}
    return None


def close_run(ctx: RunContext, status: str) -> None:
    """Record how the run ended: "published", "refused", "trial", "trial-refused" or "completed" (final),
    or "failed" (resumable)."""
    if status not in FINAL + ("failed",):
        raise ValueError(f"unknown run status {status!r}")
    record = read_run_record(ctx.run_dir)
    if record is not None:
        write_json({**record, "status": status, "updated": datetime.now(UTC).isoformat()}, ctx.run_dir / RUN_RECORD)
    unlock_run(ctx.run_dir)


def demo_sidecar(data_path: str | Path) -> Path:
    """Where `dpsynth demo-data` describes the table it wrote: `<table>.demo.json` beside it."""
    path = Path(data_path)
    return path.with_name(path.name + DEMO_SIDECAR_SUFFIX)


def write_demo_sidecar(data_path: str | Path, parameters: dict) -> Path:
    """Record that `data_path` was made by code: its sha256 and the generator's parameters."""
    path = demo_sidecar(data_path)
    write_json({"made_by": "dpsynth demo-data", "sha256": sha256_file(Path(data_path)), "parameters": parameters}, path)
    return path


def is_demo_table(data_path: str | Path, data_hash: str) -> bool:
    """Whether the table is one `dpsynth demo-data` wrote, unchanged since: its sidecar exists and names
    its hash. Anything else (no sidecar, an unreadable one, a table edited or replaced since) is real."""
    try:
        recorded = read_json(demo_sidecar(data_path))
    except (OSError, ValueError):
        return False
    return isinstance(recorded, dict) and recorded.get("sha256") == data_hash
