"""RDP-CGAN behind the generator interface (networks and trainer: models/generators/rdpcgan/trainer.py).

Phase 1 trains a convolutional autoencoder with DP-SGD, phase 2 a convolutional WGAN whose critic is
DP-SGD and reads the decoder's output; both phases' RDP add order by order (the paper's Proposition 1)
in one curve, with the measured marginals' where the profile measures them, converted once. A
checkpoint's "iteration" is the trainer's step: an autoencoder update in phase 1, a generator step (with
its critic updates) in phase 2. Only checkpoints from the end of phase 1 on are offered for selection.
Every epsilon is replace-one, from Opacus's add/remove-one analysis by group privacy (as DP-CGAN's and
DP-auto-GAN's); the add/remove-one curve is not a replace-one curve, so there is no `training_curve` for
the lifetime ledger to compose: it adds the published epsilon."""

from __future__ import annotations

from pathlib import Path

from dpsynth.models.config import Profile, Setting
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.generators.base import (
    FitResult,
    PrivacyFacts,
    Progress,
    TrainingJob,
    TrainingPlan,
)
from dpsynth.models.generators.two_phase.adapter import (
    AUTOENCODER_LABELS,
    TwoPhaseGenerator,
    autoencoder_parameters,
    critic_parameters,
)

# What a reader calls each public parameter (the release notes' labels).
LABELS = {
    **AUTOENCODER_LABELS,
    "q2": "critic sampling rate q2",
    "sigma2": "critic noise multiplier sigma2",
    "C2": "critic clipping norm C2",
    "updates_per_generator_step": "critic updates per generator step",
}


class RDPCGAN(TwoPhaseGenerator):
    name = "rdpcgan"
    label = "RDP-CGAN"

    def fit(self, job: TrainingJob, prepared: Path, plan: TrainingPlan, progress: Progress | None = None) -> FitResult:

        from dpsynth.models.generators.rdpcgan.trainer import RDPCGANTrainer

        encoder = TableEncoder(job.schema)
        target = encoder.block(job.schema.target)
        trainer = RDPCGANTrainer(
            job.data,  # an array or a read-only memory map (`mapped_rows`)
            encoder.head_groups(),
            job.profile.rdpcgan,
            job.profile.seed,
            job.secret,
            job.directory / "checkpoints",
            delta=job.profile.privacy.delta,
            target=(target.start, target.stop),
        )
        return self.train(trainer, job.profile, plan, progress)

    def training_facts(self, profile: Profile, setting: Setting) -> PrivacyFacts:
        c = profile.rdpcgan
        return self.critic_phase_facts(
            c,
            mechanism=(
                "Poisson-subsampled Gaussian (DP-SGD) in two phases: the convolutional autoencoder (encoder "
                "and decoder clipped together), then the convolutional WGAN critic reading rows and decoded "
                "fakes (each real row's pair gradient clipped)"
            ),
            composition="RDP composition",
            critic="2",
            parameters={**autoencoder_parameters(c), **critic_parameters(c, "2")},
            labels=LABELS,
        )
