"""Run profiles: every tunable of a run, loaded from YAML once and validated at the edge.

A profile lives in `configs/profiles/NAME.yaml`; `extends: OTHER` starts from another profile and
overrides only the keys it names (nested mappings merge). Unknown keys are errors, so a typo never
silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from models.errors import ConfigError


@dataclass(frozen=True)
class GanConfig:
    """Networks and optimisation (thesis section 4.4 and 6.1; REFERENCE.md section 1)."""

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
    # (models/accountant.py): "per_row", every sanitised row its own critic, independently (T x B
    # queries at sigma); "per_step", one critic for all B rows (the thesis' Algorithm 2: T queries at
    # sigma / sqrt(B), epsilon in the hundreds; for reproducing the thesis only, `release` refuses it).
    critic_draw: str = "per_row"
    # Critic updates each critic drawn in a training step gets before it is queried; null keeps
    # `critic_steps` (thesis: 5). Free in privacy terms (critics are never released; which critics are
    # refreshed depends on the secret draws only) and the main lever against stale critics at large K.
    critic_refresh_steps: int | None = None
    gp_lambda: float = 10.0
    batch_size: int = 32
    pretrain_iterations: int = 2000
    # Precision of the throwaway generators' matrix products in pretraining, forward and backward
    # (models.gswgan.pretrain_matmul_dtype): "float32"; "bfloat16" (float32 accumulation, mixed precision
    # as autocast); "auto": bfloat16 on a CPU that computes it natively (AVX512-BF16/AMX), float32
    # elsewhere. BatchNorm, the critics and Adam stay float32; training and the released generator too.
    pretrain_matmul: str = "auto"
    # Two CPU inner loops in C (models.native_kernels): the critic updates (all r of a visit in one call,
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
    # for binary columns and one-hot groups (CTGAN's Gumbel-softmax; models.networks.apply_head).
    output_head: str = "tanh"
    # Condition G and the critics' fake rows on the (binary) target, as official GS-WGAN conditions on
    # the class label: G takes z and a label drawn with probability `target_prior` of the target's
    # second level, and copies it into the target column. The prior is a public design choice (GS-WGAN:
    # uniform labels), never measured on the rows; the target share of the output is fixed by it.
    condition_on_target: bool = False
    target_prior: float = 0.5


@dataclass(frozen=True)
class Setting:
    """One privacy setting gamma = 1/K. `private: false` is the thesis' non-private baseline."""

    name: str
    discriminators: int
    private: bool = True


