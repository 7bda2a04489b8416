"""The data dictionary of a release bundle: DATA_DICTIONARY.md for people, datapackage.json for machines.

Both say what each column of the released table is (label, type, unit, public bounds or levels and what
each code means, from the schema's `label`, `description`, `unit` and `meanings` keys), how the CSV is
separated, and how the target column was set. They are rendered from public inputs only: the schema,
the column types of the synthetic frame written to the bundle, and the release's `PublicRelease`.

datapackage.json is a Frictionless Data Package (v2): one resource per table file of the bundle, each
with a Table Schema whose fields follow the CSV's columns in order (`categories` carry the meanings,
`constraints` the public bounds and levels) and, for the CSV, a dialect with its delimiter.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from dpsynth.models.data.schema import Column, DatasetSchema
from dpsynth.tasks.public_release import PublicRelease

DATA_PACKAGE_PROFILE = "https://datapackage.org/profiles/2.0/datapackage.json"
TABLE_SCHEMA_PROFILE = "https://datapackage.org/profiles/2.0/tableschema.json"
TABLE_DIALECT_PROFILE = "https://datapackage.org/profiles/2.0/tabledialect.json"
PARQUET_MEDIATYPE = "application/vnd.apache.parquet"
TARGET_RECORD_KEY = "target_labels"  # release.json's key for how the target was set (tasks/bundle.py)


def table_field_type(values: pd.Series) -> str:
    """The Table Schema type of a column as written: integer, number, boolean or string."""
    if pd.api.types.is_bool_dtype(values):
        return "boolean"
    if pd.api.types.is_integer_dtype(values):
        return "integer"
    if pd.api.types.is_numeric_dtype(values):
        return "number"
    return "string"


def field_types(frame: pd.DataFrame) -> dict[str, str]:
    return {str(name): table_field_type(frame[name]) for name in frame.columns}


def target_statement(release: PublicRelease) -> str | None:
    """How the generator set the target column (its public prior), or None when it generated the target
    like any other column. The same text as the privacy summary's (models/generators/base.py)."""
    text = release.privacy.get(TARGET_RECORD_KEY)
    return None if text is None else str(text)


def target_paragraph(schema: DatasetSchema, release: PublicRelease) -> str:
    """The paragraph on the target column that a reader of the released rows must not miss."""
    column = schema.column(schema.target)
    name = f"`{column.name}` ({column.title})" if column.label else f"`{column.name}`"
    statement = target_statement(release)
    if statement is not None:
        return (
            f"**The target column {name}: its share in these rows is set by design, not learned.** "
            f"The {release.generator_name} generator draws each synthetic row's target from a public prior, "
            "then generates the other columns given it. The share of each target value among these rows "
            "therefore says nothing about the real table; only how the other columns relate to the target "
            "was learned (under the privacy guarantee). Reweight the rows if an analysis needs another "
            f'prevalence. release.json records, under `{TARGET_RECORD_KEY}`: "{statement}".'
        )
    return (
        f"**The target column {name}** is generated like every other column, by the {release.generator_name} "
        "generator trained under the privacy guarantee: its share among the released rows is the generator's "
        f"estimate, not a design choice (release.json's `{TARGET_RECORD_KEY}` is null)."
    )


def epsilon_text(release: PublicRelease) -> str:
    """The whole release's privacy cost in words."""
    if not release.private or not math.isfinite(release.epsilon):
        return "no differential-privacy guarantee (a non-private generator: epsilon = infinity)"
    return f"epsilon {release.epsilon:.2f} at delta {release.delta:g}, for the whole release"


