"""Validation of configuration files with pydantic: shared field types, and errors as one `ConfigError`.

Profiles (models/config.py) and dataset schemas (models/data/schema.py) describe their keys as pydantic
models built on `STRICT` (unknown keys refused; no "5" for 5, no true for 1; no NaN or infinity).
`validate(model, raw, where)` checks plain YAML data against one and turns every problem it finds
into one paragraph that names the file and each bad key's dotted path, e.g.

    profile 'bad' (configs/profiles/bad.yaml): gan.checkpoint_every: must be at least 1 (got 0).

An unknown key says so and suggests the closest known key. Pydantic's own wording ("Input should be
...", documentation links) never reaches the user.
"""

from __future__ import annotations

import datetime
import difflib
import re
import types
import typing
from typing import TYPE_CHECKING, Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, StrictStr, ValidationError

from dpsynth.models.errors import ConfigError

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

M = typing.TypeVar("M", bound=BaseModel)

# Models opt in to strictness per field (Annotated[int, Strict()], StrictBool, ...) rather than
# model-wide, because strict mode would refuse YAML lists where a tuple is declared.
STRICT = ConfigDict(extra="forbid", strict=False, allow_inf_nan=False, frozen=True)
# Counts must fit the 32-bit integers torch and numpy seeds use.
MAX_INT = 2**31 - 1
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}")


def _name(value: str) -> str:
    if not NAME_PATTERN.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a usable name: up to 64 letters, digits, '_', '.', '+' or '-', "
            "starting with a letter, digit or '_' (names become folder names)"
        )
    return value


# A dataset's, a profile's or a setting's name: they make up run ids and folder names.
Name = Annotated[StrictStr, AfterValidator(_name)]

# Field types of the profile's keys (models/config.py and each generator's section, models/generators/).
# Layer widths must fit in memory.
MAX_UNITS = 16384
# Checkpoints go through the accountant and model selection one by one (the thesis has 40).
MAX_CHECKPOINTS = 10000
Count = Annotated[int, Strict(), Field(ge=1, le=MAX_INT)]
Units = Annotated[int, Strict(), Field(ge=1, le=MAX_UNITS)]
Positive = Annotated[float, Strict(), Field(gt=0)]
NonNegative = Annotated[float, Strict(), Field(ge=0)]
OpenUnit = Annotated[float, Strict(), Field(gt=0, lt=1)]  # a probability strictly inside (0, 1)
Unit = Annotated[float, Strict(), Field(ge=0, le=1)]
Hidden = Annotated[tuple[Units, ...], Field(min_length=1, max_length=16)]
Rate = Annotated[float, Strict(), Field(gt=0, le=1)]
Beta = Annotated[float, Strict(), Field(ge=0, lt=1)]


def checkpoints_fit(every: int, total: int | None, what: str) -> int:
    """`every` (a checkpoint interval) unless `total` steps would give more than MAX_CHECKPOINTS."""
    if total is None:  # the total itself is invalid and reported
        return every
    if total and total // every > MAX_CHECKPOINTS:
        raise ValueError(
            f"gives {total // every} checkpoints, at most {MAX_CHECKPOINTS} are allowed "
            f"(got {every} for {total} {what})"
        )
    return every


# Errors listed in one message: beyond this a file is malformed throughout and more lines do not help.
MAX_LISTED = 8
# An unknown key lists the known ones when they are few enough to read.
MAX_KNOWN_LISTED = 12
_SHOWN_CHARS = 60


def validate(model: type[M], raw: object, where: str) -> M:
    """`model` validated from `raw`, or a ConfigError naming `where` and every bad key."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(describe(exc, model, where)) from None


def one_line(exc: BaseException) -> str:
    """An exception's text on one line (YAML parse errors span several), for a one-paragraph message."""
    return " ".join(str(exc).split())


def describe(exc: ValidationError, model: type[BaseModel], where: str) -> str:
    """One paragraph: `where: path: problem; path: problem.`"""
    errors = _without_echoes(exc.errors(include_url=False))
    lines = [_line(error, model) for error in errors[:MAX_LISTED]]
    more = len(errors) - MAX_LISTED
    if more > 0:
        lines.append(f"and {more} more problem{'s' if more > 1 else ''}")
    return f"{where}: " + "; ".join(lines) + "."


def _without_echoes(errors: list[ErrorDetails]) -> list[ErrorDetails]:
    """Drop a list's length error when one of its items failed: the item is the problem to fix."""

    def echoes(error: ErrorDetails) -> bool:
        loc = tuple(error["loc"])
        return error["type"] in ("too_short", "too_long") and any(
            len(other["loc"]) > len(loc) and tuple(other["loc"][: len(loc)]) == loc for other in errors
        )

    return [e for e in errors if not echoes(e)]


def _line(error: ErrorDetails, model: type[BaseModel]) -> str:
    loc = tuple(error["loc"])
    if error["type"] == "invalid_key":  # a key that is not text (YAML `1:`)
        return _with_path(loc[:-1], f"key {_shown(loc[-1])}: keys must be text")
    if error["type"] == "missing" and loc and isinstance(loc[-1], int):  # a fixed-length list too short
        return _with_path(
            loc[:-1], _length_problem("too_short", {}, error.get("input"), _fixed_length(model, loc[:-1]))
        )
    if "[key]" in loc:  # a mapping's key itself is bad (e.g. a column name that is not a string)
        head = loc[: loc.index("[key]") - 1]
        return _with_path(head, f"key {_shown(loc[len(head)])}: {_problem(error, model, loc)}")
    if error["type"] == "missing":
        return _with_path(loc[:-1], f"missing required key {loc[-1]!r}")
    if error["type"] == "extra_forbidden":
        return _with_path(loc, _unknown_key(model, loc))
    return _with_path(loc, _problem(error, model, loc))


