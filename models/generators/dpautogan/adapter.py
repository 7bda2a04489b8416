"""DP-auto-GAN behind the generator interface (networks and trainer: models/generators/dpautogan/trainer.py).

Phase 1 trains an autoencoder with DP-SGD, phase 2 a WGAN whose critic is DP-SGD; both phases' RDP
add order by order (the paper's Lemma 1) in one accountant. A checkpoint's "iteration" is the trainer's
step: an autoencoder update in phase 1, a generator step (with its critic updates) in phase 2. Only
checkpoints from the end of phase 1 on are offered for selection (before it the generator is
untrained). Every epsilon is replace-one, from Opacus's add/remove-one analysis by group privacy."""

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
    PrivacyFacts,
    TrainingJob,
    TrainingPlan,
)
from dpsynth.models.generators.two_phase.adapter import (
    AUTOENCODER_LABELS,
    TwoPhaseGenerator,
    autoencoder_and_critic_phases,
    autoencoder_parameters,
    critic_parameters,
    gan_checkpoint_steps,
)

# What a reader calls each public parameter (the release notes' labels).
LABELS = {
    **AUTOENCODER_LABELS,
    "q3": "critic sampling rate q3",
    "sigma3": "critic noise multiplier sigma3",
    "C3": "critic clipping norm C3",
    "updates_per_generator_step": "critic updates per generator step",
    "latent_model": "latent model",
    "sigma_latent": "Gaussian fit's noise multiplier",
    "sigma_moments": "moment query's noise multiplier",
}


def reconstruction_weights(profile: Profile, schema) -> tuple[float, ...] | None:
    """Each encoded column's weight in the reconstruction loss, from the public schema: the profile's
    `continuous_weight` for continuous columns, `target_weight` for the target, 1 elsewhere; None when
    all are 1 (the paper's plain sum, and the configuration earlier runs recorded)."""
    c = profile.dpautogan
    if c.continuous_weight == 1.0 and c.target_weight == 1.0:
        return None
    encoder = TableEncoder(schema)
    weights = [1.0] * encoder.width
    for block in encoder.blocks:
        if block.column.kind == "continuous":
            weights[block.start] = float(c.continuous_weight)
    weights[encoder.target_index] = float(c.target_weight)
    return tuple(weights)


def moment_columns(profile: Profile, schema) -> tuple[int, ...] | None:
    """The encoded columns of the decoded-moment fit, from the public schema: every continuous column
    and a binary target; None when the profile asks for no moment fit."""
    if profile.dpautogan.moment_noise is None:
        return None
    encoder = TableEncoder(schema)
    columns = [block.start for block in encoder.blocks if block.column.kind == "continuous"]
    target = [b for b in encoder.blocks if b.start <= encoder.target_index < b.stop]
    if target and target[0].stop - target[0].start == 1:
        columns.append(encoder.target_index)
    if not columns:
        raise ConfigError(
            "dpautogan.moment_noise: the schema has no continuous column and no binary target "
            "for the moment fit; set moment_noise to null"
        )
    return tuple(columns)


def phases_at(profile: Profile, step: int):
    """The private updates of both phases after `step` steps, as the accountant composes them: the
    critic's updates, or the Gaussian fit (the Gaussian mechanism: a sampled Gaussian at rate 1, once)."""
    from dpsynth.models.privacy.dpsgd_accountant import Phase

    c = profile.dpautogan
    if c.latent_model != "gaussian":
        return autoencoder_and_critic_phases(c, step)
    phases = [Phase(c.autoencoder_rate, c.autoencoder_noise, min(step, c.autoencoder_steps))]
    if step > c.autoencoder_steps:
        phases.append(Phase(1.0, c.latent_noise, 1))
        if c.moment_noise is not None:
            phases.append(Phase(1.0, c.moment_noise, 1))
    return phases


