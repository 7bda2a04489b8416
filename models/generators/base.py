"""The generator interface: everything the stages, the DP choice, the report, the bundle, the registry
and the pyfunc model need from a DP generator, so that none of them names one.

A generator type (the adapter of one package beside this one, registered in models/generator_registry.py):

* `schedule(profile, setting)`: every checkpoint its section asks for and the training epsilon at each,
  under replace-one adjacency at the profile's delta, with no budget applied; `plan` (not overridden)
  cuts it at the setting's budget in models/privacy/budget.py, the one place an epsilon meets a budget,
  before any data is read (the command line's preflight and the lifetime ledger use it);
* `donor_groups`: which training rows may impute each other's gaps (honest protocol): rows whose
  influence on each other the mechanism already covers, or none (each row's gaps filled from the
  public bounds alone);
* `prepare(job)` (optional, e.g. GS-WGAN's pretraining of its critics) and `fit(job, prepared, last)`:
  training on the encoded rows to the planned last checkpoint, resumable, with a ledger of generator
  checkpoints and their replace-one epsilons;
* `load(path)`: a `Sampler` for a checkpoint file (its package's sampler.py through
  models/generators/samplers.py, light enough for the pyfunc model);
* `privacy_facts(profile, setting)`: the public description of the mechanism, from which the one
  statement of what epsilon covers, the release notes, release.json and the registry tags are built,
  every public parameter with its label for a reader;
* `summary_entries`, `setting_parameters`, `public_setting`: what the privacy summary (the release
  notes, the report) says of this generator beyond its parameters, and per setting;
* `training_curve`: the per-row RDP curve the lifetime ledger may compose with other releases' curves,
  only where it is a replace-one curve (else None: the ledger adds that release's epsilon).

Every epsilon of `schedule`, `fit`'s ledger and `training_curve` includes the measured marginals where the
profile measures them (models/marginals/release.py): their RDP is added to training's, under the
generator's own accountant's adjacency, before its one conversion.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from dpsynth.models.config import Profile, Setting
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import ConfigError
from dpsynth.models.privacy.budget import Schedule, TrainingPlan, cut_to_budget
from dpsynth.models.privacy.facts import PrivacyFacts  # a generator package's adapter imports it from here
from dpsynth.models.privacy.secret import PrivacySecret

if TYPE_CHECKING:
    from dpsynth.models.data.cell_counts import CellCounts
    from dpsynth.models.generators.samplers import Sampler
    from dpsynth.models.privacy.lifetime import TrainingCurve

# `progress(units done, text)`: how `prepare` and `fit` report as they advance.
Progress = Callable[[int, str], None]

# Every epsilon a generator reports, records or publishes is under this adjacency (GS-WGAN's accountant
# is replace-one; the DP-SGD generators convert Opacus's add/remove-one analysis by group privacy).
ADJACENCY = "replace one row"

# What the two DP-SGD generators share: how their Opacus (add/remove-one) RDP becomes a replace-one
# epsilon, and that no training row imputes another (a DP-SGD update bounds one row's gradient only).
DPSGD_CONVERSION = (
    "classic at the add/remove-one delta d with (1 + e^eps) d <= delta, then group privacy over a "
    "removal and an addition: replace-one epsilon = 2 eps"
)
DPSGD_ADJACENCY = f"{ADJACENCY} (group privacy of two add/remove-one steps)"
NO_DONORS = "no row imputes another: a training row's gaps take the middle of their public range"


@dataclass(frozen=True)
class SummaryEntry:
    """One public fact the privacy summary shows beside the mechanism's parameters, with its label."""

    label: str
    value: object


class TaskMap(Protocol):
    """Runs `fn(*arguments)` for each tuple of `arguments` somewhere else (a cluster's workers) and returns
    the results in order; `done(i)` is called as task i completes."""

    def __call__(
        self,
        fn: Callable[..., Any],
        arguments: Sequence[tuple],
        done: Callable[[int], None] | None = None,
    ) -> list: ...


