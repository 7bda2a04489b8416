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
discriminator loss: `write_bundle` refuses a `release_json` whose keys name such things, and
`bundle_contains_no_real_rows` lets tests and stewards check every table in a bundle against the real
rows.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import pandas as pd

from dpsynth.tasks.private_files import SHARED_FILE_MODE, make_shareable
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

# Keys of release.json that would carry real-data facts or internal model parts into the bundle.
_STATEMENT_KEYS = ("epsilon_covers", "epsilon_does_not_cover", "internal_only")
_FORBIDDEN_KEY = re.compile(r"auc|accuracy|real|critic|discriminator_loss|wasserstein|loss|imputation|"
                            r"validation|data_sha|n_train|train_rows", re.IGNORECASE)

def build_release_json(*, release_id: str, dataset: str, schema_version: int, ledger: list[dict],
                       chosen_iteration: int, epsilon: float, epsilon_training: float, epsilon_choice: float,
                       composition: str, delta: float, accountant: str, parameters: dict,
                       epsilon_budget: float | None, rows: int, statement: dict,
                       model_uri: str | None = None) -> dict:
    """The epsilon ledger of a release, from the training ledger (`ledger.json`'s "checkpoints").

    `epsilon` is the whole release's (training to the last checkpoint, with the DP choice of the
    checkpoint and of publishing: models/privacy/release_choice.py), never the chosen checkpoint's alone.
    `parameters` holds the accountant's inputs (e.g. K, T, batch_size, sigma, C, sampling); `statement`
    is dpsynth.models.privacy.statement's `as_dict()`. Only iteration and training epsilon of each checkpoint
    are kept (no level shares or metrics).
    """
    checkpoints = [{"iteration": int(e["iteration"]), "epsilon": _json_epsilon(e["epsilon"])} for e in ledger]
    chosen = next((c for c in checkpoints if c["iteration"] == int(chosen_iteration)), None)
    if chosen is None:
        raise ValueError(f"iteration {chosen_iteration} is not in the training ledger.")
    total = _json_epsilon(epsilon)
    return {
        "release_id": release_id,
        "dataset": dataset,
        "schema_version": int(schema_version),
        "chosen_checkpoint": chosen,
        "epsilon": total,
        "delta": float(delta),
        "epsilon_parts": {"training_to_last_checkpoint": _json_epsilon(epsilon_training),
                          "last_checkpoint": checkpoints[-1]["iteration"],
                          "checkpoint_choice_and_approval": float(epsilon_choice),
                          "composition": composition},
        "epsilon_budget": None if epsilon_budget is None else float(epsilon_budget),
        "private": total is not None,
        "accountant": {"mechanism": accountant, "parameters": parameters},
        "unit_of_privacy": "one row; adjacency: replace one row (sensitivity 2C of a clipped row gradient)",
        **statement,
        "checkpoints": checkpoints,
        "synthetic_rows": int(rows),
        "model_uri": model_uri,
    }


def _json_epsilon(value) -> float | None:
    """JSON has no infinity: a non-private checkpoint's epsilon is written as null."""
    value = float(value)
    return None if not math.isfinite(value) else value


def _forbidden_keys(obj, where: str = "") -> list[str]:
    found = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            path = f"{where}.{key}" if where else str(key)
            if key not in _STATEMENT_KEYS and _FORBIDDEN_KEY.search(str(key)):
                found.append(path)
            found += _forbidden_keys(value, path)
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            found += _forbidden_keys(value, f"{where}[{i}]")
    return found


def write_bundle(bundle_dir: Path, *, synthetic_frame: pd.DataFrame, generator_file: Path, release_json: dict,
                 release_notes_path: Path, schema_path: Path | None = None, separator: str = ",") -> dict[str, Path]:
    """Write the release bundle into `bundle_dir` (replacing an earlier bundle there) and return its paths.

    The bundle is assembled in a sibling temporary folder and renamed into place, so a reader never
    sees half a bundle. `separator` is the CSV's (pass the schema's to match the input's format).
    """
    bundle_dir = Path(bundle_dir)
    bad = _forbidden_keys(release_json)
    if bad:
        raise ValueError(f"release.json must hold only DP-covered or public facts; refusing keys {bad}.")
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
    write_json({**release_json, "files": files}, staging / RELEASE_JSON)
    make_shareable(staging)   # the one folder meant to be shared (its run folder stays owner-only)
    if bundle_dir.exists():
        old = bundle_dir.with_name(bundle_dir.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        os.replace(bundle_dir, old)
        os.replace(staging, bundle_dir)
        shutil.rmtree(old)
    else:
        os.replace(staging, bundle_dir)
    keys = {SYNTHETIC_PARQUET: "parquet", SYNTHETIC_CSV: "csv", GENERATOR: "generator", RELEASE_JSON: "release_json",
            RELEASE_NOTES: "release_notes", SCHEMA: "schema"}
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
        best = None
        for sep in _CSV_SEPARATORS:  # the separator under which the most real columns appear
            frame = pd.read_csv(path, sep=sep)
            hits = len(set(map(str, frame.columns)) & set(columns))
            if best is None or hits > best[0]:
                best = (hits, frame)
        return best[1]
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
