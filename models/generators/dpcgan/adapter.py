"""DP-CGAN behind the generator interface (the networks and the trainer: models/generators/dpcgan/trainer.py).

Its discriminator is the only network that reads rows, through DP-SGD with Poisson sampling at the
profile's public rate q. Opacus's RDP analysis of the sampled Gaussian is for add/remove-one adjacency;
every epsilon this generator plans, records or publishes is the replace-one epsilon derived from it by
group privacy (models/privacy/dpsgd_accountant.py `replace_one_epsilon`), at the profile's delta."""

from __future__ import annotations

from pathlib import Path

from dpsynth.models.config import Profile, Setting
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.base import (
    DPSGD_ADJACENCY,
    DPSGD_CONVERSION,
    NO_DONORS,
    FitResult,
    GeneratorType,
    PrivacyFacts,
    Schedule,
    SummaryEntry,
    TrainingJob,
    TrainingPlan,
    require_private,
    target_prior_entry,
)

# What a reader calls each public parameter (the release notes' labels).
LABELS = {
    "q": "sampling rate q",
    "sigma": "noise multiplier sigma",
    "C": "clipping norm C",
    "label_prior": "label prior (share of target label 1)",
}


def replace_one_epsilon_at(profile: Profile, updates: int) -> float:
    """The replace-one epsilon after `updates` discriminator updates (one query each), with the measured
    marginals' add/remove-one curve added to Opacus's before the conversion."""
    from dpsynth.models.marginals.release import ADD_REMOVE_ONE, marginals_rho
    from dpsynth.models.privacy.dpsgd_accountant import Phase, replace_one_epsilon

    c = profile.dpcgan
    return replace_one_epsilon(
        Phase(c.sample_rate, c.noise_multiplier, int(updates)),
        profile.privacy.delta,
        extra_rho=marginals_rho(profile, ADD_REMOVE_ONE),
    )


class DPCGAN(GeneratorType):
    name = "dpcgan"
    label = "DP-CGAN"
    mapped_rows = True  # batches and the labels read from the prepared file (TrainingRows)

    def check(self, profile: Profile, setting: Setting, schema=None) -> None:
        require_private(self, setting)
        if schema is not None and schema.column(schema.target).kind != "binary":
            raise ConfigError(
                f"DP-CGAN conditions on a binary target; {schema.target!r} is {schema.column(schema.target).kind}."
            )

    def schedule(self, profile: Profile, setting: Setting) -> Schedule:
        c = profile.dpcgan
        iterations = list(range(0, c.iterations + 1, c.checkpoint_every))
        if iterations[-1] != c.iterations:
            iterations.append(c.iterations)
        epsilons = [replace_one_epsilon_at(profile, t) for t in iterations]
        return Schedule(
            tuple(iterations),
            tuple(epsilons),
            1,
            "raise dpcgan.noise_multiplier, or lower dpcgan.sample_rate or dpcgan.checkpoint_every",
        )

    def fit(self, job: TrainingJob, prepared: Path, plan: TrainingPlan, progress=None) -> FitResult:

        from dpsynth.models.generators.dpcgan.trainer import DPCGANTrainer

        encoder = TableEncoder(job.schema)
        trainer = DPCGANTrainer(
            job.data,  # an array or a read-only memory map (`mapped_rows`)
            encoder.target_index,
            encoder.head_groups(),
            job.profile.dpcgan,
            job.profile.seed,
            job.secret,
            job.directory / "checkpoints",
            delta=job.profile.privacy.delta,
        )

        def checkpoint(iteration: int, _: float) -> None:
            if progress is not None:
                progress(iteration, f"epsilon {replace_one_epsilon_at(job.profile, iteration):.3f}")

        result = trainer.run(last_iteration=plan.last, progress=checkpoint)
        ledger = [
            {**e, "epsilon": replace_one_epsilon_at(job.profile, e["iteration"]), "epsilon_add_remove": e["epsilon"]}
            for e in result.checkpoints
        ]
        return FitResult(ledger, result.seconds, resume_notes=trainer.resume_notes)

    def training_facts(self, profile: Profile, setting: Setting) -> PrivacyFacts:
        c = profile.dpcgan
        return PrivacyFacts(
            generator=self.label,
            mechanism=(
                "Poisson-subsampled Gaussian (DP-SGD) on the discriminator: per-example gradients of the "
                "real and of the generated rows clipped separately to C, Gaussian noise on the real sum"
            ),
            accountant="RDP of the sampled Gaussian mechanism (Opacus's analysis), one composition per "
            "discriminator update",
            conversion=DPSGD_CONVERSION,
            sampling=(
                f"each training row joins a discriminator batch independently with probability q = {c.sample_rate:g}"
            ),
            adjacency=DPSGD_ADJACENCY,
            sanitised=(
                "each discriminator update clips every real row's gradient to C and adds Gaussian noise "
                "(noise multiplier sigma) to their sum; the generator reads only the discriminator "
                "(post-processing); the Poisson batches and the noise come from a secret drawn for the run"
            ),
            imputation=NO_DONORS,
            parameters={"q": c.sample_rate, "sigma": c.noise_multiplier, "C": c.clip, "label_prior": c.label_prior},
            labels=LABELS,
        )

    def checkpoint_interval(self, profile: Profile) -> int:
        return profile.dpcgan.checkpoint_every

    def summary_entries(self, profile: Profile, schema=None) -> dict[str, SummaryEntry]:
        # Every synthetic row's label is drawn from the public prior, as in training.
        return {"target_labels": target_prior_entry(profile.dpcgan.label_prior, schema)}
