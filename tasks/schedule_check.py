"""A release schedule that knows its budget: deploying one that the table's lifetime budget would stop is
refused, with the forecast, before it ever runs.

How many runs are forecast: the profile's own end (`privacy.planned_releases`, or the schedule's runs
until `privacy.releases_until`), whichever comes first; without one, the next `HORIZON` runs. The schedule
is refused when the lifetime budget would refuse one of those runs: a schedule that fails every month from
month 7 on is a schedule nobody planned. prefect.yaml runs `check_deployment_schedule` as a build step of
the scheduled release, so `prefect deploy` stops there.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from pathlib import Path
from zoneinfo import ZoneInfo

import yaml
from cronsim import CronSim

from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.defaults import DEFAULT_RELEASE_PROFILE
from dpsynth.models.errors import BudgetExceededError, ConfigError
from dpsynth.models.profiles import load_named
from dpsynth.tasks.decision import planned_release_cost
from dpsynth.tasks.ledger import forecast, require_lifetime_budget

HORIZON = 12
RELEASE_ENTRYPOINT = "flows/release.py:release"


def cron_runs_until(cron: str, timezone: str, until: str, start: datetime) -> int:
    """How many times `cron` fires after `start` up to the end of the day `until` (in `timezone`)."""
    zone = ZoneInfo(timezone)
    end = datetime.combine(date.fromisoformat(until), time.max, tzinfo=zone)
    runs = 0
    for moment in CronSim(cron, start.astimezone(zone)):
        if moment > end:
            return runs
        runs += 1
        if runs > 10_000:  # an every-minute schedule over years: far past any budget anyway
            return runs
    return runs


def check_schedule(config: str, profile: str, cron: str, timezone: str = "UTC", now: datetime | None = None) -> dict:
    """The forecast of a release schedule, or BudgetExceededError (exit 5) naming the run the lifetime
    budget would refuse and what the profile should declare instead."""
    prof = load_named(profile, config)
    if prof.trial:
        return {"profile": prof.name, "runs": 0, "trial": True}
    require_lifetime_budget(prof)
    schema = DatasetSchema.from_yaml(config)
    ends = {}
    if prof.privacy.planned_releases is not None:
        ends["privacy.planned_releases"] = prof.privacy.planned_releases
    if prof.privacy.releases_until is not None:
        ends["privacy.releases_until"] = cron_runs_until(
            cron, timezone, prof.privacy.releases_until, now or datetime.now(UTC)
        )
    runs = min(ends.values()) if ends else HORIZON
    result = forecast(
        schema.name, planned_release_cost(prof, prof.release_target()), runs, prof.privacy.lifetime_budget
    )
    result.update({"profile": prof.name, "runs": runs, "declared_end": sorted(ends) or None})
    if result["stops_at"] is not None:
        raise BudgetExceededError(_refusal(schema.name, prof.name, cron, result, ends))
    return result


def _refusal(dataset: str, profile: str, cron: str, result: dict, ends: dict) -> str:
    stops, per = result["stops_at"], result["planned_release_epsilon"]
    fits = stops - 1
    spent = ", ".join("inf" if v is None else f"{v:.2f}" for v in result["after"][:stops])
    planned = (
        f"it plans {result['runs']} run(s) ({' and '.join(ends)})"
        if ends
        else f"the profile declares no end (privacy.planned_releases or privacy.releases_until), so its next "
        f"{HORIZON} runs were forecast"
    )
    return (
        f"Refusing the release schedule '{cron}' of profile {profile!r} for table {dataset!r}: {planned}, and "
        f"the lifetime budget of {result['lifetime_budget']:g} would refuse run {stops} (each release costs at "
        f"most epsilon {per:.2f}; the table's lifetime spending after each run: {spent}). Nothing was "
        f"deployed. Declare where the schedule ends in the profile (privacy.planned_releases: {fits} fits), "
        "or release less often."
    )


def check_deployment_schedule(deployment: str, prefect_file: str = "prefect.yaml") -> dict:
    """The Prefect build step: check every active cron schedule of `deployment` (a release) in
    `prefect_file` against its parameters' schema and profile."""
    spec = yaml.safe_load(Path(prefect_file).read_text())
    found = [d for d in spec.get("deployments", []) if d.get("name") == deployment]
    if not found:
        raise ConfigError(f"{prefect_file} declares no deployment named {deployment!r}.")
    parameters = found[0].get("parameters") or {}
    results = []
    for schedule in found[0].get("schedules") or []:
        if schedule.get("cron") and schedule.get("active", True):
            results.append(
                check_schedule(
                    parameters.get("config", "configs/cardio.yaml"),
                    parameters.get("profile", DEFAULT_RELEASE_PROFILE),
                    schedule["cron"],
                    schedule.get("timezone") or "UTC",
                )
            )
    return {"schedules_checked": len(results), "forecasts": results}
