"""What MST and AIM share behind the generator interface: a zCDP budget rho and one released graphical
model (models/generators/graphical/model.py, sampled by graphical/sampler.py).

Checkpoint 0 is a model that read no row (each column uniform over its writable cells), checkpoint 1 the
fitted one. The cost is rho (`<section>.rho`, or the largest that fits the setting's budget) under
replace-one adjacency, whose RDP at order a is a x rho; the measured marginals' rho is added to it before
the one conversion (models/generators/graphical/mechanisms.py `epsilon_of`, classic), so every epsilon such a
generator plans, records or publishes is the replace-one epsilon of rho + the marginals' rho (of the
marginals' alone at checkpoint 0). A subclass says how it fits (`fit_model`) and what it publishes.

Of that rho, the section's `shape_share` measures the continuous columns' fine 1-way histograms
(dpsynth.models.marginals.shapes: where inside a cell a sampled value lands) and the rest is the fit's
(`model_rho`): one rho, one accountant, split between two measurements that compose.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpsynth.models.checkpoint_files import save_verified
from dpsynth.models.config import Profile, Setting
from dpsynth.models.data.cell_counts import CellCounts, count_frame
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.base import FitResult, GeneratorType, Progress, Schedule, TrainingJob, TrainingPlan
from dpsynth.models.generators.graphical.mechanisms import epsilon_of, rho_for_epsilon
from dpsynth.models.generators.graphical.model import FORMAT, MSTModel
from dpsynth.models.marginals.release import REPLACE_ONE, marginals_rho
from dpsynth.models.marginals.shapes import PURPOSE as SHAPES_PURPOSE
from dpsynth.models.marginals.shapes import ColumnShapes, noisy_shapes, shape_noise_multiplier, shaped_columns

if TYPE_CHECKING:
    from dpsynth.models.privacy.lifetime import TrainingCurve


def training_rho(profile: Profile, setting: Setting, generator: str) -> float:
    """The generator's rho for `setting`: its section's `rho`, or, when null, the largest whose epsilon with
    the measured marginals' rho added fits the setting's budget (training's budget: the DP choice reads
    disjoint rows)."""
    config = profile.section(generator)
    if config.rho is not None:
        return float(config.rho)
    budget = profile.budget_for(setting)
    if budget is None:
        raise ConfigError(
            f"Setting {setting.name!r}: {generator}.rho is null, which takes the largest rho that fits the "
            f"setting's budget, and the setting has no budget: set {generator}.rho or an epsilon budget."
        )
    return rho_for_epsilon(budget, profile.privacy.delta, marginals_rho(profile, REPLACE_ONE))


def shape_rho(profile: Profile, setting: Setting, generator: str) -> float:
    """The part of the generator's rho spent on the columns' fine histograms (its `shape_share`)."""
    return profile.section(generator).shape_share * training_rho(profile, setting, generator)


def model_rho(profile: Profile, setting: Setting, generator: str) -> float:
    """The part of the generator's rho its fit spends: the rest after the shapes."""
    return training_rho(profile, setting, generator) - shape_rho(profile, setting, generator)


def checkpoint_rho(profile: Profile, setting: Setting, iteration: int, generator: str) -> float:
    """The zCDP spent on the training rows at a checkpoint: the measured marginals', and the generator's
    from 1 on."""
    measured = marginals_rho(profile, REPLACE_ONE)
    return measured + training_rho(profile, setting, generator) if iteration >= 1 else measured


