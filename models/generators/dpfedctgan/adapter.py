"""DP-Fed-CTGAN behind the generator interface. `fit` splits the training rows among the sites
(sites.py), starts the federation (federation/launcher.py: a Flower SuperLink and one SuperNode process
per site on this machine) and reads back the server's checkpoints; every epsilon is the worst site's
replace-one epsilon (privacy.py), at the profile's delta, with the measured marginals' where measured."""

from __future__ import annotations

import json
from pathlib import Path

from dpsynth.models.config import Profile, Setting
from dpsynth.models.data.encoding import TableEncoder
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
    SummaryEntry,
    TrainingJob,
    TrainingPlan,
    require_private,
)
from dpsynth.models.generators.dpfedctgan.config import DPFedCTGANConfig
from dpsynth.models.generators.dpfedctgan.privacy import counts_rho, planned_site_phase, release_epsilon
from dpsynth.models.generators.dpfedctgan.sites import check_split, describe_split

LABELS = {
    "q": "sampling rate q (per site)",
    "sigma": "noise multiplier sigma",
    "C": "clipping norm C",
    "local_steps": "discriminator updates per site per round",
    "counts_noise": "noise multiplier of each site's counts",
    "sites": "how rows are split among sites",
}
FEDERATION_FOLDER = "federation"
LEDGER_FILE = "federation.json"


def _marginals_rho(profile: Profile) -> float:
    from dpsynth.models.marginals.release import ADD_REMOVE_ONE, marginals_rho

    return marginals_rho(profile, ADD_REMOVE_ONE)


def planned_epsilon(profile: Profile, rounds: int) -> float:
    """The replace-one epsilon after `rounds` rounds: every site runs the same query, so the worst site's
    is any site's."""
    c: DPFedCTGANConfig = profile.dpfedctgan
    return release_epsilon(
        [([planned_site_phase(c, rounds)], counts_rho(c))], profile.privacy.delta, _marginals_rho(profile)
    )


def recorded_epsilon(profile: Profile, entry: dict) -> float:
    """The replace-one epsilon of a checkpoint from what each site's accountant recorded."""
    from dpsynth.models.privacy.dpsgd_accountant import DPSGDAccountant

    sites = [
        (DPSGDAccountant.from_state_dict(phases).phases, float(rho))
        for phases, rho in zip(entry["site_phases"], entry["counts_rho"], strict=True)
    ]
    return release_epsilon(sites, profile.privacy.delta, _marginals_rho(profile))


