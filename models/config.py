"""Run profiles: every tunable of a run, loaded from YAML once and validated at the edge.

A profile lives in `configs/profiles/NAME.yaml`; `extends: OTHER` starts from another profile and
overrides only the keys it names (nested mappings merge). The frozen dataclasses below are what the
code uses (and hold the defaults) for the keys every profile has; each registered generator
(models/generator_registry.py) adds its own section, the one pydantic model that holds its keys'
defaults and rules (e.g. `gan`, GS-WGAN's). The pydantic models at the end (`profile_spec()` and its
parts) say what each key may hold: its type, range or choices, plus the rules that tie keys together.
A profile file is validated against them before any dataclass is built, and a profile built in code is
checked against them too. Unknown keys are errors, so a typo never silently falls back to a default;
every problem becomes one `ConfigError` paragraph with the key's path (models/config_validation.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    Strict,
    StrictBool,
    StrictStr,
    create_model,
    field_validator,
    model_validator,
)

from dpsynth.models.config_validation import (
    MAX_INT,
    STRICT,
    Beta,
    Count,
    Name,
    NonNegative,
    OpenUnit,
    Positive,
    Unit,
    one_line,
    validate,
)
from dpsynth.models.errors import ConfigError
from dpsynth.models.generator_registry import (
    DEFAULT_GENERATOR,
    Registration,
    names,
    registration,
    registrations,
)


@dataclass(frozen=True)
class MarginalsConfig:
    """Measured marginals (models/marginals/measure.py, models/marginals/release.py): every column's 1-way
    marginal, every column with the target, and `selections` privately chosen pairs, measured on the
    training rows by the Gaussian mechanism; every released row is then calibrated to them
    (models/marginals/calibration.py). Their cost is `rho`, the whole measurement's zCDP under replace-one (its
    RDP is alpha x rho), added order by order to training's RDP: a total rather than a per-marginal noise
    multiplier, so that the cost is known from the profile alone, whatever the table's width (the
    noise multiplier per marginal follows from the schema: sqrt(marginals / (2 rho (1 - share)))."""

    enabled: bool = False
    rho: float = 0.05
    selections: int = 0
    # Share of rho spent on choosing the `selections` pairs (exponential mechanism), the rest measures.
    selection_share: float = 0.1
    bins: int = 20
    # Share of rho spent on every continuous column's fine 1-way histogram (dpsynth.models.marginals.shapes):
    # the calibration places every value inside its cell as the column's rows lie there. 0: uniform.
    shape_share: float = 0.2
    # The sampler draws this many times the rows asked for and calibrates down to them (fewer duplicates).
    oversample: int = 3


@dataclass(frozen=True)
class Setting:
    """One privacy setting. For GS-WGAN, gamma = 1/K discriminators. `private: false` is the thesis'
    non-private baseline. `generator` and `epsilon_budget`, when given, override the profile's for this
    setting (a comparison lists several generators and budgets side by side)."""

    name: str
    discriminators: int | None = None
    private: bool = True
    generator: str | None = None
    epsilon_budget: float | None = None


@dataclass(frozen=True)
class PrivacyConfig:
    noise_multiplier: float = 1.07
    clip: float = 1.0
    delta: float = 1e-5
    # The release's epsilon, max(training, choice) (models/privacy/release_choice.py), is at most this: training
    # stops at the last checkpoint within it; null means no budget.
    epsilon_budget: float | None = None
    # The DP choice of the released checkpoint on the real validation rows (exponential mechanism) and,
    # when `evaluation.min_release_auc` is set, the DP publish/refuse decision (noisy threshold). They
    # read validation rows only, disjoint from the training rows, so the release costs the larger of
    # training's epsilon and their sum: a choice epsilon under training's is free.
    choice_epsilon: float = 1.0
    approval_epsilon: float = 0.1
    # Every release of the same table (schema name) adds to its rows' privacy loss: a release whose
    # planned cost would take the table's lifetime spending, composed over its releases in the privacy
    # ledger (tasks/ledger.py), past this is refused before any work. null: no lifetime limit (the
    # ledger still records every release).
    lifetime_budget: float | None = None
    # How long a schedule of this profile runs: at most this many counted releases of the table with this
    # profile, and none after this date (ISO, UTC). A deployed schedule that the lifetime budget would
    # stop within 12 runs is refused unless one of them says where it ends (tasks/schedule_check.py).
    planned_releases: int | None = None
    releases_until: str | None = None


@dataclass(frozen=True)
class InputConfig:
    """What the steward accepts of the input table. Values missing or outside a column's public bounds
    are imputed (models/data/preprocessing.py); `max_repaired_share`, when set, refuses at validation,
    before any work, a table in which some column has more than this share of its values to impute. A
    fact of the rows that epsilon does not cover, as validation itself (models/privacy/statement.py)."""

    max_repaired_share: float | None = None


@dataclass(frozen=True)
class EvaluationConfig:
    """Algorithm 3's model selection and the checkpoint choice."""

    synthetic_fraction: float = 0.9
    n_regularisation_values: int = 20
    penalties: tuple[str, ...] = ("l1", "l2")
    # A checkpoint is "as good as the best" when its validation-selected AUC is within this of the best.
    auc_tolerance: float = 0.01
    # Real-vs-real baseline runs with fresh splits, one per checkpoint index (thesis: 41).
    real_baseline: bool = True
    quality_rows: int = 20000
    # Approval: a release whose chosen checkpoint's selection AUC (real validation rows under the honest
    # protocol) is below this registers and publishes nothing. null approves any checkpoint.
    min_release_auc: float | None = None
    # Prefer checkpoints whose synthetic rows hold every level of every discrete column
    # (dpsynth.models.evaluation.choice).
    complete_levels: bool = True
    # The experiment's (non-private, internal) choice per setting prefers checkpoints whose level shares
    # are all within this of the real validation rows'; null turns the preference off.
    max_level_share_gap: float | None = 0.15
    # The release's DP choice scores a checkpoint by its AUC on real validation rows minus this weight
    # times its largest level-share gap to them (models/privacy/release_choice.py).
    share_gap_weight: float = 1.0
    # How the experiment picks each setting's checkpoint: "internal", by AUC on real rows (the thesis'
    # study; nothing is published); "dp", with the release's DP choice on validation rows, so each
    # setting shows what a release would publish at its whole-release epsilon (comparisons).
    experiment_choice: str = "internal"