@dataclass
class TrainingJob:
    """One setting's training, as the train stage hands it to a generator."""

    profile: Profile
    setting: Setting
    schema: DatasetSchema
    # The encoded training rows (float32), a read-only memory map for a generator with `mapped_rows`; no
    # rows when `counts` stands for them.
    data: np.ndarray
    secret: PrivacySecret
    directory: Path  # the stage's folder: checkpoints/ and anything else the generator keeps
    # The training rows' exact cell counts, for a generator that reads nothing else (`counted_cells`):
    # counted out of core by the prepare stage, so that no n x columns matrix is held.
    counts: CellCounts | None = None
    # Where independent units of the preparation may run (a cluster's workers, tasks/cluster.py), to the
    # same result as here; None: in this process.
    task_map: TaskMap | None = None


@dataclass
class FitResult:
    # {"iteration", "epsilon" (replace-one), "generator" (file name in checkpoints/), "sha256", ...}
    ledger: list[dict]
    seconds: float
    info: dict = field(default_factory=dict)
    # Derived from real rows (a critic's estimates, losses): internal files only, never published.
    internal_metrics: dict = field(default_factory=dict)
    resume_notes: list[str] = field(default_factory=list)


class PhasedTrainer(Protocol):
    """A resumable DP-SGD trainer whose checkpoints name their phase (DP-auto-GAN's, RDP-CGAN's)."""

    resume_notes: list[str]

    def run(self, *, progress: Callable[[int, float], None] | None = ..., last_step: int | None = ...) -> Any: ...


def run_phased_trainer(
    trainer: PhasedTrainer, plan: TrainingPlan, epsilon_at: Callable[[int], float], progress: Progress | None
) -> FitResult:
    """Train to the plan's last step; the ledger keeps the plan's checkpoints, each with its replace-one
    epsilon (`epsilon_at(step)`) and the trainer's own add/remove-one figure beside it."""

    def checkpoint(step: int, _: float) -> None:
        if progress is not None:
            progress(step, f"epsilon {epsilon_at(step):.3f}")

    result = trainer.run(progress=checkpoint, last_step=plan.last)
    shown = set(plan.iterations)
    ledger = [
        {
            "iteration": e["step"],
            "epsilon": epsilon_at(e["step"]),
            "epsilon_add_remove": e["epsilon"],
            "generator": e["release"],
            "sha256": e["sha256"],
            "phase": e["phase"],
        }
        for e in result.checkpoints
        if e["step"] in shown
    ]
    return FitResult(ledger, result.seconds, resume_notes=trainer.resume_notes)


