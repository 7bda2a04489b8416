"""Dataset schema: the declared, public description of a table (types, bounds, levels, target).

The schema is the only source of bounds and category levels: nothing here is inferred from rows.

A schema file is validated against `SchemaSpec` (pydantic) before a `DatasetSchema` is built: every
key typed, unknown keys refused (a typo such as `seperator:` is an error, not a silent default), the
rules between keys checked (a continuous column has bounds, a binary one two levels, the target is a
declared binary column), and every problem reported as one `ConfigError` paragraph with the key's
path (models/config_validation.py).

A column may also be documented (`label`, `description`, `unit`, and for a binary or categorical column
`meanings`: what each declared level stands for); these keys change no computation and render the
release bundle's data dictionary (tasks/data_dictionary.py). `release_separator` is the separator of
the bundle's CSV (',' by default), apart from `separator`, the input table's.
"""

from __future__ import annotations

import hashlib
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    PlainValidator,
    Strict,
    StrictStr,
    ValidationInfo,
    field_validator,
)

from dpsynth.models.config_validation import MAX_INT, STRICT, Name, one_line, validate
from dpsynth.models.errors import ConfigError

Kind = Literal["continuous", "binary", "categorical"]
KINDS = typing.get_args(Kind)


@dataclass(frozen=True)
class Column:
    name: str
    kind: str
    bounds: tuple[float, float] | None = None  # continuous only
    levels: tuple = ()  # binary (two) and categorical (two or more)
    decimals: int = 0  # continuous: digits kept when decoding
    unit: str = ""
    point_masses: tuple[float, ...] = ()  # continuous: public values that carry mass of their own (e.g. 0)
    label: str = ""  # a human name ("Age"); documentation only, like description and meanings
    description: str = ""
    meanings: tuple[tuple[object, str], ...] = ()  # binary/categorical: (level, what the code means), in level order

    @property
    def title(self) -> str:
        """The column's human name: its label, else its name."""
        return self.label or self.name

    def meaning(self, level: object) -> str:
        """What `level` stands for ("" when the schema does not say)."""
        return next((text for code, text in self.meanings if code == level), "")

    @property
    def is_continuous(self) -> bool:
        return self.kind == "continuous"

    @property
    def encoded_width(self) -> int:
        return len(self.levels) if self.kind == "categorical" else 1

    @property
    def continuous_bounds(self) -> tuple[float, float]:
        """(low, high) of a continuous column; a discrete column has none (ValueError)."""
        if self.bounds is None:
            raise ValueError(f"column {self.name!r} is {self.kind}: only a continuous column has bounds")
        return self.bounds


@dataclass(frozen=True)
class DatasetSchema:
    name: str
    version: int
    target: str
    columns: tuple[Column, ...]
    separator: str = ","  # the input table's CSV separator
    id_column: str | None = None
    description: str = ""
    release_separator: str = ","  # the separator of the bundle's synthetic.csv (tasks/bundle.py)
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
        try:
            text = path.read_text()
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"Schema file {str(path)!r} is not valid YAML: {one_line(exc)}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"Schema file {str(path)!r} is not UTF-8 text.") from None
        schema = cls.from_dict(raw, origin=f"schema {str(path)!r}")
        object.__setattr__(schema, "source_hash", hashlib.sha256(text.encode()).hexdigest())
        return schema

    @classmethod
    def from_dict(cls, raw: dict, origin: str = "schema") -> DatasetSchema:
        """The schema of plain YAML data; `origin` starts every error message (e.g. the file)."""
        spec = validate(SchemaSpec, raw, origin)
        columns = tuple(
            Column(
                name,
                c.type,
                bounds=c.bounds,
                levels=c.levels or (),
                decimals=c.decimals or 0,
                unit=c.unit,
                point_masses=tuple(c.point_masses or ()),
                label=c.label or "",
                description=c.description or "",
                meanings=_meanings_in_level_order(c),
            )
            for name, c in spec.columns.items()
        )
        return cls(
            name=spec.name,
            version=spec.version,
            target=spec.target,
            columns=columns,
            separator=spec.separator,
            id_column=spec.id_column,
            description=spec.description,
            release_separator=spec.release_separator,
        )