def checkpoint_steps(profile: Profile) -> list[int]:
    """Steps the trainer checkpoints at that selection sees: 0, then the end of phase 1 and every
    checkpoint after it; with the Gaussian latent model 0 and the fit."""
    c = profile.dpautogan
    if c.latent_model == "gaussian":
        return [0, c.autoencoder_steps + 1]  # the autoencoder alone samples nothing: its Gaussian fit does
    return gan_checkpoint_steps(c)


class DPAutoGAN(TwoPhaseGenerator):
    name = "dpautogan"
    label = "DP-auto-GAN"

    def phases_at(self, profile: Profile, step: int) -> list:
        return phases_at(profile, step)

    def checkpoint_steps(self, profile: Profile) -> list[int]:
        return checkpoint_steps(profile)

    def fit(self, job: TrainingJob, prepared: Path, plan: TrainingPlan, progress=None) -> FitResult:

        from dpsynth.models.generators.dpautogan.trainer import DPAutoGANTrainer

        groups = TableEncoder(job.schema).head_groups()
        trainer = DPAutoGANTrainer(
            job.data,  # an array or a read-only memory map (`mapped_rows`)
            groups,
            job.profile.dpautogan,
            job.profile.seed,
            job.secret,
            job.directory / "checkpoints",
            delta=job.profile.privacy.delta,
            reconstruction_weights=reconstruction_weights(job.profile, job.schema),
            moment_columns=moment_columns(job.profile, job.schema),
        )
        return self.train(trainer, job.profile, plan, progress)

    def training_facts(self, profile: Profile, setting: Setting) -> PrivacyFacts:
        c = profile.dpautogan
        if c.latent_model == "gaussian":
            moments = c.moment_noise is not None
            return PrivacyFacts(
                generator=f"{self.label} (Gaussian latent model)",
                mechanism=(
                    "the autoencoder by Poisson-subsampled Gaussian updates (DP-SGD; encoder and decoder "
                    "clipped together), then one Gaussian mechanism on the sums of every training row's "
                    "latent and its products (each row's share bounded by the latents' range [-1, 1])"
                    + (
                        "; then one more on the sums of the rows' continuous columns and binary target and "
                        "their products (values clipped to [-1, 1]), to which the Gaussian is fitted through "
                        "the decoder"
                        if moments
                        else ""
                    )
                ),
                accountant="RDP of the sampled Gaussian mechanism (Opacus's analysis; the Gaussian fit"
                + (" and the moment query each" if moments else "")
                + " as rate 1), "
                "all phases added order by order, one composition per private query",
                conversion=DPSGD_CONVERSION,
                sampling=f"each training row joins an autoencoder batch with probability q1 = {c.autoencoder_rate:g}; "
                "every training row enters the Gaussian fit once" + (" and the moment query once" if moments else ""),
                adjacency=DPSGD_ADJACENCY,
                sanitised=(
                    "each autoencoder update clips every row's gradient and adds Gaussian noise to the sum; "
                    "the Gaussian fit adds noise to the latents' sums"
                    + ("; the moment query to the moments' sums" if moments else "")
                    + "; the released decoder, mean and covariance read the data only through them; the "
                    "Poisson batches and the noise come from a secret drawn for the run"
                ),
                imputation=NO_DONORS,
                parameters={
                    **autoencoder_parameters(c),
                    "latent_model": "gaussian",
                    "sigma_latent": c.latent_noise,
                    **({"sigma_moments": c.moment_noise} if moments else {}),
                },
                labels=LABELS,
            )
        phase1 = autoencoder_parameters(c)
        phase1_steps = phase1.pop("autoencoder_steps")  # its releases have listed phase 1's steps last
        return self.critic_phase_facts(
            c,
            mechanism=(
                "Poisson-subsampled Gaussian (DP-SGD) in two phases: the autoencoder (encoder and decoder "
                "clipped together), then the WGAN critic (each real row's pair gradient clipped)"
            ),
            composition="Lemma 1",
            critic="3",
            parameters={**phase1, **critic_parameters(c, "3"), "autoencoder_steps": phase1_steps},
            labels=LABELS,
        )
