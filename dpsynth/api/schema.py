"""`dpsynth.Schema`: a table's public schema, from a YAML file or drafted from a DataFrame to fill in.

A schema's bounds and levels must be public knowledge (a code book, a questionnaire, physical limits):
taken from the rows they would leak the extreme values and the rare levels of real people, outside any
epsilon. So `Schema.draft(df)` reads only each column's name and dtype (numbers continuous, everything
else categorical; the column named as target binary) and leaves every bound, every level, every
continuous column's decimals and the target as a placeholder that fails validation with a message saying
to fill it from public knowledge. Nothing in a draft depends on the values: two tables that differ in any
row give the same draft (a numeric column holding codes is drafted continuous, with a comment in the YAML
saying how to make it categorical). Nothing is estimated from the rows: a differentially private estimate of
bounds and levels is not offered (it would need its own mechanism and an entry in the table's ledger).

The schema is held as the mapping its YAML file holds (models/data/schema.py validates it): `to_yaml`
writes it for editing, `fill` and `with_target` fill placeholders in code, `validated()` returns the
pipeline's `DatasetSchema`.
"""

from __future__ import annotations

import copy
import textwrap
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
DECIMALS_PLACEHOLDER = f"{FILL}: digits kept after the decimal point (0: whole numbers)"
# What a steward fills in a drafted column, key by key.
FILLED_KEYS = ("bounds", "levels", "decimals")
# Said above each drafted numeric column in the YAML file: its kind came from the dtype alone.
CODES_COMMENT = (
    "numeric in the table, so drafted continuous; if its values are codes (e.g. 1, 2, 3 for low, normal, "
    "high), make it `type: categorical` with `levels` in place of `bounds` and `decimals`"
)
DRAFT_HEADER = (
    "# A schema drafted from the table's column names and types only (`dpsynth schema draft`): no value of\n"
    "# the table is in it. Replace every value that starts with 'fill from public knowledge' from a code book,\n"
    "# the questionnaire or physical limits, never from the rows; `dpsynth schema check FILE` lists what is left.\n"
)


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
        separator: str = ",",
    ) -> Schema:
        """A schema naming `df`'s columns and their kinds, with placeholders for every bound, level and
        continuous column's decimals (and for the target unless `target` names a column): see the module's
        docstring. A column's kind comes from its dtype alone: numeric (not boolean) is continuous,
        anything else categorical; `target` is drafted binary. `id_column`: a column that identifies rows,
        dropped before training (not a feature). `separator`: the CSV file's. No value of `df` is read or
        written into it."""
        from pandas.api.types import is_bool_dtype, is_numeric_dtype

        for role, column in (("target", target), ("id column", id_column)):
            if column is not None and column not in df.columns:
                raise ConfigError(f"{role} {column!r} is not a column of the DataFrame.")
        columns: dict[str, dict[str, Any]] = {}
        for column, dtype in df.dtypes.items():
            if column == id_column:
                continue
            if column == target:
                columns[str(column)] = {"type": "binary", "levels": LEVELS_PLACEHOLDER}
            elif is_numeric_dtype(dtype) and not is_bool_dtype(dtype):
                columns[str(column)] = {
                    "type": "continuous",
                    "bounds": BOUNDS_PLACEHOLDER,
                    "decimals": DECIMALS_PLACEHOLDER,
                }
            else:
                columns[str(column)] = {"type": "categorical", "levels": LEVELS_PLACEHOLDER}
        spec: dict[str, Any] = {"name": name, "version": 1}
        if separator != ",":
            spec["separator"] = separator
        spec.update({"columns": columns, "target": target or TARGET_PLACEHOLDER})
        if id_column is not None:
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
        """The YAML mapping; while placeholders are left, with comments saying how to fill them."""
        if not self.placeholders():
            return yaml.safe_dump(self._spec, sort_keys=False, allow_unicode=True)
        top = {key: value for key, value in self._spec.items() if key != "columns"}
        lines = [DRAFT_HEADER + yaml.safe_dump(top, sort_keys=False, allow_unicode=True) + "columns:"]
        for name, entry in self._spec["columns"].items():
            block = yaml.safe_dump({name: entry}, sort_keys=False, allow_unicode=True, width=10_000)
            if isinstance(entry, dict) and entry.get("type") == "continuous" and _is_placeholder(entry.get("bounds")):
                lines.extend(f"  # {line}" for line in textwrap.wrap(CODES_COMMENT, 100))
            lines.extend(f"  {line}" for line in block.splitlines())
        return "\n".join(lines) + "\n"

    def fill(
        self,
        column: str,
        *,
        bounds: tuple[float, float] | None = None,
        levels: list[Any] | tuple[Any, ...] | None = None,
        decimals: int | None = None,
        kind: str | None = None,
    ) -> Schema:
        """A copy with `column`'s public bounds and decimals (continuous) or levels (binary, categorical)
        set. `kind` ("continuous", "binary" or "categorical") changes the drafted kind (a numeric column of
        codes is categorical), dropping the keys of the other kind."""
        if column not in self._spec["columns"]:
            raise ConfigError(f"{column!r} is not a column of the schema.")
        spec = self.to_dict()
        entry = spec["columns"][column]
        if kind is not None:
            if kind not in ("continuous", "binary", "categorical"):
                raise ConfigError(f"kind {kind!r} is not one of continuous, binary or categorical.")
            entry["type"] = kind
            dropped = ("levels",) if kind == "continuous" else ("bounds", "decimals")
            for key in dropped:
                entry.pop(key, None)
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
            for key in FILLED_KEYS
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