def _meanings_in_level_order(spec: ColumnSpec) -> tuple[tuple[object, str], ...]:
    meanings = spec.meanings or {}
    return tuple((level, str(meanings[level])) for level in spec.levels or () if level in meanings)


# ------------------------------------------------------------------------------------ validation
# What a schema file may say, key by key (models/config_validation.py turns problems into messages).

# Digits kept when decoding a continuous column: float64 holds about 15.
MAX_DECIMALS = 12


def _column_name(value: str) -> str:
    # Table headers are read stripped (tasks/table_io.py): a name with spaces around it never matches.
    if not value or value != value.strip():
        raise ValueError(f"{value!r} is not a usable column name: it must be non-empty, without spaces around it")
    return value


ColumnName = Annotated[StrictStr, AfterValidator(_column_name)]


def _level(value: object) -> int | float | str:
    # Pydantic turns only ValueError into a validation error (a TypeError would escape as a traceback).
    if isinstance(value, bool):
        raise ValueError(  # noqa: TRY004
            f"got {str(value).lower()}: YAML reads unquoted yes/no/true/false/on/off as true or false; "
            "quote the level to keep it as text"
        )
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"a level must be a finite number (got {value})")
        return value
    if isinstance(value, str):
        if not value or value != value.strip():
            raise ValueError(
                f"{value!r} is not a usable level: it must be non-empty, without spaces around it "
                "(table values are read stripped)"
            )
        return value
    raise ValueError(f"a level must be a number or a text value (got {_kind(value)})")


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, tuple):
        return repr(list(value))
    names: dict[type, str] = {list: "a list", dict: "a mapping"}
    return names.get(type(value), repr(value))


Level = Annotated[object, PlainValidator(_level)]


def _separator(value: str) -> str:
    if len(value) != 1 or value in '"\r\n' or value.isalnum():
        raise ValueError(f"must be one character such as ',', ';', '|' or a tab (got {value!r})")
    return value


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("must be non-empty text")
    return value.strip()


def _meaning(value: object) -> str:
    # A bare YAML no/yes reads as false/true: say so rather than print "Input should be a valid string".
    if isinstance(value, bool):
        raise ValueError(
            f"got {str(value).lower()}: YAML reads unquoted yes/no/true/false/on/off as true or false; "
            "quote the meaning to keep it as text"
        )
    if not isinstance(value, str):
        raise ValueError(f"a meaning is text (got {_kind(value)})")  # noqa: TRY004 (pydantic wants ValueError)
    return _text(value)


Text = Annotated[StrictStr, AfterValidator(_text)]
Meaning = Annotated[object, PlainValidator(_meaning)]


