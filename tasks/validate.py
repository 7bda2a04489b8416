"""Validation of an input table against its dataset schema, with a Great Expectations (1.x) suite.

The suite is built from the schema alone (`build_suite`) and committed as JSON under `expectations/`
(`write_suite`; a test keeps the file equal to a freshly built suite). Each expectation carries in its
`meta` the role it plays here:

- ``problem``: a failure makes the table invalid (missing column, text in a numeric column, a value
  outside the declared levels, a missing target, an all-missing column, too few rows);
- ``will_impute``: informational (severity ``info``): values of a continuous column outside its public
  bounds are counted and later treated as missing and imputed, as are missing feature values.

`validate_table` returns a `ValidationReport`. Its public view (`to_public_dict`, `summary_text`) holds
counts only; GX's full result, which lists sample unexpected values, is kept in `internal_result` for
internal storage (the data steward's tracking), never for a release.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

import great_expectations as gx
import great_expectations.expectations as gxe
import numpy as np
import pandas as pd
from great_expectations.data_context.types.base import ProgressBarsConfig
from great_expectations.expectations.metadata_types import FailureSeverity

from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import ConfigError, InvalidTableError
from dpsynth.tasks.suite_results import SuiteResultSum
from dpsynth.tasks.table_io import iter_table, normalize_columns

if TYPE_CHECKING:
    from great_expectations.core import ExpectationSuiteValidationResult, ExpectationValidationResult

    from dpsynth.tasks.stage import StageResult

TABLE = "<table>"
NUMERIC_TYPES = [
    "int",
    "float",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
]
MIN_ROWS_PARAMETER = "min_rows"

# Roles, stored in each expectation's meta under "dpsynth".
PROBLEM = "problem"
WILL_IMPUTE = "will_impute"

# GX's ephemeral context registers itself as the process-wide current context, which validation looks
# up: serialise validations so that concurrent threads never see each other's context.
_GX_LOCK = threading.Lock()


# ------------------------------------------------------------------------------------------ suite


def _meta(role: str, rule: str) -> dict:
    return {"dpsynth": {"role": role, "rule": rule}}


def build_suite(schema: DatasetSchema) -> gx.ExpectationSuite:
    """The expectation suite of `schema`: only declared, public facts (columns, types, bounds, levels)."""
    expectations: list[gxe.Expectation] = [
        gxe.ExpectTableRowCountToBeBetween(
            min_value={"$PARAMETER": MIN_ROWS_PARAMETER},
            meta=_meta(PROBLEM, "too few rows"),
        )
    ]
    for column in schema.columns:
        name = column.name
        is_target = name == schema.target
        expectations.append(gxe.ExpectColumnToExist(column=name, meta=_meta(PROBLEM, "required column is missing")))
        if column.is_continuous:
            low, high = column.continuous_bounds
            expectations.append(
                gxe.ExpectColumnValuesToBeInTypeList(
                    column=name, type_list=NUMERIC_TYPES, meta=_meta(PROBLEM, "values must be numbers")
                )
            )
            expectations.append(
                gxe.ExpectColumnValuesToBeBetween(
                    column=name,
                    min_value=low,
                    max_value=high,
                    severity=FailureSeverity.INFO,
                    meta=_meta(WILL_IMPUTE, f"values outside the public bounds [{low:g}, {high:g}] are imputed"),
                )
            )
        else:
            levels = list(column.levels)
            what = "target" if is_target else column.kind
            expectations.append(
                gxe.ExpectColumnValuesToBeInSet(
                    column=name,
                    value_set=levels,
                    meta=_meta(PROBLEM, f"{what} values must be one of the declared levels {levels}"),
                )
            )
        if is_target:
            expectations.append(
                gxe.ExpectColumnValuesToNotBeNull(column=name, meta=_meta(PROBLEM, "target values must not be missing"))
            )
        else:
            expectations.append(
                gxe.ExpectColumnProportionOfNonNullValuesToBeBetween(
                    column=name, min_value=0.0, strict_min=True, meta=_meta(PROBLEM, "column is entirely missing")
                )
            )
    return gx.ExpectationSuite(
        name=f"{schema.name}_v{schema.version}",
        expectations=expectations,
        meta={
            "great_expectations_version": gx.__version__,
            "dpsynth_schema": {"name": schema.name, "version": schema.version},
        },
    )


def suite_to_json(schema: DatasetSchema) -> str:
    """The suite of `schema` as JSON text (the content of `expectations/<name>.json`)."""
    return json.dumps(build_suite(schema).to_json_dict(), indent=2) + "\n"


def write_suite(schema: DatasetSchema, path: str | Path) -> Path:
    """Write the suite of `schema` to `path` (regenerate after changing a schema)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(suite_to_json(schema))
    return path


