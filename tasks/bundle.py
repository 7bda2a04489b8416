"""The release bundle: what an institution publishes, and a check that no real row got into it.

A bundle holds only what the DP guarantee covers or what is public:

    synthetic.csv, synthetic.parquet   rows sampled from the released generator (the CSV separated by
                                       ',' unless the schema's `release_separator` says otherwise)
    generator.pt                       the released generator (spec and weights; no critic, no optimiser)
    schema.yaml                        the public schema the generator decodes through (when given)
    release.json                       the epsilon ledger: the whole release's epsilon and its parts,
                                       training epsilon per checkpoint, the chosen checkpoint, delta,
                                       accountant and its parameters, what epsilon covers and not, how
                                       the target column was set (`target_labels`), the CSV's separator
    RELEASE_NOTES.md                   the release notes (DP-only content)
    DATA_DICTIONARY.md                 each column's label, type, unit, bounds or levels with their
                                       meanings, the target's paragraph, the missing-value policy
    datapackage.json                   the same for programs: a Frictionless Data Package
    SUMMARY.html                       a one-page picture of the synthetic rows (marginals, correlations)
    SHA256SUMS                         the SHA-256 of every other file (`sha256sum -c SHA256SUMS`)

The dictionary, datapackage.json and SUMMARY.html need the schema (`schema` or `schema_path`); they
are rendered from it, the synthetic frame and the `PublicRelease` only (tasks/data_dictionary.py,
tasks/public_summary.py). SHA256SUMS is written last, and again whenever release.json changes
(`record_model_uri`); `verify_checksums` checks it.

Never a real row, a real-data statistic (AUC, validation counts, imputation details), a critic or a
discriminator loss: everything `release.json` holds comes from the release's `PublicRelease`, which is
guarded when it is made (`dpsynth.tasks.public_release.guard`), and `bundle_contains_no_real_rows`
lets tests and stewards check every table in a bundle against the real rows.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from pathlib import Path

import pandas as pd

from dpsynth.models.data.schema import DatasetSchema
from dpsynth.tasks.data_dictionary import TARGET_RECORD_KEY, target_statement, write_data_dictionary, write_data_package
from dpsynth.tasks.private_files import SHARED_FILE_MODE, make_shareable
from dpsynth.tasks.public_release import PublicRelease
from dpsynth.tasks.stage import write_json
from dpsynth.tasks.table_io import PARQUET_SUFFIXES, write_table

SYNTHETIC_PARQUET = "synthetic.parquet"
SYNTHETIC_CSV = "synthetic.csv"
GENERATOR = "generator.pt"
SCHEMA = "schema.yaml"
RELEASE_JSON = "release.json"
RELEASE_NOTES = "RELEASE_NOTES.md"
DATA_DICTIONARY = "DATA_DICTIONARY.md"
DATAPACKAGE = "datapackage.json"
SUMMARY = "SUMMARY.html"
CHECKSUMS = "SHA256SUMS"
TABLE_SUFFIXES = PARQUET_SUFFIXES + (".csv", ".tsv", ".txt")
_CSV_SEPARATORS = (",", ";", "\t", "|")

UNIT_OF_PRIVACY = "one row; adjacency: replace one row (sensitivity 2C of a clipped row gradient)"


def release_json(release: PublicRelease) -> dict:
    """The epsilon ledger of a release (release.json, before registration adds its `model_uri`).

    `epsilon` is the whole release's (training to the last checkpoint, with the DP choice of the
    checkpoint and of publishing: models/privacy/release_choice.py), never the chosen checkpoint's alone.
    Only iteration and training epsilon of each checkpoint are listed (no level shares or metrics).
    """
    checkpoints = [{"iteration": c.iteration, "epsilon": _json_epsilon(c.epsilon)} for c in release.checkpoints]
    chosen = next(c for c in checkpoints if c["iteration"] == release.iteration)
    total = _json_epsilon(release.epsilon)
    parameters = {
        "generator": release.generator_name,
        **release.parameters,
        **release.measured,
        "T": release.trained_iterations,
        "sampling": release.sampling,
        "choice_epsilon": release.choice_epsilon,
        "approval_epsilon": release.approval_epsilon,
    }
    return {
        "release_id": release.release_id,
        "dataset": release.dataset,
        "schema_version": release.schema_version,
        "chosen_checkpoint": chosen,
        "epsilon": total,
        "delta": release.delta,
        "epsilon_parts": {
            "training_to_last_checkpoint": _json_epsilon(release.epsilon_training),
            "last_checkpoint": release.trained_iterations,
            "checkpoint_choice_and_approval": release.epsilon_choice,
            "composition": release.composition,
        },
        "epsilon_budget": None if release.epsilon_budget is None else float(release.epsilon_budget),
        "private": total is not None,
        "accountant": {
            "mechanism": release.mechanism if release.private else "none (non-private)",
            "parameters": parameters,
        },
        "unit_of_privacy": UNIT_OF_PRIVACY,
        **release.statement.as_dict(),
        "checkpoints": checkpoints,
        "synthetic_rows": release.rows,
        # The target's share among the rows when the generator sets it by design (null: generated).
        TARGET_RECORD_KEY: target_statement(release),
        "model_uri": None,
    }


def _json_epsilon(value: float) -> float | None:
    """JSON has no infinity: a non-private checkpoint's epsilon is written as null."""
    value = float(value)
    return None if not math.isfinite(value) else value