def _number(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e6 else f"{value:,.0f}"


def values_text(column: Column) -> str:
    """The public values a column takes: its bounds (and point masses), or its levels with their meanings."""
    if column.is_continuous:
        low, high = column.continuous_bounds
        digits = {0: "whole numbers", 1: "1 decimal"}.get(column.decimals, f"{column.decimals} decimals")
        text = f"{_number(low)} to {_number(high)}, {digits}"
        if column.point_masses:
            text += "; values with mass of their own: " + ", ".join(_number(m) for m in column.point_masses)
        return text
    return ", ".join(
        f"{level} = {column.meaning(level)}" if column.meaning(level) else str(level) for level in column.levels
    )


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ") or "-"


def data_dictionary_markdown(
    schema: DatasetSchema, release: PublicRelease, types: dict[str, str], *, separator: str, csv_name: str
) -> str:
    """DATA_DICTIONARY.md: the released table's columns, its target, its missing values and its files."""
    sep_name = {",": "commas", ";": "semicolons", "\t": "tabs", "|": "vertical bars"}.get(separator, repr(separator))
    lines = [
        f"# Data dictionary: {schema.name} synthetic release {release.release_id}",
        "",
        f"Every row of this table is synthetic: sampled from a generator trained with {epsilon_text(release)}. "
        f"{release.rows:,} rows; no row is a real record. `{csv_name}` is UTF-8 text separated by {sep_name} "
        "with a header line; `synthetic.parquet` holds the same rows. `datapackage.json` describes them for "
        "programs (Frictionless Data Package), `SHA256SUMS` lets you check every file (`sha256sum -c SHA256SUMS`).",
        "",
    ]
    if schema.description:
        lines += [f"The real table it stands in for: {schema.description}.", ""]
    lines += [
        "## The target column",
        "",
        f"> {target_paragraph(schema, release)}",
        "",
        "## Columns",
        "",
        "In the order of the files' columns. Type: how the file stores the values (integer, number, string); "
        "kind: how the generator treats the column (continuous within public bounds, binary or categorical "
        "with public levels). Bounds and levels are public knowledge, never read off the real rows.",
        "",
        "| column | label | type | kind | unit | values | description |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for column in schema.columns:
        role = " (target)" if column.name == schema.target else ""
        cells = [
            f"`{column.name}`{role}",
            column.label,
            types.get(column.name, ""),
            column.kind,
            column.unit,
            values_text(column),
            column.description,
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines += [
        "",
        "## Missing values",
        "",
        "None: every synthetic row has a value in every column, within the column's public bounds (rounded "
        "to its decimals) or among its levels. How the real table's missing or out-of-bounds values were "
        "handled before training is part of the training, which the privacy guarantee covers; nothing about "
        "them is published.",
        "",
    ]
    return "\n".join(lines)


def write_data_dictionary(
    path: Path, schema: DatasetSchema, release: PublicRelease, frame: pd.DataFrame, *, separator: str, csv_name: str
) -> Path:
    path = Path(path)
    path.write_text(
        data_dictionary_markdown(schema, release, field_types(frame), separator=separator, csv_name=csv_name)
    )
    return path


# ------------------------------------------------------------------------------------ datapackage.json


def _typed(value: object, field_type: str) -> object:
    """A schema value (a bound, a level) as the field's type stores it: 10585.0 -> 10585 for an integer."""
    if field_type == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if field_type == "number" and isinstance(value, int):
        return float(value)
    return value


def table_field(column: Column, field_type: str, *, required: bool) -> dict:
    """One Table Schema field: name, title, description, type, constraints and (integer or string fields
    with meanings) `categories` of value and label."""
    description = column.description
    if column.unit:
        sentence = description if not description or description.endswith(".") else f"{description}."
        description = f"{sentence} Unit: {column.unit}.".strip()
    field: dict = {"name": column.name, "title": column.title}
    if description:
        field["description"] = description
    field["type"] = field_type
    constraints: dict = {"required": required}
    if column.is_continuous:
        low, high = column.continuous_bounds
        constraints |= {"minimum": _typed(low, field_type), "maximum": _typed(high, field_type)}
    else:
        constraints["enum"] = [_typed(level, field_type) for level in column.levels]
        if column.meanings and field_type in ("integer", "string"):  # the spec's category types
            field["categories"] = [
                {"value": _typed(level, field_type), "label": column.meaning(level) or str(level)}
                for level in column.levels
            ]
    field["constraints"] = constraints
    return field


def table_schema(schema: DatasetSchema, frame: pd.DataFrame) -> dict:
    """The Table Schema of `frame` as written: its columns in order, described by the public schema."""
    types = field_types(frame)
    fields = [
        table_field(schema.column(str(name)), types[str(name)], required=bool(frame[name].notna().all()))
        for name in frame.columns
    ]
    return {"$schema": TABLE_SCHEMA_PROFILE, "fields": fields, "missingValues": [""]}


def data_package(
    schema: DatasetSchema,
    release: PublicRelease,
    frame: pd.DataFrame,
    *,
    separator: str,
    csv_name: str,
    parquet_name: str | None,
) -> dict:
    """The bundle's Data Package: the CSV (with its dialect) and, when written, the Parquet file."""
    fields = table_schema(schema, frame)
    resources: list[dict] = [
        {
            "name": "synthetic",
            "path": csv_name,
            "type": "table",
            "title": f"Synthetic {schema.name} rows (CSV)",
            "format": "csv",
            "mediatype": "text/csv",
            "encoding": "utf-8",
            "dialect": {"$schema": TABLE_DIALECT_PROFILE, "delimiter": separator, "header": True},
            "schema": fields,
        }
    ]
    if parquet_name is not None:
        resources.append(
            {
                "name": "synthetic-parquet",
                "path": parquet_name,
                "type": "table",
                "title": f"Synthetic {schema.name} rows (Parquet, the same rows)",
                "format": "parquet",
                "mediatype": PARQUET_MEDIATYPE,
                "schema": fields,
            }
        )
    return {
        "$schema": DATA_PACKAGE_PROFILE,
        "name": f"{schema.name}-synthetic".lower().replace("_", "-"),
        "title": f"{schema.name} synthetic release {release.release_id}",
        "description": (
            f"Synthetic rows sampled from a generator trained with {epsilon_text(release)}; no row is a real "
            f"record. {target_paragraph(schema, release).replace('**', '')}"
        ),
        "resources": resources,
    }


def write_data_package(
    path: Path,
    schema: DatasetSchema,
    release: PublicRelease,
    frame: pd.DataFrame,
    *,
    separator: str,
    csv_name: str,
    parquet_name: str | None,
) -> Path:
    path = Path(path)
    package = data_package(schema, release, frame, separator=separator, csv_name=csv_name, parquet_name=parquet_name)
    path.write_text(json.dumps(package, indent=1, allow_nan=False) + "\n")
    return path