@dataclass(frozen=True)
class PrivacyConfig:
    noise_multiplier: float = 1.07
    clip: float = 1.0
    delta: float = 1e-5
    # The release's epsilon, max(training, choice) (models/release_choice.py), is at most this: training
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
    # Prefer checkpoints whose synthetic rows hold every level of every discrete column (models.choice).
    complete_levels: bool = True
    # The experiment's (non-private, internal) choice per setting prefers checkpoints whose level shares
    # are all within this of the real validation rows'; null turns the preference off.
    max_level_share_gap: float | None = 0.15
    # The release's DP choice scores a checkpoint by its AUC on real validation rows minus this weight
    # times its largest level-share gap to them (models/release_choice.py).
    share_gap_weight: float = 1.0


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
    # Registered model name; null gives "<dataset>-gswgan".
    model_name: str | None = None
    # Rows released in the bundle: a public number fixed in advance. Never the table's own row count,
    # which epsilon does not cover (the bundle would publish it exactly).
    release_rows: int = 50000
    # Upper bound on rows used to train (smoke profiles subsample the table to stay fast).
    max_rows: int | None = None
    # Worker processes for the experiment's fan-out on one machine.
    workers: int = 2
    # Optional Dask scheduler address: the experiment's tasks then run on that cluster.
    dask_address: str | None = None

    def __post_init__(self) -> None:
        if self.protocol not in ("honest", "thesis"):
            raise ConfigError(f"profile {self.name!r}: protocol must be 'honest' or 'thesis'.")
        if len(self.split) != 3 or abs(sum(self.split) - 1.0) > 1e-9 or min(self.split) <= 0:
            raise ConfigError(f"profile {self.name!r}: split must be three positive fractions summing to 1.")
        if not self.settings:
            raise ConfigError(f"profile {self.name!r}: at least one setting is needed.")
        for s in self.settings:
            if s.discriminators < 1:
                raise ConfigError(f"profile {self.name!r}: setting {s.name!r} needs at least one discriminator.")
        names = [s.name for s in self.settings]
        if len(set(names)) != len(names) or "real" in names:
            raise ConfigError(f"profile {self.name!r}: setting names must be unique and not 'real'.")
        if self.gan.output_head not in ("tanh", "typed", "gumbel"):
            raise ConfigError(f"profile {self.name!r}: output_head must be 'tanh', 'typed' or 'gumbel'.")
        if not 0.0 < self.gan.target_prior < 1.0:
            raise ConfigError(f"profile {self.name!r}: gan.target_prior must lie strictly between 0 and 1.")
        if self.gan.pretrain_matmul not in ("auto", "float32", "bfloat16"):
            raise ConfigError(f"profile {self.name!r}: gan.pretrain_matmul must be 'auto', 'float32' or 'bfloat16'.")
        if self.gan.kernels not in ("auto", "native", "torch"):
            raise ConfigError(f"profile {self.name!r}: gan.kernels must be 'auto', 'native' or 'torch'.")
        if self.gan.init not in ("default", "thesis"):
            raise ConfigError(f"profile {self.name!r}: init must be 'default' or 'thesis'.")
        if self.gan.critic_draw not in ("per_row", "per_step"):
            raise ConfigError(f"profile {self.name!r}: gan.critic_draw must be 'per_row' or 'per_step'.")
        if self.gan.checkpoint_every < 1 or self.gan.iterations < self.gan.checkpoint_every:
            raise ConfigError(f"profile {self.name!r}: gan.checkpoint_every must be at least 1 and at most "
                              "gan.iterations.")
        if self.gan.iterations % self.gan.checkpoint_every:
            raise ConfigError(f"profile {self.name!r}: iterations must be a multiple of checkpoint_every.")
        for key in ("choice_epsilon", "approval_epsilon"):
            if not getattr(self.privacy, key) > 0:
                raise ConfigError(f"profile {self.name!r}: privacy.{key} must be a number above 0.")
        if self.privacy.lifetime_budget is not None and not self.privacy.lifetime_budget > 0:
            raise ConfigError(f"profile {self.name!r}: privacy.lifetime_budget must be a number above 0, or null.")
        if self.release_rows is None or self.release_rows < 1:
            raise ConfigError(f"profile {self.name!r}: release_rows must be a whole number of rows, at least 1.")
        if self.evaluation.share_gap_weight < 0:
            raise ConfigError(f"profile {self.name!r}: evaluation.share_gap_weight must be at least 0.")

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
    raw = _load_raw(profile_path(profile, config_path), seen=())
    raw.setdefault("name", Path(profile).stem)
    return build_dataclass(Profile, raw, where=f"profile {profile!r}")


def _load_raw(path: Path, seen: tuple[Path, ...]) -> dict:
    if not path.is_file():
        raise ConfigError(f"Profile file {str(path)!r} does not exist.")
    if path in seen:
        raise ConfigError(f"Profile {str(path)!r} extends itself.")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"Profile file {str(path)!r} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"Profile file {str(path)!r} must hold a mapping.")
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    base = _load_raw(path.parent / f"{parent}.yaml", seen + (path,))
    base.pop("name", None)
    return _merge(base, raw)


def _merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def build_dataclass(cls, raw, where: str):
    """Build a (nested) frozen dataclass from plain YAML data, rejecting unknown keys."""
    if dataclasses.is_dataclass(raw):
        return raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping for {cls.__name__}.")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} for {cls.__name__}.")
    kwargs = {key: _coerce(hints[key], value, f"{where}.{key}") for key, value in raw.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _coerce(hint, value, where: str):
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return build_dataclass(hint, value, where)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list.")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, where) for v in value)
        if len(args) != len(value):
            raise ConfigError(f"{where}: expected {len(args)} values.")
        return tuple(_coerce(a, v, where) for a, v in zip(args, value))
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}.")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}.")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}.")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}.")
        return value
    return value