class GeneratorType(ABC):
    name: str
    label: str
    # The name of the stage before training, where the training rows are imputed (and, for a generator
    # that pretrains something, pretrained).
    prepare_name: str = "prepare"
    # True: `fit` takes `TrainingJob.data` as a read-only memory map of the prepared rows' file and reads
    # only what it needs from it (models/generators/training_rows.py), so training holds its batches, not
    # every row; False: an array in memory.
    mapped_rows: bool = False

    @abstractmethod
    def schedule(self, profile: Profile, setting: Setting) -> Schedule:
        """Every checkpoint the section asks for and training's replace-one epsilon at each (measured
        marginals included), with no budget applied: models/privacy/budget.py cuts it."""

    def plan(self, profile: Profile, setting: Setting) -> TrainingPlan:
        """The schedule cut at the setting's budget, after the generator's own checks. A non-private setting
        (epsilon infinity: an experiment's baseline) trains its whole schedule; a release refuses it."""
        self.check(profile, setting)
        budget = profile.budget_for(setting) if setting.private else None
        return cut_to_budget(self.schedule(profile, setting), budget, setting.name)

    @abstractmethod
    def fit(self, job: TrainingJob, prepared: Path, plan: TrainingPlan, progress: Progress | None = None) -> FitResult:
        """Train to `plan.last`, resuming from the job directory's checkpoints. `progress(iteration,
        text)` as training advances."""

    @abstractmethod
    def training_facts(self, profile: Profile, setting: Setting) -> PrivacyFacts:
        """The public description of training's mechanism alone."""

    def privacy_facts(self, profile: Profile, setting: Setting) -> PrivacyFacts:
        """Training's facts, with the measured marginals' where the profile measures them: the mechanism the
        accountant composes is then both (models/marginals/release.py)."""
        return with_marginals(self.training_facts(profile, setting), profile)

    def check(self, profile: Profile, setting: Setting, schema: DatasetSchema | None = None) -> None:
        """Raise ConfigError for a setting this generator cannot train (before any work)."""
        return None  # every setting, unless a generator says otherwise

    def uncovered_in_release(self, profile: Profile, setting: Setting) -> str | None:
        """Why a release must refuse this configuration (its epsilon would not cover it), or None."""
        return None

    def donor_groups(
        self, n_rows: int, profile: Profile, setting: Setting, secret: PrivacySecret
    ) -> list[np.ndarray] | None:
        """Groups of training rows (positions) that impute each other's gaps; None: no row imputes
        another (each gap gets the middle of its public range)."""
        return None

    def counted_cells(
        self, profile: Profile, setting: Setting, schema: DatasetSchema
    ) -> tuple[list[tuple[int, ...]], list[int], int] | None:
        """What the generator reads of its training rows when it reads only their exact cell counts
        (dpsynth.models.data.cell_counts): (cliques, positions of the columns whose fine histograms it
        reads, bins); None (the default): it reads the encoded rows (`TrainingJob.data`)."""
        return None

    def prepare(self, job: TrainingJob, progress: Progress | None = None) -> tuple[dict, dict]:
        """Work before training on the prepared rows (files, info); nothing by default."""
        return {}, {}

    def prepare_units(self, profile: Profile) -> int:
        """Units of work `prepare` reports progress in (0: no progress display)."""
        return 0

    def training_curve(self, profile: Profile, setting: Setting, trained_iterations: int) -> TrainingCurve | None:
        """A replace-one per-row RDP curve of training (models/privacy/lifetime.py TrainingCurve), or None."""
        return None

    def load(self, path: str | Path, sha256: str | None = None) -> Sampler:
        from dpsynth.models.generators.samplers import load_sampler

        return load_sampler(path, sha256, self.name)

    @abstractmethod
    def checkpoint_interval(self, profile: Profile) -> int:
        """Training steps between two checkpoints (the real baseline's runs are numbered by it)."""

    # Keys of `privacy_facts(...).parameters` that describe one setting: a summary of several settings
    # shows them per setting (`public_setting`) instead.
    setting_parameters: tuple[str, ...] = ()

    def public_setting(self, setting: Setting) -> dict:
        """What the privacy summary shows of one setting beyond its generator, privacy and budget."""
        return {}

    def summary_entries(self, profile: Profile, schema: DatasetSchema | None = None) -> dict[str, SummaryEntry]:
        """Public facts the privacy summary adds after the settings (e.g. the planned schedule, how the
        target column is set), each from the profile and the public schema only."""
        return {}


def with_marginals(facts: PrivacyFacts, profile: Profile) -> PrivacyFacts:
    """`facts` with the measured marginals added to the mechanism, the accountant and the parameters."""
    from dpsynth.models.marginals.release import mechanism_prose, public_parameters

    prose = mechanism_prose(profile)
    if prose is None:
        return facts
    from dpsynth.models.marginals.release import PUBLIC_LABELS

    measured = public_parameters(profile)
    return dataclasses.replace(
        facts,
        mechanism=f"{facts.mechanism}; then {prose}",
        accountant=(
            f"{facts.accountant}; the measured marginals' RDP (order x rho, under this accountant's "
            "adjacency) added to training's at every order before the one conversion"
        ),
        parameters={**facts.parameters, **measured},
        labels={**facts.labels, **{key: PUBLIC_LABELS[key] for key in measured}},
    )


def target_prior_entry(prior: float, schema: DatasetSchema | None) -> SummaryEntry:
    """How a generator that conditions on the target sets it: by its public prior, never learned."""
    level = f"{schema.target} = {schema.column(schema.target).levels[1]}" if schema else "the target's second level"
    return SummaryEntry(
        "target column",
        f"set by design, not learned: each synthetic row's target is {level} "
        f"with probability {prior:g} (a public prior)",
    )


def require_private(generator: GeneratorType, setting: Setting) -> None:
    if not setting.private:
        raise ConfigError(
            f"Setting {setting.name!r}: {generator.label} trains only privately; the non-private "
            "baseline is GS-WGAN's (generator: gswgan, private: false)."
        )