def _with_path(loc: tuple, text: str) -> str:
    path = dotted(loc)
    return f"{path}: {text}" if path else text


def dotted(loc: tuple) -> str:
    """('gan', 'betas', 0) -> 'gan.betas[0]'; a key that is empty or holds spaces, dots or control
    characters is quoted, so that the path stays on one line and readable."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        text = str(part)
        if not text or not text.isprintable() or any(c in text for c in " .[]'\""):
            text = repr(text)
        out += f".{text}" if out else text
    return out


def _problem(error: ErrorDetails, model: type[BaseModel], loc: tuple) -> str:
    kind, ctx, got = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "value_error":  # our own validators: their message is already the user's wording
        return str(ctx.get("error", error["msg"]))
    templates = {
        "int_type": "expected an integer",
        "int_from_float": "expected an integer",
        "int_parsing": "expected an integer",
        "float_type": "expected a number",
        "float_parsing": "expected a number",
        "bool_type": "expected true or false",
        "bool_parsing": "expected true or false",
        "string_type": "expected a text value",
        "dict_type": "expected a mapping of keys to values",
        "model_type": "expected a mapping of keys to values",
        "model_attributes_type": "expected a mapping of keys to values",
        "dataclass_type": "expected a mapping of keys to values",
        "list_type": "expected a list",
        "tuple_type": "expected a list",
        "finite_number": "must be a finite number",
        "string_too_short": "must not be empty",
    }
    if kind in templates:
        return f"{templates[kind]} (got {_shown(got)})"
    bounds = {
        "greater_than_equal": ("ge", "at least"),
        "greater_than": ("gt", "above"),
        "less_than_equal": ("le", "at most"),
        "less_than": ("lt", "below"),
    }
    if kind in bounds:
        key, words = bounds[kind]
        return f"must be {words} {_number(ctx[key])} (got {_shown(got)})"
    if kind == "literal_error":
        return f"{_shown(got)} is not one of {ctx['expected']}"
    if kind in ("too_short", "too_long"):
        return _length_problem(kind, ctx, got, _fixed_length(model, loc))
    return f"{error['msg']} (got {_shown(got)})"


def _length_problem(kind: str, ctx: dict, got: object, fixed: int | None) -> str:
    size = len(got) if isinstance(got, (list, tuple, dict, str)) else "?"
    if fixed is not None:
        wanted = f"exactly {fixed} values"
    elif kind == "too_long":
        wanted = f"at most {ctx.get('max_length')} values"
    else:
        low = ctx.get("min_length")
        wanted = f"at least {low} value{'s' if low != 1 else ''}"
    return f"expected {wanted} (got {size})"


def _fixed_length(model: type[BaseModel], loc: tuple) -> int | None:
    """The length of a fixed-length tuple field at `loc` (e.g. 3 for `split`), or None."""
    annotation: object = model
    for part in loc:
        annotation = _step(annotation, part)
        if annotation is None:
            return None
    inner = _unwrap(annotation)
    args = typing.get_args(inner)
    if typing.get_origin(inner) is tuple and args and Ellipsis not in args:
        return len(args)
    return None


def _unknown_key(model: type[BaseModel], loc: tuple) -> str:
    key = str(loc[-1])
    known = known_keys(model, loc[:-1])
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    if close:
        return f"unknown key (did you mean {close[0]!r}?)"
    if 0 < len(known) <= MAX_KNOWN_LISTED:
        return f"unknown key (known keys: {', '.join(sorted(known))})"
    return "unknown key"


def known_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the model found at `loc` inside `model` (through lists, tuples and mappings)."""
    annotation: object = model
    for part in loc:
        annotation = _step(annotation, part)
        if annotation is None:
            return []
    found = _model_in(annotation)
    return list(found.model_fields) if found else []


def _step(annotation: object, part: str | int) -> object:
    """The annotation one level down: a model's field by name, a list's or a mapping's values."""
    model = _model_in(annotation)
    if model is not None:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        return field.annotation if field else None
    inner = _unwrap(annotation)
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    if origin in (list, tuple) and args:
        return args[0]
    if origin is dict and len(args) == 2:
        return args[1]
    return None


def _unwrap(annotation: object) -> object:
    """Strip Annotated[...] and Optional[...] down to the one type they wrap."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            inner = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(inner) != 1:
                return annotation
            annotation = inner[0]
        else:
            return annotation


def _model_in(annotation: object) -> type[BaseModel] | None:
    inner = _unwrap(annotation)
    return inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None


def _number(value: object) -> str:
    """A range's limit as a person writes it: 1, not 1.0."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _shown(value: object) -> str:
    """A short, readable rendering of a YAML value for a message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (datetime.date, datetime.time)):  # YAML reads 2024-01-01 as a date
        return str(value)
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."