class ColumnSpec(BaseModel):
    model_config = STRICT
    type: Kind  # declared first: the checks below read it
    bounds: tuple[Annotated[float, Strict()], Annotated[float, Strict()]] | None = Field(None, validate_default=True)
    levels: tuple[Level, ...] | None = Field(None, validate_default=True)
    decimals: Annotated[int, Strict(), Field(ge=0, le=MAX_DECIMALS)] | None = None
    unit: StrictStr = ""
    # Public values of a continuous column that many rows hold exactly (a money column's 0): fidelity
    # scores and measured marginals give each its own cell, beside the bins of the bounds.
    point_masses: tuple[Annotated[float, Strict()], ...] | None = None
    # Documentation only (the data dictionary of a release bundle, tasks/data_dictionary.py): a human
    # name, a sentence, and for a binary or categorical column what each code means ({1: women}).
    label: Text | None = None
    description: Text | None = None
    meanings: dict[Level, Meaning] | None = None

    @field_validator("bounds")
    @classmethod
    def _bounds_for_continuous(
        cls, bounds: tuple[float, float] | None, info: ValidationInfo
    ) -> tuple[float, float] | None:
        kind = info.data.get("type")
        if kind == "continuous":
            if bounds is None:
                raise ValueError("a continuous column needs public 'bounds: [low, high]'")
            if not bounds[0] < bounds[1]:
                raise ValueError(f"must satisfy low < high (got [{bounds[0]:g}, {bounds[1]:g}])")
        elif bounds is not None and kind is not None:
            raise ValueError(f"only continuous columns take bounds; a {kind} column declares 'levels'")
        return bounds

    @field_validator("levels")
    @classmethod
    def _levels_for_discrete(cls, levels: tuple[object, ...] | None, info: ValidationInfo) -> tuple[object, ...] | None:
        kind = info.data.get("type")
        if kind == "continuous":
            if levels is not None:
                raise ValueError(
                    "only binary and categorical columns take levels; a continuous column declares 'bounds'"
                )
            return levels
        if kind is None:
            return levels
        if levels is None or len(levels) < 2 or len(set(levels)) != len(levels):
            raise ValueError(f"needs a list of at least two distinct 'levels' (got {_kind(levels)})")
        if kind == "binary" and len(levels) != 2:
            raise ValueError(f"a binary column has exactly two levels (got {len(levels)})")
        if len({isinstance(v, str) for v in levels}) > 1:
            # Validation compares table values with the levels by type: a mixed list never matches.
            raise ValueError(
                f"levels must be all numbers or all text (got {list(levels)}); quote the numbers to make them text"
            )
        return levels

    @field_validator("decimals")
    @classmethod
    def _decimals_for_continuous(cls, decimals: int | None, info: ValidationInfo) -> int | None:
        kind = info.data.get("type")
        if decimals is not None and kind not in (None, "continuous"):
            raise ValueError(f"only continuous columns take decimals (this one is {kind})")
        return decimals

    @field_validator("point_masses")
    @classmethod
    def _point_masses_within_bounds(
        cls, masses: tuple[float, ...] | None, info: ValidationInfo
    ) -> tuple[float, ...] | None:
        if masses is None:
            return masses
        kind, bounds = info.data.get("type"), info.data.get("bounds")
        if kind not in (None, "continuous"):
            raise ValueError(f"only continuous columns take point_masses (this one is {kind})")
        if len(set(masses)) != len(masses):
            raise ValueError(f"point masses must be distinct (got {list(masses)})")
        if bounds is not None and any(not (bounds[0] <= m <= bounds[1] and math.isfinite(m)) for m in masses):
            raise ValueError(
                f"every point mass must lie within the bounds [{bounds[0]:g}, {bounds[1]:g}] (got {list(masses)})"
            )
        return masses

    @field_validator("meanings")
    @classmethod
    def _meanings_of_declared_levels(
        cls, meanings: dict[object, str] | None, info: ValidationInfo
    ) -> dict[object, str] | None:
        if meanings is None:
            return meanings
        kind, levels = info.data.get("type"), info.data.get("levels")
        if kind == "continuous":
            raise ValueError("only binary and categorical columns take meanings (a continuous column has a 'unit')")
        if levels is None:  # the levels' own error is reported
            return meanings
        undeclared = [code for code in meanings if code not in levels]
        if undeclared:
            text_levels = isinstance(levels[0], str)
            hint = (
                "; a number and its quoted text are different levels"
                if any(isinstance(code, str) != text_levels for code in undeclared)
                else ""
            )
            raise ValueError(f"a meaning for an undeclared level: {undeclared} (the levels are {list(levels)}){hint}")
        return meanings


class SchemaSpec(BaseModel):
    model_config = STRICT
    name: Name
    version: Annotated[int, Strict(), Field(ge=1, le=MAX_INT)] = 1
    description: StrictStr = ""
    separator: Annotated[StrictStr, AfterValidator(_separator)] = ","
    # The separator of the release bundle's synthetic.csv; ',' unless a schema asks for another.
    release_separator: Annotated[StrictStr, AfterValidator(_separator)] = ","
    columns: Annotated[dict[ColumnName, ColumnSpec], Field(min_length=1)]  # before target and id_column
    target: ColumnName
    id_column: ColumnName | None = None

    @field_validator("target")
    @classmethod
    def _target_is_a_binary_column(cls, target: str, info: ValidationInfo) -> str:
        columns = info.data.get("columns")
        if columns is None:
            return target
        if target not in columns:
            raise ValueError(f"{target!r} is not a declared column")
        if columns[target].type != "binary":
            raise ValueError(f"target {target!r} must be a binary column (it is {columns[target].type})")
        return target

    @field_validator("id_column")
    @classmethod
    def _id_column_is_not_a_feature(cls, id_column: str | None, info: ValidationInfo) -> str | None:
        if id_column is not None and id_column in (info.data.get("columns") or {}):
            raise ValueError(f"id column {id_column!r} must not also be a feature column")
        return id_column