def load_suite(path: str | Path) -> gx.ExpectationSuite:
    """Read a suite written by `write_suite`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Expectation suite {str(path)!r} does not exist.")
    try:
        raw = json.loads(path.read_text())
        suite = gx.ExpectationSuite(**raw)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"Expectation suite {str(path)!r} is not a valid suite: {exc}") from None
    if len(suite.expectations) != len(raw.get("expectations", [])):
        # GX logs and skips an invalid expectation instead of raising.
        raise ConfigError(f"Expectation suite {str(path)!r} holds an invalid expectation.")
    return suite


# ----------------------------------------------------------------------------------------- report


@dataclass
class ValidationReport:
    """What validation found. `problems` and `will_impute` hold counts only, never values."""

    passed: bool
    rows: int
    problems: list[tuple[str, str, int]] = field(default_factory=list)
    will_impute: dict[str, int] = field(default_factory=dict)
    # `will_impute` by cause: values of a continuous column outside its public bounds, and missing values.
    outside_bounds: dict[str, int] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)
    dropped_columns: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    suite_name: str = ""
    # GX's full result (JSON-able): holds samples of unexpected values. Internal storage only.
    internal_result: dict = field(default_factory=dict, repr=False, compare=False)
    # Each kept column's dtype in the whole table (chunks may differ: int64 beside float64), for writing it.
    dtypes: dict[str, np.dtype] = field(default_factory=dict, repr=False, compare=False)

    def summary_text(self) -> str:
        head = (
            f"Table with {self.rows} row{'' if self.rows == 1 else 's'} "
            f"{'passed' if self.passed else 'FAILED'} validation "
            f"against suite {self.suite_name!r}."
        )
        lines = [head]
        for column, rule, n in self.problems:
            lines.append(f"  problem: column {column!r}: {rule} ({n} rows)")
        if self.will_impute:
            parts = ", ".join(f"{col} {n}" for col, n in self.will_impute.items())
            lines.append(f"  will impute (missing or outside public bounds), rows per column: {parts}")
        lines.extend(f"  warning: {w}" for w in self.warnings)
        return "\n".join(lines)

    def repairs(self) -> dict[str, dict[str, int]]:
        """What the release does to each column's values before training (`repairs_of`)."""
        return repairs_of(self.to_public_dict())

    def to_public_dict(self) -> dict:
        return {
            "passed": self.passed,
            "rows": self.rows,
            "suite": self.suite_name,
            "problems": [{"column": c, "rule": r, "rows": n} for c, r, n in self.problems],
            "will_impute": dict(self.will_impute),
            "outside_bounds": dict(self.outside_bounds),
            "missing": dict(self.missing),
            "dropped_columns": list(self.dropped_columns),
            "warnings": list(self.warnings),
        }


def repairs_of(summary: dict) -> dict[str, dict[str, int]]:
    """From a validation summary (`ValidationReport.to_public_dict`): {column: {"outside_bounds": n,
    "missing": m, "imputed": n + m}}, columns with nothing to repair left out. A value outside a
    continuous column's public bounds is imputed like a missing one (never clipped); a value outside a
    discrete column's levels is no repair: validation refuses the table. Counts of real rows: internal
    only (standard error, the internal report, the run's summary), never published."""
    outside, missing = summary.get("outside_bounds", {}), summary.get("missing", {})
    return {
        column: {"outside_bounds": outside.get(column, 0), "missing": missing.get(column, 0), "imputed": total}
        for column, total in summary.get("will_impute", {}).items()
    }


def repairs_text(repairs: dict[str, dict[str, int]], rows: int) -> str | None:
    """One sentence for the steward (standard error): per column, how many values were imputed and why;
    None when nothing was."""
    if not repairs:
        return None

    def values(n: int) -> str:
        return f"{n} value{'' if n == 1 else 's'}"

    parts = []
    for column, r in repairs.items():
        causes = [
            f"{values(r['outside_bounds'])} outside its public bounds" if r["outside_bounds"] else "",
            f"{values(r['missing'])} missing" if r["missing"] else "",
        ]
        parts.append(f"{column!r} {' and '.join(c for c in causes if c)}")
    return (
        f"the input needed repair before training (internal: counts of the {rows} real rows): "
        f"{'; '.join(parts)}; each such value is imputed as a missing one is (docs/operations.md)."
    )