class DPFedCTGAN(GeneratorType):
    name = "dpfedctgan"
    label = "DP-Fed-CTGAN"

    def check(self, profile: Profile, setting: Setting, schema: DatasetSchema | None = None) -> None:
        require_private(self, setting)
        if schema is not None:
            check_split(profile.dpfedctgan, schema)

    def schedule(self, profile: Profile, setting: Setting) -> Schedule:
        c: DPFedCTGANConfig = profile.dpfedctgan
        rounds = list(range(0, c.rounds + 1, c.checkpoint_every))
        if rounds[-1] != c.rounds:
            rounds.append(c.rounds)
        return Schedule(
            tuple(rounds),
            tuple(planned_epsilon(profile, r) for r in rounds),
            1,
            "raise dpfedctgan.noise_multiplier or dpfedctgan.counts_noise, or lower dpfedctgan.sample_rate, "
            "local_steps or checkpoint_every",
        )

    def fit(self, job: TrainingJob, prepared: Path, plan: TrainingPlan, progress: Progress | None = None) -> FitResult:
        import time

        from dpsynth.models.generators.dpfedctgan.federation.job import FederationJob
        from dpsynth.models.generators.dpfedctgan.federation.launcher import run_federation
        from dpsynth.models.generators.dpfedctgan.networks import FedGeneratorSpec
        from dpsynth.models.generators.dpfedctgan.sites import split_rows

        start = time.perf_counter()
        c: DPFedCTGANConfig = job.profile.dpfedctgan
        checkpoints = job.directory / "checkpoints"
        groups = tuple(TableEncoder(job.schema).head_groups())
        spec = FedGeneratorSpec(c.z_dim, c.generator_hidden, int(job.data.shape[1]), groups)
        site_rows = [job.data[i] for i in split_rows(job.data, job.schema, c, job.secret)]
        fed_job = FederationJob(c, spec, job.profile.seed, len(site_rows), plan.last, str(checkpoints))
        if self._completed(checkpoints) < plan.last or not (checkpoints / LEDGER_FILE).exists():

            def on_round(done: int) -> None:
                if progress is not None:
                    progress(done, f"round {done} of {plan.last}")

            timeout = c.connect_timeout_s + (plan.last + 1) * c.round_timeout_s
            run_federation(job.directory / FEDERATION_FOLDER, fed_job, site_rows, job.secret, timeout, on_round)
        entries = json.loads((checkpoints / LEDGER_FILE).read_text())["checkpoints"]
        ledger = [
            {
                "iteration": e["iteration"],
                "epsilon": recorded_epsilon(job.profile, e),
                "generator": e["generator"],
                "sha256": e["sha256"],
            }
            for e in entries
            if e["iteration"] <= plan.last
        ]
        return FitResult(ledger, time.perf_counter() - start, info={"sites": len(site_rows)})

    @staticmethod
    def _completed(checkpoints: Path) -> int:
        path = checkpoints / LEDGER_FILE
        return int(json.loads(path.read_text())["round"]) if path.exists() else -1

    def training_facts(self, profile: Profile, setting: Setting) -> PrivacyFacts:
        c: DPFedCTGANConfig = profile.dpfedctgan
        return PrivacyFacts(
            generator=self.label,
            mechanism=(
                "at every site, on its own rows only: once, Gaussian noise on its row count and level counts "
                "(noise counts_noise times their sensitivity); then Poisson-subsampled Gaussian (DP-SGD) on "
                "its copy of the discriminator, local_steps updates per federated round; the server averages "
                "the sites' weights (FedAvg by noisy row counts): post-processing"
            ),
            accountant=(
                "each site: RDP of the sampled Gaussian mechanism (Opacus's analysis), one composition per "
                "discriminator update, plus its counts' zCDP (order x rho); sites hold disjoint rows: the "
                "release's epsilon is the worst site's (parallel composition)"
            ),
            conversion=DPSGD_CONVERSION,
            sampling=(
                f"at each site, each of its rows joins a discriminator batch independently with probability "
                f"q = {c.sample_rate:g}; {describe_split(c)}"
            ),
            adjacency=DPSGD_ADJACENCY,
            sanitised=(
                "each discriminator update clips every real row's gradient to C and adds Gaussian noise (noise "
                "multiplier sigma) to their sum, divided by q times the site's noisy row count; a site sends "
                "the server only its noisy counts (once) and its weights after each round; the server never "
                "sees a row; the batches, the noise and an IID split come from a secret drawn for the run"
            ),
            imputation=NO_DONORS,
            parameters={
                "q": c.sample_rate,
                "sigma": c.noise_multiplier,
                "C": c.clip,
                "local_steps": c.local_steps,
                "counts_noise": c.counts_noise,
                "sites": describe_split(c),
            },
            labels=LABELS,
        )

    def checkpoint_interval(self, profile: Profile) -> int:
        return int(profile.dpfedctgan.checkpoint_every)

    def summary_entries(self, profile: Profile, schema: DatasetSchema | None = None) -> dict[str, SummaryEntry]:
        return {
            "federation": SummaryEntry(
                "federation",
                "Flower's deployment engine: one SuperLink (the server), one SuperNode per site; each site's rows "
                "never leave it; what a site sends: its noisy counts once, its model weights after each round",
            )
        }