class GeneratorSections(Mapping):
    """A profile's generator sections by key (`gan`, `dpcgan`, ...): read-only and hashable, as the
    frozen profile that holds them."""

    def __init__(self, sections: Mapping[str, Any] | None = None):
        self._sections = dict(sections or {})

    def __getitem__(self, key: str):
        return self._sections[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sections)

    def __len__(self) -> int:
        return len(self._sections)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._sections.items(), key=lambda item: item[0])))

    def __repr__(self) -> str:
        return f"GeneratorSections({self._sections!r})"


@dataclass(frozen=True)
class _ProfileKeys:
    """The keys of every profile, and its generators' sections (`Profile` reads and builds them)."""

    name: str
    seed: int = 0
    # "honest": test rows never reach preprocessing or the GAN; "thesis": the GAN trains on every row.
    protocol: str = "honest"
    split: tuple[float, float, float] = (0.8, 0.1, 0.1)
    knn_neighbors: int = 3
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    settings: tuple[Setting, ...] = (Setting("k1000", 1000),)
    # The setting a release trains: by name, or the only setting when the profile lists one.
    release_setting: str | None = None
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    input: InputConfig = field(default_factory=InputConfig)
    device: str = "auto"
    # Registered model name; null gives "<dataset>-<generator>".
    model_name: str | None = None
    # The generator type of every setting that does not name its own (models/generator_registry.py):
    # each owns its section in `sections`.
    generator: str = DEFAULT_GENERATOR
    marginals: MarginalsConfig = field(default_factory=MarginalsConfig)
    # Rows released in the bundle: a public number fixed in advance. Never the table's own row count,
    # which epsilon does not cover (the bundle would publish it exactly).
    release_rows: int = 50000
    # Upper bound on rows used to train (smoke profiles subsample the table to stay fast).
    max_rows: int | None = None
    # Worker processes for the experiment's fan-out on one machine.
    workers: int = 2
    # Optional Dask scheduler address: the experiment's tasks then run on that cluster.
    dask_address: str | None = None
    # A trial profile never publishes: `release` runs every stage (training, selection, the DP choice,
    # the internal report) and registers nothing, writes no bundle, moves no alias and enters nothing
    # in the table's privacy ledger (as `dpsynth release --no-publish` does with any profile).
    trial: bool = False
    # Every registered generator's section by its key (`gan` is GS-WGAN's, with privacy.noise_multiplier
    # and privacy.clip), each its generator's pydantic model; a section not given takes its defaults.
    sections: GeneratorSections = field(default_factory=GeneratorSections)

    def __post_init__(self) -> None:
        # Profiles built in code obey the same rules as profiles read from YAML (profile_spec() below).
        # The profile keeps the validated sections: every registered one, defaults filled in.
        spec = validate(profile_spec(), self.to_dict(), where=f"profile {self.name!r}")
        object.__setattr__(
            self, "sections", GeneratorSections({r.section: getattr(spec, r.section) for r in registrations()})
        )

    def to_dict(self) -> dict:
        """Every key as plain data, each generator section under its key (as a profile file has them)."""
        keys = {name: _plain(getattr(self, name)) for name in _KEYS}
        return {**keys, **{key: section.model_dump() for key, section in self.sections.items()}}


