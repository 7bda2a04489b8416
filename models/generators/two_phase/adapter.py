"""The generator interface's side of both two-phase generators (each adapter.py adds its privacy facts,
its run values and what differs in its phases): the checkpoints selection sees and their replace-one
epsilons. Every epsilon is replace-one, from Opacus's add/remove-one analysis by group privacy, with the
measured marginals' add/remove-one curve added before the conversion."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dpsynth.models.config import Profile, Setting
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators.base import (
    DPSGD_ADJACENCY,
    DPSGD_CONVERSION,
    NO_DONORS,
    FitResult,
    GeneratorType,
    PrivacyFacts,
    Progress,
    Schedule,
    TrainingPlan,
    require_private,
    run_phased_trainer,
)
from dpsynth.models.generators.two_phase.config import TwoPhaseConfig

if TYPE_CHECKING:
    from dpsynth.models.privacy.dpsgd_accountant import Phase

# What a reader calls each public parameter of phase 1 (the release notes' labels); each adapter adds its
# phase 2's.
AUTOENCODER_LABELS = {
    "q1": "autoencoder sampling rate q1",
    "sigma1": "autoencoder noise multiplier sigma1",
    "C1": "autoencoder clipping norm C1",
    "autoencoder_steps": "autoencoder steps",
}


def autoencoder_parameters(config: TwoPhaseConfig) -> dict[str, Any]:
    """Phase 1's public parameters, as AUTOENCODER_LABELS names them."""
    return {
        "q1": config.autoencoder_rate,
        "sigma1": config.autoencoder_noise,
        "C1": config.autoencoder_clip,
        "autoencoder_steps": config.autoencoder_steps,
    }


def critic_parameters(config: TwoPhaseConfig, phase: str) -> dict[str, Any]:
    """Phase 2's public parameters when it is the critic's DP-SGD, numbered `phase` as its paper does."""
    return {
        f"q{phase}": config.critic_rate,
        f"sigma{phase}": config.critic_noise,
        f"C{phase}": config.critic_clip,
        "updates_per_generator_step": config.critic_steps,
    }


def autoencoder_and_critic_phases(config: TwoPhaseConfig, step: int) -> list[Phase]:
    """The private updates after `step` steps as the trainer's accountant counts them: phase 1's
    autoencoder updates, then `critic_steps` critic updates per GAN step."""
    from dpsynth.models.privacy.dpsgd_accountant import Phase

    phases = [Phase(config.autoencoder_rate, config.autoencoder_noise, min(step, config.autoencoder_steps))]
    if step > config.autoencoder_steps:
        critic_updates = config.critic_steps * (step - config.autoencoder_steps)
        phases.append(Phase(config.critic_rate, config.critic_noise, critic_updates))
    return phases


def gan_checkpoint_steps(config: TwoPhaseConfig) -> list[int]:
    """Steps the trainer checkpoints at (two_phase/trainer.py `_checkpoint_due`) that selection sees: 0,
    the end of phase 1 and every checkpoint after it (before it the generator is untrained)."""
    total = config.autoencoder_steps + config.generator_steps
    every = config.checkpoint_every
    later = [s for s in range(config.autoencoder_steps + 1, total + 1) if s % every == 0 or s == total]
    return [0, config.autoencoder_steps] + later


def replace_one_epsilon_of(phases: list[Phase], profile: Profile) -> float:
    """The replace-one epsilon of `phases`: their add/remove-one RDP and the measured marginals' added
    order by order, converted once, then group privacy of two."""
    from dpsynth.models.marginals.release import ADD_REMOVE_ONE, marginals_rho
    from dpsynth.models.privacy.dpsgd_accountant import replace_one_epsilon

    return replace_one_epsilon(phases, profile.privacy.delta, extra_rho=marginals_rho(profile, ADD_REMOVE_ONE))


class TwoPhaseGenerator(GeneratorType):
    """A two-phase generator's adapter: its section is `profile.section(name)`."""

    mapped_rows = True  # batches and the one-off queries read from the prepared file (TrainingRows)

    def section_of(self, profile: Profile) -> Any:
        return profile.section(self.name)

    def phases_at(self, profile: Profile, step: int) -> list[Phase]:
        """The private updates of both phases after `step` steps, as the accountant composes them (a
        generator whose phase 2 is not the critic's DP-SGD says otherwise)."""
        return autoencoder_and_critic_phases(self.section_of(profile), step)

    def checkpoint_steps(self, profile: Profile) -> list[int]:
        """The steps selection sees: 0, the end of phase 1, every checkpoint after it."""
        return gan_checkpoint_steps(self.section_of(profile))

    def critic_phase_facts(
        self,
        config: TwoPhaseConfig,
        mechanism: str,
        composition: str,
        critic: str,
        parameters: dict[str, Any],
        labels: dict[str, str],
    ) -> PrivacyFacts:
        """The privacy facts when phase 2 is the critic's DP-SGD: both phases Poisson-subsampled Gaussian
        updates, composed by `composition` (the paper's name for adding their RDP), the critic's rate
        called q`critic` (each paper numbers its phases its own way)."""
        return PrivacyFacts(
            generator=self.label,
            mechanism=mechanism,
            accountant="RDP of the sampled Gaussian mechanism (Opacus's analysis), both phases added order by "
            f"order ({composition}), one composition per private update",
            conversion=DPSGD_CONVERSION,
            sampling=(
                f"each training row joins an autoencoder batch with probability q1 = {config.autoencoder_rate:g} "
                f"and a critic batch with probability q{critic} = {config.critic_rate:g}, independently"
            ),
            adjacency=DPSGD_ADJACENCY,
            sanitised=(
                "each autoencoder and each critic update clips every row's gradient and adds Gaussian noise "
                "to the sum; the released decoder and generator read the data only through them; the "
                "Poisson batches and the noise come from a secret drawn for the run"
            ),
            imputation=NO_DONORS,
            parameters=parameters,
            labels=labels,
        )

    def replace_one_epsilon_at(self, profile: Profile, step: int) -> float:
        return replace_one_epsilon_of(self.phases_at(profile, step), profile)

    def check(self, profile: Profile, setting: Setting, schema: DatasetSchema | None = None) -> None:
        require_private(self, setting)

    def schedule(self, profile: Profile, setting: Setting) -> Schedule:
        steps = self.checkpoint_steps(profile)
        return Schedule(
            tuple(steps),
            tuple(self.replace_one_epsilon_at(profile, s) for s in steps),
            self.section_of(profile).autoencoder_steps + 1,
            "raise the noise multipliers, or lower the sampling rates or the autoencoder's steps",
        )

    def train(self, trainer: Any, profile: Profile, plan: TrainingPlan, progress: Progress | None) -> FitResult:
        """Run `trainer` to the plan's last step; each checkpoint's replace-one epsilon beside its own."""

        def epsilon_at(step: int) -> float:
            return self.replace_one_epsilon_at(profile, step)

        return run_phased_trainer(trainer, plan, epsilon_at, progress)

    def checkpoint_interval(self, profile: Profile) -> int:
        return int(self.section_of(profile).checkpoint_every)
