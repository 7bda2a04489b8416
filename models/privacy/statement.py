"""The one statement of what epsilon covers, generated from the mechanism that actually ran.

docs/governance.md, the internal report, the release notes, `release.json` and the registry description all take
their text from `privacy_statement`, so they cannot disagree with each other or with the code: the
items listed as not covered are exactly the configuration's uncovered steps (none, for a release under
the shipped release profiles, beyond those any synthetic-data release shares).
"""

from __future__ import annotations

from dataclasses import dataclass

from dpsynth.models.config import Profile, Setting
from dpsynth.models.privacy.facts import PrivacyFacts

HEADING = "What epsilon covers, and what it does not"


@dataclass(frozen=True)
class PrivacyStatement:
    covers: str
    does_not_cover: tuple[str, ...]
    internal_only: str

    def as_dict(self) -> dict:
        return {
            "epsilon_covers": self.covers,
            "epsilon_does_not_cover": list(self.does_not_cover),
            "internal_only": self.internal_only,
        }

    def markdown(self) -> str:
        lines = [self.covers, "", "Epsilon does NOT cover:", ""]
        lines += [f"- {item}" for item in self.does_not_cover] or ["- nothing else."]
        return "\n".join(lines + ["", self.internal_only])


def privacy_statement(
    profile: Profile, setting: Setting, facts: PrivacyFacts, measured: str | None, *, release: bool
) -> PrivacyStatement:
    """The statement for `setting` trained under `profile` by the mechanism `facts` describes (its generator's
    `privacy_facts`); `measured`: the measured marginals' mechanism in prose, None when the profile measures
    none (models/marginals/release.py `mechanism_prose`, which sits above privacy: the caller passes it);
    `release`: a release (DP choice of the checkpoint and of publishing) rather than the experiment's
    internal study."""
    protocol = profile.protocol
    missing: list[str] = []
    if not setting.private:
        covers = (
            "Nothing: this generator was trained without clipping or noise (a non-private baseline, "
            "epsilon = infinity)."
        )
    else:
        covers = (
            "Epsilon (with delta) bounds, with respect to replacing any one row of the input table, "
            "everything published: the released generator's parameters, every row sampled from them "
            "and every statistic of those rows (post-processing of the differentially private "
            f"{facts.generator} generator; its training steps are sanitised: {facts.sanitised}"
        )
        if protocol == "honest":
            covers += f"; {facts.imputation}"
        if measured is not None:
            covers += f"; and the measured marginals: {measured}"
        if release:
            covers += (
                "), the choice of the released checkpoint among all those trained and the decision to "
                "publish (differentially private mechanisms on real validation rows, disjoint from the "
                "training rows)."
                if protocol == "honest"
                else "), the choice of the released checkpoint and the decision to publish (differentially "
                "private mechanisms on real validation rows, composed with training)."
            )
        else:
            covers += ")."
        if protocol == "thesis":
            missing.append(
                "the KNN imputation over all rows (thesis protocol): one row can change the imputed "
                "values of other training rows, so the guarantee holds for the imputed table, not "
                "the raw one"
            )
        if not release:
            missing.append(
                "this experiment's choice of a checkpoint per setting, made with classifiers' AUCs "
                "on real validation and test rows (an internal analysis: nothing is published)"
            )
    if setting.private:
        missing.append(
            "attacks on how the noise is computed rather than on its distribution: the guarantee is "
            "proved for exact Gaussian noise and exactly uniform draws; the code draws them with "
            "floating-point samplers from pseudo-random generators seeded from the run's secret "
            "(docs/privacy.md, section 4)"
        )
    if release:
        missing.append(
            "other releases of the same table: each adds its own epsilon to its rows' privacy loss; "
            "the table's privacy ledger composes them (dpsynth ledger)"
        )
    missing.append("whether the input table passed validation: a table that fails it is not released at all")
    if profile.input.max_repaired_share is not None:
        missing.append(
            "whether every column of the input table needed at most the share "
            f"{profile.input.max_repaired_share:g} of its values imputed (input.max_repaired_share): a table "
            "that needs more is not released at all"
        )
    if release and not profile.trial:
        # The check compares the input's hash (Python API: of the frame as written), a fact of the rows; kept
        # because a schedule whose extract nobody replaced is the common mistake it catches.
        missing.append(
            "the same-input refusal: a release whose input is byte for byte the one the table's last counted "
            "release read is refused before any work unless --allow-same-input (allow_same_input in the "
            "Python API) is given, so a refusal, or a scheduled release that did not happen, reveals that "
            "not one row changed since that release"
        )
    missing.append(
        "configuration chosen by people after seeing results on the same table, if any (dpsynth's shipped "
        "profiles were tuned on runs of the Cardio table)"
    )
    internal = (
        "Internal only, never published (and not covered by epsilon): the run folder and the internal "
        "MLflow run, with the real data, its validation results, real-data AUCs and statistics, the "
        "networks that read the rows (discriminators, encoders), and the run's privacy secret."
    )
    return PrivacyStatement(covers, tuple(missing), internal)
