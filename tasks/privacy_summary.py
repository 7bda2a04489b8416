"""The public description of a release's privacy setup (`privacy_summary`): what release.json, the release
notes, the registry tags and the reports show of the mechanism, every key labelled. Its own module, under
both the reports (tasks/reporting.py) and the public record (tasks/public_release.py), so that neither
imports the other to reach it.
"""

from __future__ import annotations

from collections.abc import Sequence

from dpsynth.models.config import Profile, Setting
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators import generator_for

# What a reader calls the summary's own keys; a generator labels its parameters and entries itself
# (models/generators/base.py `PrivacyFacts.labels`, `SummaryEntry`).
SUMMARY_LABELS = {
    "generator": "generator",
    "mechanism": "mechanism",
    "accountant": "accountant",
    "conversion": "RDP to (epsilon, delta) conversion",
    "sampling": "sampling",
    "adjacency": "adjacency",
    "unit": "unit of privacy",
    "delta": "delta",
    "epsilon_budget": "epsilon budget",
}


def privacy_summary(
    profile: Profile, settings: Sequence[Setting] | None = None, schema: DatasetSchema | None = None
) -> dict:
    """The public description of the privacy setup, keyed as the release notes expect, with "labels":
    {key: what a reader calls it} for every key whose value is not a mapping."""
    settings = profile.settings if settings is None else settings
    generator = generator_for(profile, settings[0])
    facts = generator.privacy_facts(profile, settings[0])
    summary = {
        "generator": facts.generator,
        "mechanism": facts.mechanism,
        "accountant": facts.accountant,
        "conversion": facts.conversion,
        "sampling": facts.sampling,
        "adjacency": facts.adjacency,
        "unit": "one row of the generator's training table",
        "delta": profile.privacy.delta,
        **facts.parameters,
        "epsilon_budget": profile.budget_for(settings[0]),
        "settings": {s.name: _public_setting(profile, s) for s in settings},
    }
    entries = generator.summary_entries(profile, schema)
    summary.update({key: entry.value for key, entry in entries.items()})
    if len(settings) > 1:
        for key in generator.setting_parameters:  # per setting, under "settings"
            summary.pop(key, None)
    if len({profile.generator_of(s) for s in settings}) > 1:
        summary["generator"] = "per setting"
        summary["mechanism"] = "per setting: " + "; ".join(
            f"{s.name}: {generator_for(profile, s).privacy_facts(profile, s).mechanism}" for s in settings
        )
    labels = {**SUMMARY_LABELS, **facts.labels, **{key: entry.label for key, entry in entries.items()}}
    unlabelled = [key for key, value in summary.items() if not isinstance(value, dict) and key not in labels]
    if unlabelled:
        raise ValueError(f"{generator.label} publishes parameters without a label: {', '.join(unlabelled)}")
    summary["labels"] = {key: labels[key] for key, value in summary.items() if not isinstance(value, dict)}
    return summary


def _public_setting(profile: Profile, setting: Setting) -> dict:
    """A setting's public description: its generator, what that generator shows of a setting (GS-WGAN:
    K), whether it is private, its budget."""
    out = {
        "generator": profile.generator_of(setting),
        "private": setting.private,
        **generator_for(profile, setting).public_setting(setting),
    }
    budget = profile.budget_for(setting)
    if budget is not None:
        out["epsilon_budget"] = budget
    return out
