"""GS-WGAN (the thesis) behind the generator interface: K critics pretrained on disjoint
secret subsets of the training rows, then the generator trained through the sanitised gradients of
the critics its rows query (pretraining.py, trainer.py), accounted by models/privacy/accountant.py."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dpsynth.models.config import Profile, Setting
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators.base import (
    ADJACENCY,
    FitResult,
    GeneratorType,
    PrivacyFacts,
    Progress,
    Schedule,
    SummaryEntry,
    TrainingJob,
    TrainingPlan,
    target_prior_entry,
)
from dpsynth.models.generators.gswgan.config import discriminators
from dpsynth.models.marginals.release import REPLACE_ONE, marginals_rho
from dpsynth.models.privacy.accountant import mechanism_name
from dpsynth.models.privacy.secret import PrivacySecret

if TYPE_CHECKING:
    from dpsynth.models.privacy.lifetime import TrainingCurve

# What a reader calls each public parameter (the release notes' labels).
LABELS = {
    "K": "discriminators K",
    "batch_size": "batch size B",
    "sigma": "noise multiplier sigma",
    "C": "clipping norm C",
    "discriminator_draw": "discriminator draw",
    "discriminator_refresh": "discriminator refresh schedule",
}


class GSWGAN(GeneratorType):
    name = "gswgan"
    label = "GS-WGAN"
    prepare_name = "pretrain"
    # K is a setting's: a summary of several settings shows it per setting.
    setting_parameters = ("K",)

    def check(self, profile: Profile, setting: Setting, schema: DatasetSchema | None = None) -> None:
        discriminators(setting)

    def uncovered_in_release(self, profile: Profile, setting: Setting) -> str | None:
        if setting.private and profile.gan.critic_draw != "per_row":
            return (
                f"Profile {profile.name!r} trains with gan.critic_draw {profile.gan.critic_draw!r} (one critic "
                "for all rows of a step, the thesis' Algorithm 2): its true epsilon is far above any useful "
                "budget, so a release refuses it. Use critic_draw: per_row, or run it as an experiment to "
                "reproduce the thesis."
            )
        if setting.private and profile.gan.critic_refresh != "independent":
            return (
                f"Profile {profile.name!r} refreshes the critics its rows query (gan.critic_refresh "
                f"{profile.gan.critic_refresh!r}, official GS-WGAN): a critic's state then records which "
                "critics earlier rows queried, which the accountant's composition does not cover, so a "
                "release refuses it. Use critic_refresh: independent, or run it as an experiment."
            )
        return None

    def schedule(self, profile: Profile, setting: Setting) -> Schedule:
        from dpsynth.models.generators.gswgan.schedule import checkpoint_epsilons

        steps, eps = checkpoint_epsilons(profile.gan, profile.privacy, setting, marginals_rho(profile, REPLACE_ONE))
        return Schedule(
            tuple(steps),
            tuple(eps),
            profile.gan.checkpoint_every,
            "use more discriminators, fewer iterations between checkpoints or a larger noise multiplier",
        )

    def training_curve(self, profile: Profile, setting: Setting, trained_iterations: int) -> TrainingCurve:
        from dpsynth.models.privacy.lifetime import TrainingCurve

        return TrainingCurve(
            discriminators(setting),
            int(trained_iterations),
            profile.gan.batch_size,
            profile.privacy.noise_multiplier,
            profile.gan.critic_draw,
            marginals_rho(profile, REPLACE_ONE),
        )

    def donor_groups(self, n_rows: int, profile: Profile, setting: Setting, secret: PrivacySecret) -> list[np.ndarray]:
        # A row's gaps are imputed from its own critic's subset: that critic depends on the row anyway.
        from dpsynth.models.generators.gswgan.partition import make_partition

        partition = make_partition(n_rows, discriminators(setting), secret)
        return [members[members >= 0] for members in partition]

    @staticmethod
    def _condition(job: TrainingJob) -> tuple[int, float] | None:
        from dpsynth.models.generators.gswgan.generator_files import target_condition

        encoder = TableEncoder(job.schema)
        return target_condition(job.profile.gan, encoder.target_index, encoder.block(job.schema.target).column.kind)

    def prepare(self, job: TrainingJob, progress: Progress | None = None) -> tuple[dict, dict]:
        """Algorithm 1: pretrain K critics, each on its own subset."""
        import torch  # here: planning a release (its budget, the refusals) needs no torch

        from dpsynth.models.generators.gswgan.devices import kernels_in_use, resolve_device
        from dpsynth.models.generators.gswgan.partition import make_partition, subset_sizes
        from dpsynth.models.generators.gswgan.pretraining import pretrain_critics

        prof, setting = job.profile, job.setting
        partition = make_partition(len(job.data), discriminators(setting), job.secret)
        np.save(job.directory / "partition.npy", partition)
        device = resolve_device(prof.device)
        critics = pretrain_critics(
            torch.from_numpy(job.data),
            partition,
            prof.gan,
            TableEncoder(job.schema).head_groups(),
            prof.seed,
            device,
            progress=None if progress is None else (lambda it: progress(it, "")),
            condition=self._condition(job),
            task_map=job.task_map,
        )
        torch.save(critics.state_dict(), job.directory / "critics.pt")
        sizes = subset_sizes(partition)
        return (
            {"partition": job.directory / "partition.npy", "critics": job.directory / "critics.pt"},
            {
                "discriminators": setting.discriminators,
                "subset_rows": [int(sizes.min()), int(sizes.max())],
                "kernels": kernels_in_use(prof.gan, device),
                "pretrain_iterations": prof.gan.pretrain_iterations,
            },
        )

    def prepare_units(self, profile: Profile) -> int:
        return profile.gan.pretrain_iterations

    def fit(self, job: TrainingJob, prepared: Path, plan: TrainingPlan, progress: Progress | None = None) -> FitResult:
        """Algorithm 2 to the planned last checkpoint, resuming from its own last checkpoint."""
        import torch  # here: planning a release (its budget, the refusals) needs no torch

        from dpsynth.models.generators.gswgan.devices import resolve_device
        from dpsynth.models.generators.gswgan.trainer import GeneratorTrainer
        from dpsynth.models.generators.networks import CriticStack

        prof, setting = job.profile, job.setting
        encoder = TableEncoder(job.schema)
        device = resolve_device(prof.device)
        state = torch.load(prepared / "critics.pt", map_location=device, weights_only=False)
        critics = CriticStack.from_params([p.to(device) for p in state["params"]], state["batchnorm"])
        trainer = GeneratorTrainer(
            torch.from_numpy(job.data),
            np.load(prepared / "partition.npy"),
            critics,
            prof.gan,
            prof.privacy,
            setting,
            encoder.head_groups(),
            prof.seed,
            job.directory / "checkpoints",
            device,
            job.secret,
            level_share_fn=encoder.level_shares,
            condition=self._condition(job),
            marginals_rho=marginals_rho(prof, REPLACE_ONE) if setting.private else 0.0,
        )
        reached = [""]

        def checkpoint(_: int, eps: float) -> None:
            reached[0] = f"epsilon {eps:.3f}"

        result = trainer.run(
            plan.last, progress=checkpoint, on_step=None if progress is None else (lambda it: progress(it, reached[0]))
        )
        return FitResult(
            result.checkpoints,
            result.seconds,
            info={"critic_updates": "native" if trainer.native_critics else "torch"},
            internal_metrics={"critic_wasserstein": result.metrics},
            resume_notes=trainer.resume_notes,
        )

    def training_facts(self, profile: Profile, setting: Setting) -> PrivacyFacts:
        gan, privacy = profile.gan, profile.privacy
        per_row = gan.critic_draw == "per_row"
        sanitised = (
            "each generated row queries its own discriminator, drawn uniformly and independently among "
            "the K, accounted as T x B subsampled Gaussian queries"
            if per_row
            else "all B generated rows of a step query one discriminator (the thesis' Algorithm 2), "
            "accounted as T subsampled Gaussian queries at noise multiplier sigma / sqrt(B), whose "
            "epsilon is far larger"
        )
        refreshed = (
            "; the discriminators trained before each step are drawn apart from those queried, so none "
            "records which earlier rows queried it"
            if gan.critic_refresh == "independent"
            else "; the discriminators queried are trained before each query (official GS-WGAN), so their "
            "state records earlier draws, which the composition does not cover"
        )
        return PrivacyFacts(
            generator=self.label,
            mechanism=mechanism_name(gan.critic_draw),
            accountant=(
                "analytical RDP (autodp), composed T x B times"
                if per_row
                else "analytical RDP (autodp) at noise multiplier sigma / sqrt(B), composed T times"
            ),
            conversion="classic: epsilon = min over orders a of RDP(a) + log(1/delta)/(a - 1)",
            sampling=(
                "each sanitised row queries one of K discriminators, drawn independently (probability "
                "1/K); each discriminator trained on a disjoint subset"
                if per_row
                else "one of K discriminators per step for all B rows (probability 1/K); each trained on a "
                "disjoint subset"
            ),
            adjacency=f"{ADJACENCY} (sensitivity 2C)",
            sanitised=(
                sanitised + refreshed + "; the split of the rows, each discriminator's subset, the draws "
                "and the noise come from a secret drawn for the run"
            ),
            imputation="the KNN imputation of a training row uses donors of its own discriminator's subset only",
            parameters={
                "K": setting.discriminators,
                "batch_size": gan.batch_size,
                "sigma": privacy.noise_multiplier,
                "C": privacy.clip,
                "discriminator_draw": gan.critic_draw,
                "discriminator_refresh": gan.critic_refresh,
            },
            labels=LABELS,
        )

    def checkpoint_interval(self, profile: Profile) -> int:
        return profile.gan.checkpoint_every

    def public_setting(self, setting: Setting) -> dict:
        return {"discriminators": setting.discriminators} if setting.discriminators is not None else {}

    def summary_entries(self, profile: Profile, schema: DatasetSchema | None = None) -> dict[str, SummaryEntry]:
        gan = profile.gan
        entries = {
            "iterations": SummaryEntry("generator iterations (planned)", gan.iterations),
            "checkpoint_every": SummaryEntry("checkpoint every (iterations)", gan.checkpoint_every),
        }
        if gan.condition_on_target:
            # A conditional generator's target share is its public prior, not something learned from the rows.
            entries["target_labels"] = target_prior_entry(gan.target_prior, schema)
        return entries