_KEYS = tuple(f.name for f in dataclasses.fields(_ProfileKeys) if f.name != "sections")


def _plain(value):
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


class Profile(_ProfileKeys):
    """A run profile. A generator's section is an attribute named by its key (`profile.gan`,
    `profile.dpcgan`), and a keyword of the constructor and of `dataclasses.replace`
    (`Profile(name="p", gan=GanConfig(iterations=6))`)."""

    def __init__(self, *, sections: Mapping[str, Any] | None = None, **keys: Any) -> None:
        given = {key: keys.pop(key) for key in list(keys) if key not in _KEYS}
        super().__init__(sections=GeneratorSections({**(sections or {}), **given}), **keys)

    def __getattr__(self, key: str):
        # Only reached for names that are not fields: a generator section's key.
        if key.startswith("__") or key == "sections":
            raise AttributeError(key)
        try:
            return self.sections[key]
        except KeyError:
            raise AttributeError(f"profile has no key or generator section {key!r}") from None

    def section(self, generator: str):
        """The section of the generator registered as `generator` (e.g. "gswgan": `gan`)."""
        return self.sections[registration(generator).section]

    def release_target(self) -> Setting:
        if self.release_setting is not None:
            for s in self.settings:
                if s.name == self.release_setting:
                    return s
            raise ConfigError(f"profile {self.name!r}: release_setting {self.release_setting!r} is not a setting.")
        if len(self.settings) != 1:
            raise ConfigError(
                f"profile {self.name!r} lists {len(self.settings)} settings: name the one a "
                "release trains with `release_setting`."
            )
        return self.settings[0]

    def generator_of(self, setting: Setting) -> str:
        return setting.generator or self.generator

    def budget_for(self, setting: Setting) -> float | None:
        """The setting's whole-release epsilon budget: its own, else the profile's."""
        return setting.epsilon_budget if setting.epsilon_budget is not None else self.privacy.epsilon_budget

    def with_generator(self, generator: str) -> Profile:
        """Every private setting on `generator` (the command line's --generator). A non-private setting
        (the thesis' baseline: GS-WGAN without clipping or noise) stays as it is: the DP-SGD generators
        train only privately."""
        if generator not in names():
            raise ConfigError(f"--generator {generator!r} is not a generator: choose one of {', '.join(names())}.")
        settings = tuple(
            dataclasses.replace(s, generator=None)
            if s.private
            else dataclasses.replace(s, generator=self.generator_of(s))
            for s in self.settings
        )
        return dataclasses.replace(self, generator=generator, settings=settings)

    @property
    def config_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    def with_settings(self, *settings: Setting) -> Profile:
        return dataclasses.replace(self, settings=tuple(settings))


def shipped_profiles_folder() -> Path:
    """The profiles installed with the package (`dpsynth.configs`' `profiles/`, also under a plain
    `pip install .`): where a profile name not found beside the schema is looked up."""
    import dpsynth.configs

    return Path(dpsynth.configs.__file__).resolve().parent / "profiles"


