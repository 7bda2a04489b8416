"""`dpsynth.Schema`: a table's public schema, from a YAML file or drafted from a DataFrame to fill in.

A schema's bounds and levels must be public knowledge (a code book, a questionnaire, physical limits):
taken from the rows they would leak the extreme values and the rare levels of real people, outside any
epsilon. So `Schema.draft(df)` reads only each column's name and type (categorical against continuous,
from the dtype and the number of distinct values: a structural fact the data owner reviews) and leaves
every bound, every level and the target as a placeholder that fails validation with a message saying to
fill it from public knowledge. Nothing is estimated from the rows: a differentially private estimate of
bounds and levels is not offered (it would need its own mechanism and an entry in the table's ledger).

The schema is held as the mapping its YAML file holds (models/data/schema.py validates it): `to_yaml`
writes it for editing, `fill` and `with_target` fill placeholders in code, `validated()` returns the
pipeline's `DatasetSchema`.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from dpsynth.models.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

    from dpsynth.models.data.schema import DatasetSchema

# What a placeholder says, in the YAML file and in the error that refuses it.
FILL = "fill from public knowledge"
BOUNDS_PLACEHOLDER = f"{FILL}: [low, high]"
LEVELS_PLACEHOLDER = f"{FILL}: [level, level, ...]"
TARGET_PLACEHOLDER = f"{FILL}: the name of a binary column to predict"
# A numeric column with at most this many distinct values is drafted as categorical (or binary, with two).
MAX_DRAFT_LEVELS = 20


class Schema:
    """A dataset schema as its YAML mapping (`name`, `version`, `separator`, `columns`, `target`, ...).

    `path`: the YAML file it was read from, if any (a release then uses that file as it is, and a
    profile name resolves beside it, as on the command line)."""

    def __init__(self, spec: dict[str, Any], path: Path | None = None) -> None:
        if not isinstance(spec, dict) or not isinstance(spec.get("columns"), dict):
            raise ConfigError("A schema is a mapping with a 'columns' mapping (see configs/cardio.yaml).")
        self._spec = copy.deepcopy(spec)
        self.path = path

    @classmethod
    def from_yaml(cls, path: str | Path) -> Schema:
        """The schema in `path`, validated now unless it still holds placeholders (a saved draft)."""
        path = Path(path).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"Schema file {str(path)!r} does not exist.")
        try:
            spec = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"Schema file {str(path)!r} is not valid YAML: {exc}") from None
        schema = cls(spec, path)
        if not schema.placeholders():
            schema.validated()
        return schema

    @classmethod
    def draft(
        cls,
        df: pd.DataFrame,
        name: str = "table",
        target: str | None = None,
        id_column: str | None = None,
        max_levels: int = MAX_DRAFT_LEVELS,
    ) -> Schema:
        """A schema naming `df`'s columns and their types, with placeholders for every bound and level
        (and for the target unless `target` names a column): see the module's docstring. A column is
        binary with two distinct values, categorical when it is text, boolean or numeric with at most
        `max_levels` distinct values, continuous otherwise. `id_column`: a column that identifies rows,
        dropped before training (not a feature). No value of `df` is written into it."""
        from pandas.api.types import is_bool_dtype, is_numeric_dtype

        if target is not None and target not in df.columns:
            raise ConfigError(f"target {target!r} is not a column of the DataFrame.")
        columns: dict[str, dict[str, Any]] = {}
        for column in df.columns:
            if column == id_column:
                continue
            series = df[column]
            distinct = int(series.nunique(dropna=True))
            if is_numeric_dtype(series) and not is_bool_dtype(series) and distinct > max_levels:
                columns[str(column)] = {"type": "continuous", "bounds": BOUNDS_PLACEHOLDER}
            else:
                kind = "binary" if distinct == 2 else "categorical"
                columns[str(column)] = {"type": kind, "levels": LEVELS_PLACEHOLDER}
        if target is not None and columns[str(target)]["type"] != "binary":
            raise ConfigError(f"target {target!r} must be a binary column (it has not two distinct values).")
        spec: dict[str, Any] = {"name": name, "version": 1, "columns": columns, "target": target or TARGET_PLACEHOLDER}
        if id_column is not None:
            if id_column not in df.columns:
                raise ConfigError(f"id column {id_column!r} is not a column of the DataFrame.")
            spec["id_column"] = id_column
        return cls(spec)

    @property
    def name(self) -> str:
        return str(self._spec.get("name", ""))

    @property
    def columns(self) -> list[str]:
        return list(self._spec["columns"])

    @property
    def target(self) -> str | None:
        target = self._spec.get("target")
        return None if target is None or _is_placeholder(target) else str(target)

    def to_dict(self) -> dict[str, Any]:
        """A copy of the YAML mapping."""
        return copy.deepcopy(self._spec)

    def to_yaml(self, path: str | Path) -> Path:
        """Write the schema (placeholders included) to `path` for editing; returns the path."""
        path = Path(path)
        path.write_text(self.yaml_text())
        return path

    def yaml_text(self) -> str:
        return yaml.safe_dump(self._spec, sort_keys=False, allow_unicode=True)

    def fill(
        self,
        column: str,
        *,
        bounds: tuple[float, float] | None = None,
        levels: list[Any] | tuple[Any, ...] | None = None,
        decimals: int | None = None,
    ) -> Schema:
        """A copy with `column`'s public bounds (continuous) or levels (binary, categorical) set."""
        if column not in self._spec["columns"]:
            raise ConfigError(f"{column!r} is not a column of the schema.")
        spec = self.to_dict()
        entry = spec["columns"][column]
        if bounds is not None:
            entry["bounds"] = [float(bounds[0]), float(bounds[1])]
        if levels is not None:
            entry["levels"] = list(levels)
        if decimals is not None:
            entry["decimals"] = int(decimals)
        return Schema(spec)

    def with_target(self, target: str) -> Schema:
        """A copy whose target (a binary column, predicted in the utility evaluation) is `target`."""
        spec = self.to_dict()
        spec["target"] = target
        return Schema(spec)

    def placeholders(self) -> list[str]:
        """What is still to be filled from public knowledge, one phrase each (empty when nothing is)."""
        missing = [
            f"column {name!r}: {key}"
            for name, entry in self._spec["columns"].items()
            for key in ("bounds", "levels")
            if isinstance(entry, dict) and _is_placeholder(entry.get(key))
        ]
        if _is_placeholder(self._spec.get("target")):
            missing.append("target")
        return missing

    def validated(self) -> DatasetSchema:
        """The pipeline's `DatasetSchema`; ConfigError naming every placeholder left, or every rule broken."""
        missing = self.placeholders()
        if missing:
            raise ConfigError(
                f"The schema {self.name!r} still has placeholders: {'; '.join(missing)}. Fill each from "
                "public knowledge (a code book, the questionnaire, physical limits), never from the rows: "
                "bounds and levels taken from the table would publish its extreme values and rare levels "
                "outside the privacy guarantee. Edit the file `to_yaml` wrote, or use `fill` and `with_target`."
            )
        from dpsynth.models.data.schema import DatasetSchema

        origin = f"schema {str(self.path)!r}" if self.path else f"schema {self.name!r}"
        return DatasetSchema.from_dict(self._spec, origin=origin)

    def __repr__(self) -> str:
        where = f", path={str(self.path)!r}" if self.path else ""
        return f"Schema(name={self.name!r}, columns={len(self._spec['columns'])}{where})"


def _is_placeholder(value: object) -> bool:
    return isinstance(value, str) and value.startswith(FILL)