class ZCDPModelGenerator(GeneratorType):
    """A generator that spends one zCDP rho and releases one graphical model (MST, AIM)."""

    def training_rho(self, profile: Profile, setting: Setting) -> float:
        return training_rho(profile, setting, self.name)

    def schedule(self, profile: Profile, setting: Setting) -> Schedule:
        delta = profile.privacy.delta
        return Schedule(
            (0, 1),
            tuple(epsilon_of(checkpoint_rho(profile, setting, t, self.name), delta) for t in (0, 1)),
            1,
            f"lower {self.name}.rho (null: the largest that fits the budget)",
        )

    def checkpoint_interval(self, profile: Profile) -> int:
        return 1

    def training_curve(self, profile: Profile, setting: Setting, trained_iterations: int) -> TrainingCurve:
        """Order x (the generator's rho + the measured marginals'), replace-one. A TrainingCurve is GS-WGAN's
        inputs plus an added replace-one zCDP line (its `marginals_rho`): this curve is that line alone,
        with no critic query composed (iterations 0)."""
        from dpsynth.models.privacy.lifetime import TrainingCurve

        rho = checkpoint_rho(profile, setting, int(trained_iterations), self.name)
        return TrainingCurve(1, 0, 1, 1.0, "per_row", marginals_rho=rho)

    def cliques(self, profile: Profile, schema: DatasetSchema) -> list[tuple[int, ...]]:
        """The column cliques (positions in the schema's order) whose exact counts the fit reads."""
        raise NotImplementedError

    def counted_cells(
        self, profile: Profile, setting: Setting, schema: DatasetSchema
    ) -> tuple[list[tuple[int, ...]], list[int], int]:
        """The fit's cliques, and the continuous columns whose fine histograms the shapes read (none at
        shape share 0): a zCDP model generator reads its training rows through these counts alone."""
        columns = list(schema.columns)
        shaped = {col.name for col in shaped_columns(columns)} if shape_rho(profile, setting, self.name) > 0 else set()
        fine = [j for j, col in enumerate(columns) if col.name in shaped]
        return self.cliques(profile, schema), fine, profile.section(self.name).bins

    def cell_counts(self, job: TrainingJob) -> CellCounts:
        """The training rows' exact counts: the prepare stage's (counted out of core), or counted here
        from the job's encoded rows (the same numbers: every step from a row to its cells is row-local)."""
        if job.counts is not None:
            return job.counts
        cliques, fine, bins = self.counted_cells(job.profile, job.setting, job.schema)
        table = TableEncoder(job.schema).decode(job.data)
        return count_frame(table, tuple(job.schema.columns), bins, cliques, fine, reader=self.label)

    def fit_model(
        self, job: TrainingJob, rho: float
    ) -> tuple[MSTModel, dict[str, Any], dict[str, float], dict[str, float]]:
        """The fitted model at zCDP `rho` on the job's training rows, its public info, the fit's seconds and
        internal metrics (e.g. the estimator's final loss)."""
        raise NotImplementedError

    def fit(self, job: TrainingJob, prepared: Path, plan: TrainingPlan, progress: Progress | None = None) -> FitResult:
        """Checkpoint 0, then (when planned) the fit on the training rows. A fit is redone whole when
        training is resumed: the same secret draws the same noise."""
        started = time.perf_counter()
        bins = job.profile.section(self.name).bins
        directory = job.directory / "checkpoints"
        directory.mkdir(parents=True, exist_ok=True)
        ledger: list[dict] = []
        info: dict[str, Any] = {}
        internal: dict[str, Any] = {}
        for iteration, epsilon in zip(plan.iterations, plan.epsilons, strict=True):
            if iteration == 0:
                model = MSTModel.uniform(tuple(job.schema.columns), bins)
            else:
                model, fit_info, seconds, internal = self.fit_model(job, model_rho(job.profile, job.setting, self.name))
                model.shapes = self._measure_shapes(job)
                info = {self.name: fit_info, f"{self.name}_seconds": seconds}
            path = directory / f"{self.name}_{iteration:06d}.pt"
            digest = save_verified(
                generator_file(model, job.schema, iteration, epsilon, job.profile.privacy.delta), path
            )
            ledger.append({"iteration": iteration, "epsilon": epsilon, "generator": path.name, "sha256": digest})
            if progress is not None:
                progress(iteration, f"epsilon {epsilon:.3f}")
        return FitResult(ledger, time.perf_counter() - started, info=info, internal_metrics=internal)

    def _measure_shapes(self, job: TrainingJob) -> ColumnShapes | None:
        """The continuous columns' noisy fine histograms at the section's share of rho (None at share 0 or
        without a continuous column)."""
        rho = shape_rho(job.profile, job.setting, self.name)
        columns = shaped_columns(job.schema.columns)
        if rho <= 0 or not columns:
            return None
        counts = self.cell_counts(job)
        positions = {col.name: j for j, col in enumerate(job.schema.columns)}
        exact = {col.name: counts.fine[positions[col.name]] for col in columns}
        bins = job.profile.section(self.name).bins
        sigma = shape_noise_multiplier(rho, len(columns))
        return noisy_shapes(exact, columns, sigma, job.secret.numpy(SHAPES_PURPOSE), bins)


def generator_file(model: MSTModel, schema: DatasetSchema, iteration: int, epsilon: float, delta: float) -> dict:
    """A checkpoint's contents: the model's tables as tensors (torch.load's weights-only reader takes
    them), its layout, the schema's identity (for the encoder) and the checkpoint's public facts."""
    import torch  # here: planning a release (its budget, the refusals) needs no torch

    arrays, meta = model.to_arrays()
    return {
        "format": FORMAT,
        "schema": {"name": schema.name, "version": schema.version, "target": schema.target},
        "model": {"meta": meta, "arrays": {name: torch.from_numpy(values) for name, values in arrays.items()}},
        "iteration": iteration,
        "epsilon": epsilon,
        "delta": delta,
    }
