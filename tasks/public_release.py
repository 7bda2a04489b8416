"""The one public record of a release: everything it publishes about itself, built and guarded once.

`build_public_release` gathers, from the DP decision, the privacy summary and the profile, every fact
that the release's bundle (release.json), its notes (RELEASE_NOTES.md) and its registered version (tags
and description) show, into a frozen `PublicRelease`. The record refuses, when it is made, any key that
names a real-data fact or an internal model part (`guard`); renderers only lay its fields out
(`dpsynth.tasks.bundle.release_json`, `dpsynth.tasks.report.write_public_release_notes`,
`dpsynth.tasks.registry.release_tags` and `release_description`), so the three cannot disagree.
"""

from __future__ import annotations

import copy
import importlib.metadata
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dpsynth.models.config import Profile, Setting
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.privacy.release_choice import ReleaseDecision
from dpsynth.models.privacy.statement import PrivacyStatement
from dpsynth.tasks.decision import statement_for

# Key names that would carry real-data facts or internal model parts into what is published.
FORBIDDEN_KEY = re.compile(
    r"auc|accuracy|real|critic|discriminator_loss|wasserstein|loss|imputation|"
    r"validation|data_sha|n_train|train_rows|fidelity|tvd|quantile|kolmogorov|spearman",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Checkpoint:
    """A trained checkpoint and training's epsilon up to it (infinity for a non-private setting)."""

    iteration: int
    epsilon: float


@dataclass(frozen=True)
class PublicRelease:
    """What a release publishes about itself. Every field is public configuration, the output of the
    privacy accountant or of the DP decision, or the code's version; none depends on the rows otherwise.
    Made through `build_public_release`; `guard` runs whenever one is made."""

    release_id: str
    model_name: str  # the registered model the release becomes a version of
    dataset: str  # the schema's name
    schema_version: int
    profile: str
    setting: str
    generator: str  # the generator's key (gswgan, dpcgan, dpautogan)
    generator_name: str  # its name in prose (GS-WGAN)
    private: bool  # whether the setting trains with clipping and noise
    iteration: int  # the released checkpoint
    checkpoints: tuple[Checkpoint, ...]  # every trained checkpoint; the last is what the accountant composed
    epsilon: float  # the whole release's: training to the last checkpoint with the DP decision
    epsilon_training: float
    epsilon_choice: float
    composition: str  # how the training's and the decision's epsilons combine
    delta: float
    epsilon_budget: float | None
    mechanism: str  # what the accountant composes
    sampling: str
    parameters: dict  # the generator's public accountant inputs (K, sigma, C, batch size, ...)
    measured: dict  # the measured marginals' public numbers (how many, their noise); {} without
    choice_epsilon: float  # the profile's epsilon for the DP choice of the checkpoint
    approval_epsilon: float | None  # and for the DP approval, when the profile asks for one
    privacy: dict  # the privacy summary of the setting, with its "labels" for the notes
    statement: PrivacyStatement
    rows: int  # synthetic rows published (the profile's release_rows: a public number)
    code_version: str

    def __post_init__(self) -> None:
        guard(self)

    @property
    def trained_iterations(self) -> int:
        """T: the last checkpoint trained, up to which the accountant composed (not the released one)."""
        return self.checkpoints[-1].iteration


def _forbidden_keys(obj: object, where: str = "") -> list[str]:
    found = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            path = f"{where}.{key}" if where else str(key)
            if FORBIDDEN_KEY.search(str(key)):
                found.append(path)
            found += _forbidden_keys(value, path)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            found += _forbidden_keys(value, f"{where}[{i}]")
    return found


def guard(release: PublicRelease) -> None:
    """The one check that a release publishes only public or DP-covered facts: no key of its published
    mappings (accountant inputs, measured numbers, privacy summary and its labels) names a real-data
    fact or an internal part, and the released checkpoint is one of those trained. Raises ValueError."""
    bad = _forbidden_keys({"parameters": release.parameters, "measured": release.measured, "privacy": release.privacy})
    if bad:
        raise ValueError(f"a release must publish only DP-covered or public facts; refusing keys {bad}.")
    if not release.checkpoints:
        raise ValueError("a release needs the training ledger's checkpoints.")
    if release.iteration not in [c.iteration for c in release.checkpoints]:
        raise ValueError(f"iteration {release.iteration} is not in the training ledger.")


def code_version() -> str:
    """`git describe` of the project when it is a git checkout, else the installed package version."""
    root = Path(__file__).resolve().parents[1]
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--tags"],
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        )
        if done.returncode == 0 and done.stdout.strip():
            return f"git:{done.stdout.strip()}"
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return f"dpsynth=={importlib.metadata.version('dpsynth')}"
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_public_release(
    *,
    release_id: str,
    model_name: str,
    schema: DatasetSchema,
    profile: Profile,
    setting: Setting,
    decision: ReleaseDecision,
    ledger: list[dict],
    measured: dict | None = None,
) -> PublicRelease:
    """The record of the release of `setting`'s checkpoint `decision.iteration`.

    `ledger`: the training ledger's checkpoints ({"iteration", "epsilon", ...}: only those two are
    kept). `measured`: the measured marginals' public numbers read from the released generator
    (`dpsynth.tasks.marginals.released_parameters`); missing ones are left out.
    """
    from dpsynth.models.generators import generator_for
    from dpsynth.tasks.privacy_summary import privacy_summary

    facts = generator_for(profile, setting).privacy_facts(profile, setting)
    summary = privacy_summary(profile, [setting], schema)
    return PublicRelease(
        release_id=release_id,
        model_name=model_name,
        dataset=schema.name,
        schema_version=int(schema.version),
        profile=profile.name,
        setting=setting.name,
        generator=profile.generator_of(setting),
        generator_name=facts.generator,
        private=bool(setting.private),
        iteration=int(decision.iteration),
        checkpoints=tuple(Checkpoint(int(e["iteration"]), float(e["epsilon"])) for e in ledger),
        epsilon=float(decision.epsilon),
        epsilon_training=float(decision.epsilon_training),
        epsilon_choice=float(decision.epsilon_choice),
        composition=decision.composition,
        delta=float(profile.privacy.delta),
        epsilon_budget=profile.budget_for(setting),
        mechanism=summary["mechanism"],
        sampling=summary["sampling"],
        parameters=copy.deepcopy(facts.parameters),
        measured={k: v for k, v in (measured or {}).items() if v is not None},
        choice_epsilon=profile.privacy.choice_epsilon,
        approval_epsilon=(profile.privacy.approval_epsilon if profile.evaluation.min_release_auc is not None else None),
        privacy=copy.deepcopy(summary),
        statement=statement_for(profile, setting, release=True),
        rows=int(profile.release_rows),
        code_version=code_version(),
    )