def profile_path(profile: str, config_path: str | Path | None = None) -> Path:
    """A profile is a path to a YAML file, or a name: looked up in `profiles/` beside the schema first (a
    steward's own profiles), then among the shipped ones. An unknown name gives the path beside the schema
    (which does not exist: the caller's error names it)."""
    candidate = Path(profile)
    if candidate.suffix in (".yaml", ".yml"):
        return candidate
    base = Path(config_path).resolve().parent if config_path else Path("configs")
    beside = base / "profiles" / f"{profile}.yaml"
    shipped = shipped_profiles_folder() / f"{profile}.yaml"
    return shipped if not beside.is_file() and shipped.is_file() else beside


# A profile file may say which table its values were tuned on (`tuned_for: cardio`). It describes that
# file only (not inherited through `extends`, not part of the run's configuration or its hash).
TUNED_FOR = "tuned_for"


# `smoke_sizing: true`: the profile starts from each generator's smoke sizing (SectionConfig.smoke), not its
# defaults. `settings_for_every_generator`: setting templates repeated for every registered generator.
# Both are read by the loader only, not part of the run's configuration: `smoke_sizing` is inherited through
# `extends`; the templates expand in their own file, whose settings a profile extending it inherits or replaces.
SMOKE_SIZING = "smoke_sizing"
EVERY_GENERATOR = "settings_for_every_generator"


def profile_tuned_for(path: Path) -> str | None:
    """The table a profile file says it was tuned on (`tuned_for`), or None for a generic profile."""
    return _tuned_for(_read_mapping(path), path)


def _tuned_for(raw: dict, path: Path) -> str | None:
    value = raw.get(TUNED_FOR)
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"Profile file {str(path)!r}: {TUNED_FOR}: expected a table's name (got {value!r}).")
    return value


def load_profile(profile: str, config_path: str | Path | None = None) -> Profile:
    path = profile_path(profile, config_path)
    raw = _load_raw(path, seen=())
    raw.setdefault("name", Path(profile).stem)
    where = f"profile {Path(profile).stem!r} ({path})"
    # Defaults come from the dataclasses (one place): the file's keys are merged over them, so unknown
    # keys still reach validation and are refused there. A smoke-sized profile starts from each
    # generator's own smoke sizing (SectionConfig.smoke) instead, its own keys still over it.
    defaults = Profile(name="defaults").to_dict()
    if _flag(raw.pop(SMOKE_SIZING, False), SMOKE_SIZING, path):
        defaults = _merge(defaults, {r.section: dict(r.config_model().smoke) for r in registrations()})
    spec = validate(profile_spec(), _merge(defaults, raw), where)
    return _build(spec)


def _flag(value: Any, key: str, path: Path) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"Profile file {str(path)!r}: {key}: expected true or false (got {value!r}).")
    return value


def _settings_for_every_generator(raw: dict, path: Path) -> None:
    """Adds to the file's `settings`, for each registered generator, one setting per template of
    `settings_for_every_generator`, named `<generator>-<template's name>`: a generator is compared without
    an edit to the profile. A setting the file lists by that name is kept instead (a tuned one, e.g.
    GS-WGAN's K), where the file lists it."""
    templates = raw.pop(EVERY_GENERATOR, None)
    if templates is None:
        return
    where = f"Profile file {str(path)!r}: {EVERY_GENERATOR}"
    if not isinstance(templates, list) or not templates:
        raise ConfigError(f"{where}: expected a list of settings, each with a name (got {_yaml_kind(templates)}).")
    listed = raw.get("settings") or []
    if not isinstance(listed, list):
        raise ConfigError(f"Profile file {str(path)!r}: settings: expected a list (got {_yaml_kind(listed)}).")
    named = {s.get("name") for s in listed if isinstance(s, dict)}
    added = []
    for generator in names():
        for template in templates:
            if not isinstance(template, dict) or not isinstance(template.get("name"), str):
                raise ConfigError(f"{where}: each entry is a mapping with a name (got {template!r}).")
            if "generator" in template:
                raise ConfigError(f"{where}: {template['name']!r} names a generator: every registered one is set.")
            name = f"{generator}-{template['name']}"
            if name not in named:
                added.append({**template, "name": name, "generator": generator})
    raw["settings"] = [*listed, *added]


