"""Dataset schema: the declared, public description of a table (types, bounds, levels, target).

The schema is the only source of bounds and category levels: nothing here is inferred from rows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from models.errors import ConfigError

KINDS = ("continuous", "binary", "categorical")


@dataclass(frozen=True)
class Column:
    name: str
    kind: str
    bounds: tuple[float, float] | None = None  # continuous only
    levels: tuple = ()  # binary (two) and categorical (two or more)
    decimals: int = 0  # continuous: digits kept when decoding
    unit: str = ""

    @property
    def is_continuous(self) -> bool:
        return self.kind == "continuous"

    @property
    def encoded_width(self) -> int:
        return len(self.levels) if self.kind == "categorical" else 1


@dataclass(frozen=True)
class DatasetSchema:
    name: str
    version: int
    target: str
    columns: tuple[Column, ...]
    separator: str = ","
    id_column: str | None = None
    description: str = ""
    source_hash: str = field(default="", compare=False)

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def continuous(self) -> list[Column]:
        return [c for c in self.columns if c.kind == "continuous"]

    @property
    def discrete(self) -> list[Column]:
        return [c for c in self.columns if c.kind != "continuous"]

    @property
    def encoded_width(self) -> int:
        return sum(c.encoded_width for c in self.columns)

    @classmethod
    def from_yaml(cls, path: str | Path) -> DatasetSchema:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"Schema file {str(path)!r} does not exist.")
        text = path.read_text()
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"Schema file {str(path)!r} is not valid YAML: {exc}") from None
        schema = cls.from_dict(raw, origin=str(path))
        object.__setattr__(schema, "source_hash", hashlib.sha256(text.encode()).hexdigest())
        return schema

    @classmethod
    def from_dict(cls, raw: dict, origin: str = "schema") -> DatasetSchema:
        if not isinstance(raw, dict):
            raise ConfigError(f"{origin}: expected a mapping at the top level.")
        for key in ("name", "target", "columns"):
            if key not in raw:
                raise ConfigError(f"{origin}: missing required key {key!r}.")
        if not isinstance(raw["columns"], dict) or not raw["columns"]:
            raise ConfigError(f"{origin}: 'columns' must map column names to their declarations.")
        columns = tuple(_parse_column(name, spec, origin) for name, spec in raw["columns"].items())
        target = raw["target"]
        names = [c.name for c in columns]
        if target not in names:
            raise ConfigError(f"{origin}: target {target!r} is not a declared column.")
        if next(c for c in columns if c.name == target).kind != "binary":
            raise ConfigError(f"{origin}: target {target!r} must be a binary column.")
        id_column = raw.get("id_column")
        if id_column is not None and id_column in names:
            raise ConfigError(f"{origin}: id column {id_column!r} must not also be a feature column.")
        return cls(
            name=str(raw["name"]),
            version=int(raw.get("version", 1)),
            target=target,
            columns=columns,
            separator=str(raw.get("separator", ",")),
            id_column=id_column,
            description=str(raw.get("description", "")),
        )


def _parse_column(name: str, spec: dict, origin: str) -> Column:
    where = f"{origin}: column {name!r}"
    if not isinstance(spec, dict) or "type" not in spec:
        raise ConfigError(f"{where}: needs a mapping with a 'type'.")
    kind = spec["type"]
    if kind not in KINDS:
        raise ConfigError(f"{where}: type {kind!r} is not one of {', '.join(KINDS)}.")
    if kind == "continuous":
        bounds = spec.get("bounds")
        if not (isinstance(bounds, (list, tuple)) and len(bounds) == 2):
            raise ConfigError(f"{where}: a continuous column needs public 'bounds: [low, high]'.")
        low, high = float(bounds[0]), float(bounds[1])
        if not low < high:
            raise ConfigError(f"{where}: bounds must satisfy low < high.")
        return Column(name, kind, bounds=(low, high), decimals=int(spec.get("decimals", 0)),
                      unit=str(spec.get("unit", "")))
    levels = spec.get("levels")
    if not isinstance(levels, (list, tuple)) or len(levels) < 2 or len(set(levels)) != len(levels):
        raise ConfigError(f"{where}: needs a list of at least two distinct 'levels'.")
    if kind == "binary" and len(levels) != 2:
        raise ConfigError(f"{where}: a binary column has exactly two levels.")
    return Column(name, kind, levels=tuple(levels))
