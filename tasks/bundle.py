"""The release bundle: what an institution publishes, and a check that no real row got into it.

A bundle holds only what the DP guarantee covers or what is public:

    synthetic.parquet, synthetic.csv   rows sampled from the released generator
    generator.pt                       the released generator (spec and weights; no critic, no optimiser)
    schema.yaml                        the public schema the generator decodes through (when given)
    release.json                       the epsilon ledger: the whole release's epsilon and its parts,
                                       training epsilon per checkpoint, the chosen checkpoint, delta,
                                       accountant and its parameters, what epsilon covers and not
    RELEASE_NOTES.md                   the release notes (DP-only content)

Never a real row, a real-data statistic (AUC, validation counts, imputation details), a critic or a
discriminator loss: everything `release.json` holds comes from the release's `PublicRelease`, which is
guarded when it is made (`dpsynth.tasks.public_release.guard`), and `bundle_contains_no_real_rows`
lets tests and stewards check every table in a bundle against the real rows.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pandas as pd

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
    separator: str = ",",
) -> dict[str, Path]:
    """Write the bundle of `release` into `bundle_dir` (replacing an earlier bundle there) and return its
    paths: `synthetic_frame` (the release's rows), the released generator file, its notes (rendered from
    the same record: `dpsynth.tasks.report.write_public_release_notes`) and release.json.

    The bundle is assembled in a sibling temporary folder and renamed into place, so a reader never
    sees half a bundle. `separator` is the CSV's (pass the schema's to match the input's format).
    """
    bundle_dir = Path(bundle_dir)
    if len(synthetic_frame) != release.rows:
        raise ValueError(f"the release publishes {release.rows} synthetic rows, not {len(synthetic_frame)}.")
    generator_file, release_notes_path = Path(generator_file), Path(release_notes_path)
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
    }
    out = {keys[name]: bundle_dir / name for name in names}
    out["bundle"] = bundle_dir
    return out


def record_model_uri(bundle_dir: Path, model_uri: str) -> Path:
    """Add the registered model's URI to a written bundle's release.json, keeping it shareable."""
    path = Path(bundle_dir) / RELEASE_JSON
    write_json({**json.loads(path.read_text()), "model_uri": model_uri}, path)
    os.chmod(path, SHARED_FILE_MODE)
    return path


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