def _build(spec: BaseModel) -> Profile:
    values = {key: value for key, value in spec.model_dump().items() if key in _KEYS}
    return Profile(
        **{
            **values,
            "privacy": PrivacyConfig(**values["privacy"]),
            "evaluation": EvaluationConfig(**values["evaluation"]),
            "input": InputConfig(**values["input"]),
            "marginals": MarginalsConfig(**values["marginals"]),
            "settings": tuple(Setting(**s) for s in values["settings"]),
        },
        sections={r.section: getattr(spec, r.section) for r in registrations()},
    )


def _read_mapping(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"Profile file {str(path)!r} does not exist.")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"Profile file {str(path)!r} is not valid YAML: {one_line(exc)}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"Profile file {str(path)!r} is not UTF-8 text.") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"Profile file {str(path)!r} must hold a mapping of keys to values, not {_yaml_kind(raw)}.")
    return raw


def _load_raw(path: Path, seen: tuple[Path, ...]) -> dict:
    if path in seen:
        raise ConfigError(f"Profile {str(path)!r} extends itself.")
    raw = _read_mapping(path)
    _tuned_for(raw, path)  # checked here too, so a bad value is refused whichever command reads it
    raw.pop(TUNED_FOR, None)
    # Expanded in the file that says it: a profile that extends it inherits the settings, or lists its own.
    _settings_for_every_generator(raw, path)
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str) or not parent or "/" in parent or "\\" in parent:
        raise ConfigError(
            f"Profile file {str(path)!r}: extends: expected the name of a profile beside it (got {parent!r})."
        )
    # Beside it first, then the shipped one: a steward's own profile may extend a shipped one.
    base_path = path.parent / f"{parent}.yaml"
    if not base_path.is_file() and (shipped_profiles_folder() / f"{parent}.yaml").is_file():
        base_path = shipped_profiles_folder() / f"{parent}.yaml"
    base = _load_raw(base_path, seen + (path,))
    base.pop("name", None)
    return _merge(base, raw)