# ------------------------------------------------------------------------------------- validation


def conform_table(schema: DatasetSchema, df: pd.DataFrame) -> tuple[pd.DataFrame, list[str], list[str]]:
    """Keep the declared columns (in schema order where present), typed as validation expects.

    Returns the table, the dropped unknown columns and the warnings about them; the schema's id column
    is dropped silently.
    """
    declared = set(schema.column_names)
    dropped = [str(c) for c in df.columns if c not in declared and c != schema.id_column]
    warnings = [f"column {c!r} is not declared in the schema: it was dropped" for c in dropped]
    kept = [c for c in schema.column_names if c in df.columns]
    return normalize_columns(df[kept], schema), dropped, warnings


def validate_table(
    schema: DatasetSchema,
    df: pd.DataFrame,
    *,
    min_rows: int = 2,
    suite: gx.ExpectationSuite | None = None,
) -> ValidationReport:
    """Validate `df` against the suite of `schema` (or the given `suite`, e.g. from `load_suite`)."""
    return validate_chunks(schema, [df], min_rows=min_rows, suite=suite)


def validate_chunks(
    schema: DatasetSchema,
    chunks: Iterable[pd.DataFrame],
    *,
    min_rows: int = 2,
    suite: gx.ExpectationSuite | None = None,
) -> ValidationReport:
    """`validate_table` of the table made of `chunks` (consecutive rows, e.g. `table_io.iter_table`), one
    chunk in memory at a time: the suite runs on each and the results combine into the verdicts of the
    whole table (tasks/suite_results.py says how)."""
    if min_rows < 1:
        raise ValueError("min_rows must be at least 1")
    suite = suite if suite is not None else build_suite(schema)
    combined = SuiteResultSum()
    dropped: list[str] = []
    warnings: list[str] = []
    present: set[str] = set()
    dtypes: dict[str, list[np.dtype]] = {}
    with _suite_runner(suite, min_rows) as run_suite:
        for df in chunks:
            if not df.columns.is_unique:
                duplicated = sorted({str(c) for c in df.columns[df.columns.duplicated()]})
                raise InvalidTableError(f"The table has duplicated column names: {', '.join(map(repr, duplicated))}.")
            table, dropped, warnings = conform_table(schema, df)
            present = set(table.columns)
            for column in table.columns:
                dtypes.setdefault(column, []).append(table[column].dtype)
            combined.add(_jsonable(run_suite(table).to_json_dict()), table)
    rows = combined.rows
    internal = combined.result(min_rows)

    problems: list[tuple[str, str, int]] = []
    will_impute: dict[str, int] = {}
    outside_bounds: dict[str, int] = {}
    missing_counts: dict[str, int] = {}
    for res in internal["results"]:
        config = res["expectation_config"]
        kwargs = config.get("kwargs", {})
        column = kwargs.get("column", TABLE)
        tag = (config.get("meta") or {}).get("dpsynth", {})
        role, rule = tag.get("role", PROBLEM), tag.get("rule", config["type"])
        detail = res.get("result") or {}
        if "missing_count" in detail and column != schema.target:
            missing_counts[column] = int(detail["missing_count"])
        if column != TABLE and column not in present and config["type"] != "expect_column_to_exist":
            continue  # reported once, by expect_column_to_exist
        if _raised(res):
            if role == PROBLEM:
                problems.append((column, f"could not be checked ({config['type']})", rows))
            continue
        if role == WILL_IMPUTE:
            if detail.get("unexpected_count"):
                will_impute[column] = outside_bounds[column] = int(detail["unexpected_count"])
            continue
        if res["success"]:
            continue
        if config["type"] == "expect_table_row_count_to_be_between":
            problems.append((TABLE, _row_rule(rows, min_rows), rows))
        elif "unexpected_count" in detail:
            problems.append((column, rule, int(detail["unexpected_count"])))
        else:
            problems.append((column, rule, rows))
    missing = {column: n for column, n in missing_counts.items() if n and n < rows}
    for column, n in missing.items():
        will_impute[column] = will_impute.get(column, 0) + n
    will_impute = {c: will_impute[c] for c in schema.column_names if will_impute.get(c)}
    outside_bounds = {c: outside_bounds[c] for c in will_impute if outside_bounds.get(c)}
    missing = {c: missing[c] for c in will_impute if missing.get(c)}
    if rows == 0:  # every column check is vacuous or degenerate on an empty table
        problems = [p for p in problems if p[0] == TABLE or p[0] not in present]
    order = {name: i for i, name in enumerate([TABLE, *schema.column_names])}
    problems.sort(key=lambda p: order.get(p[0], len(order)))

    return ValidationReport(
        passed=not problems,
        rows=rows,
        problems=problems,
        will_impute=will_impute,
        outside_bounds=outside_bounds,
        missing=missing,
        dropped_columns=dropped,
        warnings=warnings,
        suite_name=suite.name,
        internal_result=internal,
        dtypes={column: _whole_column_dtype(seen) for column, seen in dtypes.items()},
    )


