"""Run profiles: every tunable of a run, loaded from YAML once and validated at the edge.

A profile lives in `configs/profiles/NAME.yaml`; `extends: OTHER` starts from another profile and
overrides only the keys it names (nested mappings merge). The frozen dataclasses below are what the
code uses (and hold the defaults); the pydantic models at the end (`ProfileSpec` and its parts) say
what each key may hold: its type, range or choices, plus the rules that tie keys together. A profile
file is validated against them before any dataclass is built, and a profile built in code is checked
against them too. Unknown keys are errors, so a typo never silently falls back to a default; every
problem becomes one `ConfigError` paragraph with the key's path (models/config_validation.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    Strict,
    StrictBool,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dpsynth.models.config_validation import MAX_INT, STRICT, Name, one_line, validate
from dpsynth.models.errors import ConfigError


@dataclass(frozen=True)
class GanConfig:
    """Networks and optimisation (thesis section 4.4 and 6.1)."""

    z_dim: int = 32
    generator_hidden: tuple[int, ...] = (128, 256)
    critic_hidden: int = 128
    # The thesis' critics use BatchNorm; it mixes rows inside the gradient penalty, so it is an option.
    critic_batchnorm: bool = False
    # "thesis": weights ~ N(0, 1) as the thesis text says; "default": PyTorch's scaled initialisation.
    init: str = "default"
    lr_generator: float = 1e-4
    lr_critic: float = 1e-4
    betas: tuple[float, float] = (0.0, 0.9)
    critic_steps: int = 5
    # How a generator step draws the critics it queries, the mechanism the accountant composes
    # (models/privacy/accountant.py): "per_row", every sanitised row its own critic, independently (T x B
    # queries at sigma); "per_step", one critic for all B rows (the thesis' Algorithm 2: T queries at
    # sigma / sqrt(B), epsilon in the hundreds; for reproducing the thesis only, `release` refuses it).
    critic_draw: str = "per_row"
    # Critic updates each critic drawn in a training step gets before it is queried; null keeps
    # `critic_steps` (thesis: 5). Free in privacy terms (critics are never released, and the refresh
    # schedule depends on no row: `critic_refresh`) and the main lever against stale critics at large K.
    critic_refresh_steps: int | None = None
    # Which critics a training step refreshes (dpsynth.models.generators.gswgan.trainer.GeneratorTrainer.draw_refreshed):
    # "independent", as many critics as the step queries, drawn from a secret stream of their own,
    # independent of the query draws, so no critic's state records which critics past rows queried (the
    # premise of the T x B composition: docs/privacy.md section 1); "drawn", the critics the step
    # queries (official GS-WGAN, the thesis), for reproduction only: `release` refuses it.
    critic_refresh: str = "independent"
    gp_lambda: float = 10.0
    batch_size: int = 32
    pretrain_iterations: int = 2000
    # Precision of the throwaway generators' matrix products in pretraining, forward and backward
    # (dpsynth.models.generators.gswgan.trainer.pretrain_matmul_dtype): "float32"; "bfloat16" (float32 accumulation, mixed precision
    # as autocast); "auto": bfloat16 on a CPU that computes it natively (AVX512-BF16/AMX), float32
    # elsewhere. BatchNorm, the critics and Adam stay float32; training and the released generator too.
    pretrain_matmul: str = "auto"
    # Two CPU inner loops in C (dpsynth.models.native.kernels): the critic updates (all r of a visit in one call,
    # pretraining and training) and BatchNorm + ReLU of pretraining's bfloat16 products. "torch": the
    # tensor code; "native": the C kernels, built with the system's C compiler on first use (an error if
    # none builds them); "auto": the C kernels where they build and apply (CPU, critics without
    # BatchNorm), the tensor code elsewhere. Same formulas; results differ by float32 rounding.
    kernels: str = "auto"
    iterations: int = 40000
    checkpoint_every: int = 1000
    # Exponential moving average of G (official GS-WGAN: 0.999); null keeps the raw generator.
    generator_ema: float | None = None
    # "tanh": one Tanh head for every encoded column (thesis); "typed": Tanh for continuous and
    # binary columns, a softmax mapped to [-1, 1] over each one-hot group; "gumbel": relaxed samples
    # for binary columns and one-hot groups (CTGAN's Gumbel-softmax; dpsynth.models.generators.networks.apply_head).
    output_head: str = "tanh"
    # Condition G and the critics' fake rows on the (binary) target, as official GS-WGAN conditions on
    # the class label: G takes z and a label drawn with probability `target_prior` of the target's
    # second level, and copies it into the target column. The prior is a public design choice (GS-WGAN:
    # uniform labels), never measured on the rows; the target share of the output is fixed by it.
    condition_on_target: bool = False
    target_prior: float = 0.5


GENERATORS = ("gswgan", "dpcgan", "dpautogan")


@dataclass(frozen=True)
class DPCGANSection:
    """DP-CGAN's own keys (models/generators/dpcgan/adapter.py): the paper's clipping norm, the
    discriminator's per-row Poisson rate q (public: the expected batch is q times the training rows),
    a noise multiplier and step count that reach epsilon 1 to 3 on a table of tens of thousands of rows.
    Delta, the budget and the DP choice are the shared privacy keys."""

    sample_rate: float = 0.002
    clip: float = 1.1
    noise_multiplier: float = 2.0
    iterations: int = 8000
    checkpoint_every: int = 400
    z_dim: int = 32
    generator_hidden: tuple[int, ...] = (128, 128)
    discriminator_hidden: tuple[int, ...] = (128,)
    head: str = "gumbel"
    discriminator_optimizer: str = "adam"
    lr_discriminator: float = 2e-4
    lr_generator: float = 2e-4
    betas: tuple[float, float] = (0.5, 0.999)
    # Public share of target label 1 among generated rows (the paper's prior p_l), never measured.
    label_prior: float = 0.5


@dataclass(frozen=True)
class DPAutoGANSection:
    """DP-auto-GAN's own keys (models/generators/dpautogan/adapter.py): the autoencoder phase, then
    the WGAN phase whose critic is DP-SGD. Clipping norms follow the paper's ADULT run's scale."""

    autoencoder_rate: float = 0.002
    autoencoder_clip: float = 0.1
    autoencoder_noise: float = 2.0
    autoencoder_steps: int = 1500
    critic_rate: float = 0.002
    critic_clip: float = 0.1
    critic_noise: float = 2.0
    critic_steps: int = 5
    generator_steps: int = 4000
    generator_batch: int = 128
    checkpoint_every: int = 250
    latent_dim: int = 12
    z_dim: int = 32
    encoder_hidden: tuple[int, ...] = (64,)
    decoder_hidden: tuple[int, ...] = (64,)
    generator_hidden: tuple[int, ...] = (64, 64)
    critic_hidden: tuple[int, ...] = (64, 32)
    critic_space: str = "data"
    head: str = "typed"
    level_decoding: str = "sample"
    # Weights of the continuous columns and of the target in the autoencoder's reconstruction loss
    # (every other encoded column weighs 1; 1 and 1 is the paper's plain sum).
    continuous_weight: float = 1.0
    target_weight: float = 1.0
    # Phase 2: "gan" (the paper) or "gaussian" (one Gaussian-mechanism fit of the latents; the GAN keys
    # are then unused) with noise multiplier `latent_noise`.
    latent_model: str = "gan"
    latent_noise: float = 20.0
    # With the Gaussian latent model: the noise multiplier of one more query, the training rows' first
    # and second moments on the continuous columns and the binary target, which the Gaussian is then
    # fitted to through the decoder (`moment_steps` Adam steps, held near the private fit by
    # `moment_anchor`); null: no moment fit.
    moment_noise: float | None = None
    moment_steps: int = 300
    moment_anchor: float = 0.001
    # null: the moments of the encoded values; k: of each continuous column centred and scaled to k standard
    # deviations of the rows the private Gaussian decodes to (post-processing), so they fill [-1, 1].
    moment_spread: float | None = None
    lr_autoencoder: float = 0.005
    lr_critic: float = 0.005
    lr_generator: float = 0.005


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
    # Prefer checkpoints whose synthetic rows hold every level of every discrete column (dpsynth.models.evaluation.choice).
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


@dataclass(frozen=True)
class Profile:
    name: str
    seed: int = 0
    # "honest": test rows never reach preprocessing or the GAN; "thesis": the GAN trains on every row.
    protocol: str = "honest"
    split: tuple[float, float, float] = (0.8, 0.1, 0.1)
    knn_neighbors: int = 3
    gan: GanConfig = field(default_factory=GanConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    settings: tuple[Setting, ...] = (Setting("k1000", 1000),)
    # The setting a release trains: by name, or the only setting when the profile lists one.
    release_setting: str | None = None
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    device: str = "auto"
    # Registered model name; null gives "<dataset>-<generator>".
    model_name: str | None = None
    # The generator type of every setting that does not name its own (models/generators/): each owns
    # its section below (`gan` is GS-WGAN's, with privacy.noise_multiplier and privacy.clip).
    generator: str = "gswgan"
    dpcgan: DPCGANSection = field(default_factory=DPCGANSection)
    dpautogan: DPAutoGANSection = field(default_factory=DPAutoGANSection)
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

    def __post_init__(self) -> None:
        # Profiles built in code obey the same rules as profiles read from YAML (ProfileSpec below).
        validate(ProfileSpec, self.to_dict(), where=f"profile {self.name!r}")

    def release_target(self) -> Setting:
        if self.release_setting is not None:
            for s in self.settings:
                if s.name == self.release_setting:
                    return s
            raise ConfigError(f"profile {self.name!r}: release_setting {self.release_setting!r} is not a setting.")
        if len(self.settings) != 1:
            raise ConfigError(f"profile {self.name!r} lists {len(self.settings)} settings: name the one a "
                              "release trains with `release_setting`.")
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
        if generator not in GENERATORS:
            raise ConfigError(f"--generator {generator!r} is not a generator: choose one of {', '.join(GENERATORS)}.")
        settings = tuple(dataclasses.replace(s, generator=None) if s.private else
                         dataclasses.replace(s, generator=self.generator_of(s)) for s in self.settings)
        return dataclasses.replace(self, generator=generator, settings=settings)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def config_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    def with_settings(self, *settings: Setting) -> Profile:
        return dataclasses.replace(self, settings=tuple(settings))


def profile_path(profile: str, config_path: str | Path | None = None) -> Path:
    """A profile is a path to a YAML file or a name under configs/profiles/ beside the schema."""
    candidate = Path(profile)
    if candidate.suffix in (".yaml", ".yml"):
        return candidate
    base = Path(config_path).resolve().parent if config_path else Path("configs")
    return base / "profiles" / f"{profile}.yaml"


def load_profile(profile: str, config_path: str | Path | None = None) -> Profile:
    path = profile_path(profile, config_path)
    raw = _load_raw(path, seen=())
    raw.setdefault("name", Path(profile).stem)
    where = f"profile {Path(profile).stem!r} ({path})"
    # Defaults come from the dataclasses (one place): the file's keys are merged over them, so unknown
    # keys still reach validation and are refused there.
    spec = validate(ProfileSpec, _merge(Profile(name="defaults").to_dict(), raw), where)
    return _build(spec)


def _build(spec: ProfileSpec) -> Profile:
    values = spec.model_dump()
    return Profile(**{**values,
                      "gan": GanConfig(**values["gan"]),
                      "privacy": PrivacyConfig(**values["privacy"]),
                      "evaluation": EvaluationConfig(**values["evaluation"]),
                      "dpcgan": DPCGANSection(**values["dpcgan"]),
                      "dpautogan": DPAutoGANSection(**values["dpautogan"]),
                      "marginals": MarginalsConfig(**values["marginals"]),
                      "settings": tuple(Setting(**s) for s in values["settings"])})


def _load_raw(path: Path, seen: tuple[Path, ...]) -> dict:
    if not path.is_file():
        raise ConfigError(f"Profile file {str(path)!r} does not exist.")
    if path in seen:
        raise ConfigError(f"Profile {str(path)!r} extends itself.")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"Profile file {str(path)!r} is not valid YAML: {one_line(exc)}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"Profile file {str(path)!r} is not UTF-8 text.") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"Profile file {str(path)!r} must hold a mapping of keys to values, "
                          f"not {_yaml_kind(raw)}.")
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str) or not parent or "/" in parent or "\\" in parent:
        raise ConfigError(f"Profile file {str(path)!r}: extends: expected the name of a profile beside it "
                          f"(got {parent!r}).")
    base = _load_raw(path.parent / f"{parent}.yaml", seen + (path,))
    base.pop("name", None)
    return _merge(base, raw)


def _yaml_kind(value) -> str:
    return {list: "a list", str: "a text value"}.get(type(value), f"a {type(value).__name__}")


def _merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# ------------------------------------------------------------------------------------ validation
# What a profile may say, key by key. Defaults live in the dataclasses above, so every field here is
# required; `load_profile` fills in the defaults before validating. Ints and floats are strict (no
# "5" for 5, no true for 1); NaN and infinity are refused.

# Layer widths must fit in memory.
MAX_UNITS = 16384
# Checkpoints go through the accountant and model selection one by one (the thesis has 40).
MAX_CHECKPOINTS = 10000
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")

Count = Annotated[int, Strict(), Field(ge=1, le=MAX_INT)]
Units = Annotated[int, Strict(), Field(ge=1, le=MAX_UNITS)]
Positive = Annotated[float, Strict(), Field(gt=0)]
NonNegative = Annotated[float, Strict(), Field(ge=0)]
OpenUnit = Annotated[float, Strict(), Field(gt=0, lt=1)]  # a probability strictly inside (0, 1)
Unit = Annotated[float, Strict(), Field(ge=0, le=1)]


def _device(value: str) -> str:
    if not DEVICE_PATTERN.fullmatch(value):
        raise ValueError(f"{value!r} is not a device: auto, cpu, cuda, cuda:N or mps")
    return value


class GanSpec(BaseModel):
    model_config = STRICT
    z_dim: Units
    generator_hidden: Annotated[tuple[Units, ...], Field(max_length=16)]
    critic_hidden: Units
    critic_batchnorm: StrictBool
    init: Literal["default", "thesis"]
    lr_generator: Annotated[float, Strict(), Field(gt=0, le=1)]
    lr_critic: Annotated[float, Strict(), Field(gt=0, le=1)]
    betas: tuple[Annotated[float, Strict(), Field(ge=0, lt=1)], Annotated[float, Strict(), Field(ge=0, lt=1)]]
    critic_steps: Count
    critic_draw: Literal["per_row", "per_step"]
    critic_refresh_steps: Count | None
    critic_refresh: Literal["independent", "drawn"]
    gp_lambda: NonNegative
    batch_size: Count
    pretrain_iterations: Annotated[int, Strict(), Field(ge=0, le=MAX_INT)]
    pretrain_matmul: Literal["auto", "float32", "bfloat16"]
    kernels: Literal["auto", "native", "torch"]
    iterations: Count  # declared before checkpoint_every, which is checked against it
    checkpoint_every: Count
    generator_ema: Annotated[float, Strict(), Field(ge=0, lt=1)] | None
    output_head: Literal["tanh", "typed", "gumbel"]
    condition_on_target: StrictBool
    target_prior: OpenUnit

    @field_validator("checkpoint_every")
    @classmethod
    def _divides_iterations(cls, every: int, info: ValidationInfo) -> int:
        iterations = info.data.get("iterations")
        if iterations is None:  # iterations itself is invalid and reported
            return every
        if every > iterations:
            raise ValueError(f"must be at most iterations ({iterations}) (got {every})")
        if iterations % every:
            raise ValueError(f"iterations ({iterations}) must be a multiple of checkpoint_every (got {every})")
        if iterations // every > MAX_CHECKPOINTS:
            raise ValueError(f"gives {iterations // every} checkpoints, at most {MAX_CHECKPOINTS} are allowed "
                             f"(got {every} for {iterations} iterations)")
        return every


class SettingSpec(BaseModel):
    model_config = STRICT
    # Setting's defaults: settings are listed, not merged over defaults.
    name: Name
    discriminators: Count | None = None
    private: StrictBool = True
    generator: Literal[GENERATORS] | None = None
    epsilon_budget: Positive | None = None


Hidden = Annotated[tuple[Units, ...], Field(min_length=1, max_length=16)]
Rate = Annotated[float, Strict(), Field(gt=0, le=1)]
Beta = Annotated[float, Strict(), Field(ge=0, lt=1)]


def _steps_fit(every: int, total: int | None, what: str) -> int:
    if total is None:   # the total itself is invalid and reported
        return every
    if total and total // every > MAX_CHECKPOINTS:
        raise ValueError(f"gives {total // every} checkpoints, at most {MAX_CHECKPOINTS} are allowed "
                         f"(got {every} for {total} {what})")
    return every


class DPCGANSpec(BaseModel):
    model_config = STRICT
    sample_rate: OpenUnit
    clip: Positive
    noise_multiplier: Positive
    iterations: Count
    checkpoint_every: Count
    z_dim: Units
    generator_hidden: Hidden
    discriminator_hidden: Hidden
    head: Literal["tanh", "typed", "gumbel"]
    discriminator_optimizer: Literal["sgd", "adam"]
    lr_discriminator: Rate
    lr_generator: Rate
    betas: tuple[Beta, Beta]
    label_prior: OpenUnit

    @field_validator("checkpoint_every")
    @classmethod
    def _fits(cls, every: int, info: ValidationInfo) -> int:
        iterations = info.data.get("iterations")
        if iterations is not None and every > iterations:
            raise ValueError(f"must be at most iterations ({iterations}) (got {every})")
        return _steps_fit(every, iterations, "iterations")


class DPAutoGANSpec(BaseModel):
    model_config = STRICT
    autoencoder_rate: OpenUnit
    autoencoder_clip: Positive
    autoencoder_noise: Positive
    autoencoder_steps: Count
    critic_rate: OpenUnit
    critic_clip: Positive
    critic_noise: Positive
    critic_steps: Count
    generator_steps: Count
    generator_batch: Count
    checkpoint_every: Count
    latent_dim: Units
    z_dim: Units
    encoder_hidden: Hidden
    decoder_hidden: Hidden
    generator_hidden: Hidden
    critic_hidden: Hidden
    critic_space: Literal["data", "latent"]
    head: Literal["tanh", "typed"]
    level_decoding: Literal["argmax", "sample"]
    continuous_weight: Positive
    target_weight: Positive
    latent_model: Literal["gan", "gaussian"]
    latent_noise: Positive
    moment_noise: Positive | None
    moment_steps: Count
    moment_anchor: NonNegative
    moment_spread: Positive | None
    lr_autoencoder: Rate
    lr_critic: Rate
    lr_generator: Rate

    @field_validator("level_decoding")
    @classmethod
    def _needs_softmax(cls, decoding: str, info: ValidationInfo) -> str:
        if decoding == "sample" and info.data.get("head") not in (None, "typed"):
            raise ValueError("sample needs head: typed (its softmax gives each one-hot group's level probabilities)")
        return decoding

    @field_validator("moment_noise")
    @classmethod
    def _needs_gaussian(cls, noise: float | None, info: ValidationInfo) -> float | None:
        if noise is not None and info.data.get("latent_model") not in (None, "gaussian"):
            raise ValueError("a moment fit needs latent_model: gaussian (it moves the fitted Gaussian)")
        return noise

    @field_validator("checkpoint_every")
    @classmethod
    def _fits(cls, every: int, info: ValidationInfo) -> int:
        total = (info.data.get("autoencoder_steps") or 0) + (info.data.get("generator_steps") or 0)
        return _steps_fit(every, total or None, "steps")


class MarginalsSpec(BaseModel):
    model_config = STRICT
    enabled: StrictBool
    rho: Positive   # zero noise (rho infinite) is refused: allow_inf_nan is off
    selections: Annotated[int, Strict(), Field(ge=0, le=1000)]
    selection_share: OpenUnit
    bins: Annotated[int, Strict(), Field(ge=1, le=1000)]
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


class ProfileSpec(BaseModel):
    model_config = STRICT
    name: Name
    seed: Annotated[int, Strict(), Field(ge=0, le=MAX_INT)]
    protocol: Literal["honest", "thesis"]
    split: tuple[OpenUnit, OpenUnit, OpenUnit]
    knn_neighbors: Count
    gan: GanSpec
    privacy: PrivacySpec
    settings: Annotated[tuple[SettingSpec, ...], Field(min_length=1)]
    release_setting: Name | None
    evaluation: EvaluationSpec
    device: Annotated[StrictStr, AfterValidator(_device)]
    model_name: Annotated[StrictStr, Field(min_length=1)] | None
    release_rows: Count  # a public number: never the table's own size (models/privacy/statement.py)
    max_rows: Count | None
    workers: Annotated[int, Strict(), Field(ge=1, le=1024)]
    dask_address: Annotated[StrictStr, Field(min_length=1)] | None
    trial: StrictBool
    generator: Literal[GENERATORS]
    dpcgan: DPCGANSpec
    dpautogan: DPAutoGANSpec
    marginals: MarginalsSpec

    @field_validator("split")
    @classmethod
    def _split_sums_to_one(cls, split: tuple[float, float, float]) -> tuple[float, float, float]:
        if abs(sum(split) - 1.0) > 1e-9:
            raise ValueError(f"the train, validation and test fractions must sum to 1 (got {list(split)}, "
                             f"sum {sum(split):g})")
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
    def _gswgan_settings_name_k(self) -> ProfileSpec:
        unnamed = [s.name for s in self.settings
                   if (s.generator or self.generator) == "gswgan" and s.discriminators is None]
        if unnamed:
            raise ValueError(f"settings {', '.join(unnamed)}: a GS-WGAN setting needs discriminators (K)")
        return self
