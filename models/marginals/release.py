"""A release's measured marginals, from its profile: the cost every accountant adds to training's, the
plan the measurement stage runs, and the public facts that describe it.

The profile's `marginals.rho` is the whole measurement's zCDP under replace-one adjacency (its RDP at
order alpha is alpha rho: the Gaussian mechanism's, exactly, and the selection rounds' bound). It is a
function of the profile alone, so the plan before any data (`dpsynth epsilon`, the lifetime ledger's
preflight) already knows it. The measurement reads the same training rows as the generator, so the two
compose sequentially: each generator adds the curve to its training curve order by order, under its own
accountant's adjacency, before its one conversion (docs/privacy.md, "Measured marginals").

Under add/remove-one adjacency (the DP-SGD accountants' analysis) one row moves a count vector by L2 1
rather than sqrt(2), so a marginal measured at noise multiplier sigma costs 1 / (4 sigma^2), half its
replace-one rho, and a selection round at epsilon e costs (e/2)^2 / 8, a quarter of its replace-one rho
(`dpsynth.models.marginals.measure.rho_of`, `selection_rho`).
"""

from __future__ import annotations

from dpsynth.models.config import Profile
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.marginals.measure import MeasurementPlan, plan_for_rho

REPLACE_ONE = "replace-one"
ADD_REMOVE_ONE = "add/remove-one"


def enabled(profile: Profile) -> bool:
    return bool(profile.marginals.enabled)


def _split_rho(profile: Profile) -> tuple[float, float]:
    """(rho of the measurements, rho of the selection rounds), replace-one, as `plan_for_rho` splits it."""
    m = profile.marginals
    selecting = m.selection_share * m.rho if m.selections else 0.0
    return m.rho - selecting, selecting


def marginals_rho(profile: Profile, adjacency: str = REPLACE_ONE) -> float:
    """The measurement's zCDP under `adjacency` (0 when the profile measures nothing): what each
    accountant adds, times the order, to its training curve."""
    if not enabled(profile):
        return 0.0
    measuring, selecting = _split_rho(profile)
    if adjacency == REPLACE_ONE:
        return measuring + selecting
    if adjacency == ADD_REMOVE_ONE:
        return measuring / 2.0 + selecting / 4.0
    raise ValueError(f"adjacency must be {REPLACE_ONE} or {ADD_REMOVE_ONE}, got {adjacency!r}")


def measurement_plan(profile: Profile, schema: DatasetSchema) -> MeasurementPlan:
    """The plan the measurement stage runs: `marginals.rho` spread as `plan_for_rho` spreads it. Its own
    rho must not exceed what the accountants added (float rounding aside)."""
    m = profile.marginals
    plan = plan_for_rho(schema, m.rho, m.selections, m.selection_share, m.bins, m.shape_share)
    for adjacency in (REPLACE_ONE, ADD_REMOVE_ONE):
        if plan.rho(adjacency) > marginals_rho(profile, adjacency) * (1.0 + 1e-9):
            raise AssertionError(
                f"the measurement would spend rho {plan.rho(adjacency)!r} ({adjacency}), more "
                f"than the {marginals_rho(profile, adjacency)!r} accounted"
            )
    return plan


def public_parameters(profile: Profile) -> dict:
    """The measurement's public description for release.json, the registry tags and the notes (the
    number of marginals and their noise multiplier follow from these and the public schema, and are in
    the released generator file's plan)."""
    if not enabled(profile):
        return {}
    m = profile.marginals
    shared = {"marginals_selection_share": m.selection_share} if m.selections else {}
    return {
        "marginals": True,
        "marginals_rho": m.rho,
        "marginals_selections": m.selections,
        **shared,
        "marginals_bins": m.bins,
        "marginals_shape_share": m.shape_share,
        "marginals_oversample": m.oversample,
    }


# What a reader calls each key of `public_parameters` (the release notes' labels).
PUBLIC_LABELS = {
    "marginals": "measured marginals",
    "marginals_rho": "measured marginals' zCDP rho",
    "marginals_selections": "privately chosen marginal pairs",
    "marginals_selection_share": "share of rho spent choosing pairs",
    "marginals_bins": "bins per continuous column (marginals)",
    "marginals_shape_share": "share of rho spent on the continuous columns' fine 1-way histograms",
    "marginals_oversample": "rows drawn per released row (calibration)",
}


MECHANISM_PROSE = (
    "the 1-way marginal of every column and the 2-way marginal of every column with the target"
    "{selected}, counted on the training rows over public cells and released by the Gaussian "
    "mechanism (replace-one L2 sensitivity sqrt(2) per marginal; zCDP rho = {rho:g} in all, a share "
    "{shape_share:g} of it on every continuous column's fine 1-way histogram, which places a value inside its cell), "
    "composed with training order by order; every released row is then calibrated to them "
    "(post-processing)"
)


def mechanism_prose(profile: Profile) -> str | None:
    """One sentence for the privacy statement, or None when the profile measures nothing."""
    if not enabled(profile):
        return None
    m = profile.marginals
    selected = f", and {m.selections} more pairs chosen by the exponential mechanism" if m.selections else ""
    return MECHANISM_PROSE.format(selected=selected, rho=m.rho, shape_share=m.shape_share)