def _yaml_kind(value) -> str:
    kinds: dict[type, str] = {list: "a list", str: "a text value"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def _merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# ------------------------------------------------------------------------------------ validation
# What a profile may say, key by key. Defaults live in the dataclasses above (and in each generator's
# section model), so every shared field here is required; `load_profile` fills in the defaults before
# validating. Ints and floats are strict (no "5" for 5, no true for 1); NaN and infinity are refused.

DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def _device(value: str) -> str:
    if not DEVICE_PATTERN.fullmatch(value):
        raise ValueError(f"{value!r} is not a device: auto, cpu, cuda, cuda:N or mps")
    return value


def _registered(value: str) -> str:
    known = names()
    if value not in known:
        listed = ", ".join(repr(n) for n in known[:-1]) + f" or {known[-1]!r}" if len(known) > 1 else repr(known[0])
        raise ValueError(f"{value!r} is not one of {listed}")
    return value


# A registered generator's name (models/generator_registry.py).
GeneratorName = Annotated[StrictStr, AfterValidator(_registered)]


class SettingSpec(BaseModel):
    model_config = STRICT
    # Setting's defaults: settings are listed, not merged over defaults.
    name: Name
    discriminators: Count | None = None
    private: StrictBool = True
    generator: GeneratorName | None = None
    epsilon_budget: Positive | None = None


class MarginalsSpec(BaseModel):
    model_config = STRICT
    enabled: StrictBool
    rho: Positive  # zero noise (rho infinite) is refused: allow_inf_nan is off
    selections: Annotated[int, Strict(), Field(ge=0, le=1000)]
    selection_share: OpenUnit
    bins: Annotated[int, Strict(), Field(ge=1, le=1000)]
    shape_share: Beta
    oversample: Annotated[int, Strict(), Field(ge=1, le=100)]


class PrivacySpec(BaseModel):
    model_config = STRICT
    noise_multiplier: Positive
    clip: Positive
    delta: OpenUnit
    epsilon_budget: Positive | None
    choice_epsilon: Positive
    approval_epsilon: Positive
    lifetime_budget: Positive | None
    planned_releases: Count | None
    releases_until: StrictStr | None

    @field_validator("releases_until", mode="before")
    @classmethod
    def _an_iso_date(cls, value):
        # YAML reads 2027-06-30 as a date; the profile keeps its ISO text (it is hashed as JSON).
        if isinstance(value, datetime.date):
            return value.isoformat()
        if isinstance(value, str):
            try:
                return datetime.date.fromisoformat(value).isoformat()
            except ValueError:
                raise ValueError(f"must be a date such as 2027-06-30 (got {value!r})") from None
        return value


class EvaluationSpec(BaseModel):
    model_config = STRICT
    synthetic_fraction: OpenUnit
    n_regularisation_values: Count
    penalties: Annotated[tuple[Literal["l1", "l2"], ...], Field(min_length=1)]
    auc_tolerance: Unit
    real_baseline: StrictBool
    quality_rows: Count
    min_release_auc: Unit | None
    complete_levels: StrictBool
    max_level_share_gap: Unit | None
    share_gap_weight: NonNegative
    experiment_choice: Literal["internal", "dp"]


class InputSpec(BaseModel):
    model_config = STRICT
    max_repaired_share: Unit | None


class ProfileKeysSpec(BaseModel):
    """The keys of every profile; `profile_spec()` adds one section per registered generator."""

    model_config = STRICT
    name: Name
    seed: Annotated[int, Strict(), Field(ge=0, le=MAX_INT)]
    protocol: Literal["honest", "thesis"]
    split: tuple[OpenUnit, OpenUnit, OpenUnit]
    knn_neighbors: Count
    privacy: PrivacySpec
    settings: Annotated[tuple[SettingSpec, ...], Field(min_length=1)]
    release_setting: Name | None
    evaluation: EvaluationSpec
    input: InputSpec
    device: Annotated[StrictStr, AfterValidator(_device)]
    model_name: Annotated[StrictStr, Field(min_length=1)] | None
    release_rows: Count  # a public number: never the table's own size (models/privacy/statement.py)
    max_rows: Count | None
    workers: Annotated[int, Strict(), Field(ge=1, le=1024)]
    dask_address: Annotated[StrictStr, Field(min_length=1)] | None
    trial: StrictBool
    generator: GeneratorName
    marginals: MarginalsSpec

    @field_validator("split")
    @classmethod
    def _split_sums_to_one(cls, split: tuple[float, float, float]) -> tuple[float, float, float]:
        if abs(sum(split) - 1.0) > 1e-9:
            raise ValueError(
                f"the train, validation and test fractions must sum to 1 (got {list(split)}, sum {sum(split):g})"
            )
        return split

    @field_validator("settings")
    @classmethod
    def _unique_setting_names(cls, settings: tuple[SettingSpec, ...]) -> tuple[SettingSpec, ...]:
        names = [s.name for s in settings]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"setting names must be unique (repeated: {', '.join(repeated)})")
        if "real" in names:
            raise ValueError("'real' is reserved for the real-data baseline: name the setting otherwise")
        return settings

    @model_validator(mode="after")
    def _settings_suit_their_generators(self) -> ProfileKeysSpec:
        # Each generator's section model says which settings it cannot train (e.g. GS-WGAN without K).
        problems: dict[str, list[str]] = {}
        for s in self.settings:
            problem = registration(s.generator or self.generator).config_model().setting_problem(s)
            if problem is not None:
                problems.setdefault(problem, []).append(s.name)
        if problems:
            raise ValueError(
                "; ".join(f"settings {', '.join(settings)}: {problem}" for problem, settings in problems.items())
            )
        return self


def profile_spec() -> type[BaseModel]:
    """The model a profile is validated against: the shared keys, and one section per registered
    generator (its own pydantic model, defaults included)."""
    return _profile_spec(registrations())


@functools.lru_cache(maxsize=8)
def _profile_spec(found: tuple[Registration, ...]) -> type[BaseModel]:
    sections: dict[str, Any] = {r.section: (r.config_model(), r.config_model()()) for r in found}
    return create_model("ProfileSpec", __base__=ProfileKeysSpec, **sections)