def check_table(
    schema: DatasetSchema, df: pd.DataFrame, *, min_rows: int = 2, suite: gx.ExpectationSuite | None = None
) -> ValidationReport:
    """`validate_table`, raising `InvalidTableError` (with the problems, counts only) when it failed."""
    return _checked(schema, validate_table(schema, df, min_rows=min_rows, suite=suite))


def check_table_chunks(schema: DatasetSchema, data_path: str | Path, *, min_rows: int = 2) -> ValidationReport:
    """`check_table` of the table file at `data_path`, read and validated one chunk (a row group's worth
    of rows) at a time: memory does not grow with the table."""
    from dpsynth.tasks.cell_counting import ROW_GROUP_ROWS

    return _checked(schema, validate_chunks(schema, iter_table(data_path, schema, ROW_GROUP_ROWS), min_rows=min_rows))


def _checked(schema: DatasetSchema, report: ValidationReport) -> ValidationReport:
    if not report.passed:
        raise InvalidTableError(
            f"The input table ({report.rows} rows) does not conform to the schema {schema.name!r} "
            f"(version {schema.version}):",
            report.problems,
        )
    return report


# The passing validations of this process, by the table file's hash, the schema's and the row floor: the
# command line's preflight validates the table before the run folder exists, and the validate stage
# would otherwise run the same suite on the same bytes again (minutes on a census-size table).
_PASSED: dict[tuple[str, str, int], ValidationReport] = {}


def check_table_file(schema: DatasetSchema, data_path: str | Path, *, min_rows: int = 2) -> ValidationReport:
    """`check_table_chunks` of the file at `data_path`; a table file this process has already seen pass
    (the same bytes, schema and row floor) is not validated again: the same report."""
    from dpsynth.tasks.stage import sha256_file

    if not schema.source_hash:  # a schema built in code: nothing identifies it
        return check_table_chunks(schema, data_path, min_rows=min_rows)
    key = (sha256_file(Path(data_path)), schema.source_hash, min_rows)
    if key not in _PASSED:
        _PASSED.clear()  # one table at a time: a report holds the suite's full result
        _PASSED[key] = check_table_chunks(schema, data_path, min_rows=min_rows)
    return _PASSED[key]


def check_repairs(report: ValidationReport, max_repaired_share: float | None) -> None:
    """Raise `InvalidTableError` when some column has more than `max_repaired_share` of its values imputed
    (missing, or outside the public bounds): the profile's `input.max_repaired_share`, None: no limit. A
    refusal at validation, before any work, and like a failed validation a fact of the rows that epsilon
    does not cover (models/privacy/statement.py lists it)."""
    if max_repaired_share is None:
        return
    over = [
        (column, f"{n / report.rows:.1%} of its values would be imputed (missing or outside the public bounds)", n)
        for column, n in report.will_impute.items()
        if report.rows and n / report.rows > max_repaired_share
    ]
    if over:
        raise InvalidTableError(
            f"The input table ({report.rows} rows) needs more repair than the profile allows "
            f"(input.max_repaired_share {max_repaired_share:g}): fix the extract, or raise the limit. Nothing "
            "was trained, spent or published:",
            over,
        )


def _row_rule(rows: int, min_rows: int) -> str:
    if rows == 0:
        return "the table has no rows"
    return (
        f"the table has {rows} row{'s' if rows != 1 else ''} but at least {min_rows} are needed "
        f"to split it into training and test rows"
    )


def _raised(res: dict) -> bool:
    info = res.get("exception_info") or {}
    if info.get("raised_exception"):
        return True
    return any(isinstance(v, dict) and v.get("raised_exception") for v in info.values())