def write_bundle(
    bundle_dir: Path,
    release: PublicRelease,
    *,
    synthetic_frame: pd.DataFrame,
    generator_file: Path,
    release_notes_path: Path,
    schema_path: Path | None = None,
    separator: str | None = None,
    schema: DatasetSchema | None = None,
) -> dict[str, Path]:
    """Write the bundle of `release` into `bundle_dir` (replacing an earlier bundle there) and return its
    paths: `synthetic_frame` (the release's rows), the released generator file, its notes (rendered from
    the same record: `dpsynth.tasks.report.write_public_release_notes`), release.json and, with a schema,
    the data dictionary, datapackage.json and SUMMARY.html; SHA256SUMS last.

    The bundle is assembled in a sibling temporary folder and renamed into place, so a reader never
    sees half a bundle. `schema` is the public schema (read from `schema_path` when not given).
    `separator` is the CSV's: by default the schema's `release_separator` (',' unless it sets one).
    """
    bundle_dir = Path(bundle_dir)
    if len(synthetic_frame) != release.rows:
        raise ValueError(f"the release publishes {release.rows} synthetic rows, not {len(synthetic_frame)}.")
    generator_file, release_notes_path = Path(generator_file), Path(release_notes_path)
    if schema is None and schema_path is not None:
        schema = DatasetSchema.from_yaml(schema_path)
    if separator is None:
        separator = schema.release_separator if schema is not None else ","
    if bundle_dir.exists() and any(bundle_dir.iterdir()) and not (bundle_dir / RELEASE_JSON).exists():
        raise FileExistsError(f"{str(bundle_dir)!r} exists and is not a release bundle; not replacing it.")
    staging = bundle_dir.with_name(bundle_dir.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    write_table(synthetic_frame, staging / SYNTHETIC_PARQUET)
    write_table(synthetic_frame, staging / SYNTHETIC_CSV, separator=separator)
    shutil.copyfile(generator_file, staging / GENERATOR)
    names = [SYNTHETIC_PARQUET, SYNTHETIC_CSV, GENERATOR, RELEASE_JSON, RELEASE_NOTES]
    if schema_path is not None:
        shutil.copyfile(schema_path, staging / SCHEMA)
        names.append(SCHEMA)
    shutil.copyfile(release_notes_path, staging / RELEASE_NOTES)
    files = {"synthetic.csv": {"separator": separator}}
    write_json({**release_json(release), "files": files}, staging / RELEASE_JSON)
    if schema is not None:
        # Imported here: matplotlib loads only when a bundle is written.
        from dpsynth.tasks.public_summary import write_public_summary

        write_data_dictionary(
            staging / DATA_DICTIONARY, schema, release, synthetic_frame, separator=separator, csv_name=SYNTHETIC_CSV
        )
        write_data_package(
            staging / DATAPACKAGE,
            schema,
            release,
            synthetic_frame,
            separator=separator,
            csv_name=SYNTHETIC_CSV,
            parquet_name=SYNTHETIC_PARQUET,
        )
        write_public_summary(staging / SUMMARY, synthetic_frame, schema, release)
        names += [DATA_DICTIONARY, DATAPACKAGE, SUMMARY]
    write_checksums(staging)  # last: it covers every other file
    names.append(CHECKSUMS)
    make_shareable(staging)  # the one folder meant to be shared (its run folder stays owner-only)
    if bundle_dir.exists():
        old = bundle_dir.with_name(bundle_dir.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        os.replace(bundle_dir, old)
        os.replace(staging, bundle_dir)
        shutil.rmtree(old)
    else:
        os.replace(staging, bundle_dir)
    keys = {
        SYNTHETIC_PARQUET: "parquet",
        SYNTHETIC_CSV: "csv",
        GENERATOR: "generator",
        RELEASE_JSON: "release_json",
        RELEASE_NOTES: "release_notes",
        SCHEMA: "schema",
        DATA_DICTIONARY: "data_dictionary",
        DATAPACKAGE: "datapackage",
        SUMMARY: "summary",
        CHECKSUMS: "checksums",
    }
    out = {keys[name]: bundle_dir / name for name in names}
    out["bundle"] = bundle_dir
    return out


def record_model_uri(bundle_dir: Path, model_uri: str) -> Path:
    """Add the registered model's URI to a written bundle's release.json and its new digest to
    SHA256SUMS, keeping both shareable."""
    path = Path(bundle_dir) / RELEASE_JSON
    write_json({**json.loads(path.read_text()), "model_uri": model_uri}, path)
    os.chmod(path, SHARED_FILE_MODE)
    sums = write_checksums(Path(bundle_dir))
    os.chmod(sums, SHARED_FILE_MODE)
    return path


# ------------------------------------------------------------------------------------ checksums


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _bundle_files(bundle_dir: Path) -> list[str]:
    """Every file of the bundle but SHA256SUMS, as sorted POSIX paths relative to the bundle."""
    return sorted(
        p.relative_to(bundle_dir).as_posix() for p in bundle_dir.rglob("*") if p.is_file() and p.name != CHECKSUMS
    )


def write_checksums(bundle_dir: Path) -> Path:
    """SHA256SUMS over every other file of the bundle, in `sha256sum`'s format ("<hex>  <name>"), so
    that `sha256sum -c SHA256SUMS` in the bundle checks it. Written atomically."""
    bundle_dir = Path(bundle_dir)
    lines = [f"{_sha256(bundle_dir / name)}  {name}\n" for name in _bundle_files(bundle_dir)]
    path = bundle_dir / CHECKSUMS
    tmp = path.with_name(CHECKSUMS + ".tmp")
    tmp.write_text("".join(lines))
    os.replace(tmp, path)
    return path


def verify_checksums(bundle_dir: Path) -> list[str]:
    """The bundle's files that SHA256SUMS does not vouch for: a digest that differs, a listed file that
    is missing, a file the list does not name (or every file, without a SHA256SUMS). Empty: intact."""
    bundle_dir = Path(bundle_dir)
    path = bundle_dir / CHECKSUMS
    if not path.is_file():
        return [CHECKSUMS, *_bundle_files(bundle_dir)]
    listed = {}
    for line in path.read_text().splitlines():
        digest, _, name = line.partition("  ")
        listed[name.removeprefix("*")] = digest
    problems = [
        name
        for name, digest in listed.items()
        if not (bundle_dir / name).is_file() or _sha256(bundle_dir / name) != digest
    ]
    problems += [name for name in _bundle_files(bundle_dir) if name not in listed]
    return sorted(problems)


# ------------------------------------------------------------------------------------ real-row check


def _read_any_table(path: Path, columns: list[str]) -> pd.DataFrame | None:
    """A table file of the bundle, or None if it cannot be read as one."""
    try:
        if path.suffix.lower() in PARQUET_SUFFIXES:
            return pd.read_parquet(path)
        frames = [pd.read_csv(path, sep=sep) for sep in _CSV_SEPARATORS]
        # The separator under which the most real columns appear (the first of equals).
        return max(frames, key=lambda frame: len(set(map(str, frame.columns)) & set(columns)))
    except (OSError, ValueError, pd.errors.ParserError, ImportError):
        return None


def _comparable(real: pd.DataFrame, other: pd.DataFrame, columns: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Both frames on `columns` with one type per column: float where both sides are numeric, text else."""
    left, right = {}, {}
    for col in columns:
        a = pd.to_numeric(real[col], errors="coerce")
        b = pd.to_numeric(other[col], errors="coerce")
        if a.notna().sum() == real[col].notna().sum() and b.notna().sum() == other[col].notna().sum():
            # Rounded so that a value read back from CSV text compares equal to its binary original.
            left[col], right[col] = a.astype("float64").round(6), b.astype("float64").round(6)
        else:
            left[col], right[col] = real[col].astype(str), other[col].astype(str)
    return pd.DataFrame(left), pd.DataFrame(right)


def real_row_matches(table: pd.DataFrame, real_frame: pd.DataFrame) -> int:
    """How many rows of `table` equal a row of `real_frame` on every column of `real_frame` (0 when the
    table lacks one of them: it cannot hold a complete real row)."""
    columns = [str(c) for c in real_frame.columns]
    table = table.rename(columns=str)
    if not set(columns) <= set(table.columns) or table.empty or real_frame.empty:
        return 0
    real, other = _comparable(real_frame.rename(columns=str), table, columns)
    real_hashes = set(pd.util.hash_pandas_object(real, index=False).tolist())
    return int(pd.util.hash_pandas_object(other, index=False).isin(real_hashes).sum())


def bundle_contains_no_real_rows(bundle_dir: Path, real_frame: pd.DataFrame) -> list[Path]:
    """Files of the bundle (any depth) holding a row equal to a real row on all of `real_frame`'s columns.

    An empty list means no table in the bundle repeats a real row. Pass the real table with the schema's
    columns (without an id column, which synthetic rows do not have). Rows are compared in full,
    continuous values included, so a synthetic row coincides with a real one only by chance of the
    whole row, which is rare but possible in data made mostly of discrete columns: a hit is a finding
    to inspect, not proof of a leak.
    """
    columns = [str(c) for c in real_frame.columns]
    offending = []
    for path in sorted(p for p in Path(bundle_dir).rglob("*") if p.is_file()):
        if path.suffix.lower() not in TABLE_SUFFIXES:
            continue
        table = _read_any_table(path, columns)
        if table is not None and real_row_matches(table, real_frame) > 0:
            offending.append(path)
    return offending