@contextmanager
def _suite_runner(
    suite: gx.ExpectationSuite, min_rows: int
) -> Iterator[Callable[[pd.DataFrame], ExpectationSuiteValidationResult | ExpectationValidationResult]]:
    """A function running `suite` on a frame, with one GX context for every chunk of a table."""
    with _GX_LOCK:
        context = gx.get_context(mode="ephemeral")
        context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        asset = context.data_sources.add_pandas("dpsynth").add_dataframe_asset("table")
        whole = asset.add_batch_definition_whole_dataframe("whole")

        def run(table: pd.DataFrame) -> ExpectationSuiteValidationResult | ExpectationValidationResult:
            batch = whole.get_batch(batch_parameters={"dataframe": table})
            return batch.validate(suite, result_format="SUMMARY", expectation_parameters={MIN_ROWS_PARAMETER: min_rows})

        yield run


def _whole_column_dtype(seen: list[np.dtype]) -> np.dtype:
    """The dtype `normalize_column` gives the whole column when its chunks gave `seen`: a chunk of floats
    (a gap, a fraction) makes the whole column float; text anywhere makes it object."""
    if all(d == seen[0] for d in seen):
        return seen[0]
    if all(d.kind in "iuf" for d in seen):
        return np.result_type(*seen)
    return np.dtype(object)


def _jsonable(obj: Any) -> Any:
    def default(value: Any) -> Any:
        if hasattr(value, "item"):
            return value.item()
        if hasattr(value, "tolist"):
            return value.tolist()
        return str(value)

    return json.loads(json.dumps(obj, default=default))


def main(argv: list[str] | None = None) -> None:
    """`python -m dpsynth.tasks.validate SCHEMA.yaml OUT.json`: regenerate a committed suite."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        raise SystemExit("usage: python -m dpsynth.tasks.validate SCHEMA.yaml OUT.json")
    print(write_suite(DatasetSchema.from_yaml(args[0]), args[1]))


if __name__ == "__main__":
    main()


# ------------------------------------------------------------------------------------------ stage


def validate_stage(
    run_dir: Path,
    schema_path: str | Path,
    data_path: str | Path,
    min_rows: int = 2,
    max_repaired_share: float | None = None,
) -> StageResult:
    """Stage 1: validate the input table (and refuse it above `max_repaired_share`, `check_repairs`); keep
    the conformed table and GX's full result internally."""
    from dpsynth.tasks.stage import run_stage, write_json

    schema = DatasetSchema.from_yaml(schema_path)

    def work(directory: Path) -> tuple[dict[str, Path], dict]:
        report = check_table_file(schema, data_path, min_rows=min_rows)
        check_repairs(report, max_repaired_share)
        write_conformed_parquet(schema, data_path, report, directory / "table.parquet")
        write_json(report.to_public_dict(), directory / "summary.json")
        # GX's result lists unexpected values: it stays in the internal run folder only.
        write_json(report.internal_result, directory / "internal_result.json")
        return (
            {
                "table": directory / "table.parquet",
                "summary": directory / "summary.json",
                "internal_result": directory / "internal_result.json",
            },
            report.to_public_dict(),
        )

    config: dict[str, object] = {"min_rows": min_rows}
    if max_repaired_share is not None:  # only then: a run folder validated before the key existed resumes
        config["max_repaired_share"] = max_repaired_share
    return run_stage(run_dir, "validate", {"data": Path(data_path), "schema": Path(schema_path)}, config, work)


def write_conformed_parquet(schema: DatasetSchema, data_path: str | Path, report: ValidationReport, path: Path) -> Path:
    """The validated table's declared columns as Parquet, read and written one row group at a time, each
    column typed as in the whole table (`report.dtypes`): the same file as writing the whole conformed
    frame with `to_parquet`, without holding it. The later stages' one-pass counting reads its row groups
    one at a time (tasks/cell_counting.py)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dpsynth.tasks.cell_counting import ROW_GROUP_ROWS

    writer: pq.ParquetWriter | None = None
    arrow_schema: pa.Schema | None = None
    try:
        for chunk in iter_table(data_path, schema, ROW_GROUP_ROWS):
            table, _, _ = conform_table(schema, chunk)
            table = table.astype(report.dtypes).reset_index(drop=True)
            if arrow_schema is None:
                # Text columns are strings even where this chunk holds only gaps (arrow would say null).
                fields = [
                    pa.field(c, pa.string() if table[c].dtype == object else pa.from_numpy_dtype(table[c].dtype))
                    for c in table.columns
                ]
                arrow_schema = pa.schema(fields).with_metadata(
                    pa.Schema.from_pandas(table, preserve_index=False).metadata
                )
                writer = pq.ParquetWriter(path, arrow_schema)
            assert writer is not None
            writer.write_table(pa.Table.from_pandas(table, schema=arrow_schema, preserve_index=False))
    finally:
        if writer is not None:
            writer.close()
    return path
