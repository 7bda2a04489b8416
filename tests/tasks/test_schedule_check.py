"""Deploying a schedule forecasts it: refused, with the forecast, when the lifetime budget would stop it
within its planned runs (the profile's end, else 12)."""

from datetime import UTC, datetime

import pytest
import yaml

from dpsynth.models.errors import BudgetExceededError
from dpsynth.models.profiles import load_named
from dpsynth.tasks import ledger
from dpsynth.tasks.decision import planned_release_cost
from dpsynth.tasks.schedule_check import check_deployment_schedule, check_schedule, cron_runs_until
from tests.conftest import CARDIO_SCHEMA, ROOT

MONTHLY = "0 2 1 * *"
NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def _profile(tmp_path, **privacy) -> str:
    (tmp_path / "profiles").mkdir(exist_ok=True)
    (tmp_path / "profiles" / "default.yaml").write_text((ROOT / "configs" / "profiles" / "default.yaml").read_text())
    path = tmp_path / "profiles" / "scheduled.yaml"
    path.write_text(yaml.safe_dump({"extends": "default", "privacy": privacy}))
    return str(path)


def test_the_shipped_monthly_schedule_declares_six_releases_and_they_fit(private_home):
    result = check_schedule(str(CARDIO_SCHEMA), "default", MONTHLY, now=NOW)
    assert result["runs"] == 6 and result["stops_at"] is None and 25.0 < result["after"][-1] <= 30.0
    assert check_deployment_schedule("monthly-release", str(ROOT / "prefect.yaml"))["schedules_checked"] == 1


def test_a_schedule_without_an_end_that_the_budget_stops_within_twelve_runs_is_refused(tmp_path, private_home):
    with pytest.raises(BudgetExceededError) as refused:
        check_schedule(str(CARDIO_SCHEMA), _profile(tmp_path, planned_releases=None), MONTHLY, now=NOW)
    text = str(refused.value)
    assert refused.value.exit_code == 5 and "12 runs" in text and "refuse run 7" in text
    assert "privacy.planned_releases: 6 fits" in text and "Nothing was deployed" in text


def test_an_end_date_counts_the_schedules_runs(tmp_path, private_home):
    assert cron_runs_until(MONTHLY, "UTC", "2027-05-15", NOW) == 6  # December to May
    assert cron_runs_until(MONTHLY, "UTC", "2027-05-01", NOW) == 6  # the run at 02:00 on the last day
    ok = check_schedule(
        str(CARDIO_SCHEMA), _profile(tmp_path, planned_releases=None, releases_until="2027-05-15"), MONTHLY, now=NOW
    )
    assert ok["runs"] == 6 and ok["declared_end"] == ["privacy.releases_until"]
    with pytest.raises(BudgetExceededError, match="refuse run 7"):
        check_schedule(
            str(CARDIO_SCHEMA), _profile(tmp_path, planned_releases=None, releases_until="2027-12-31"), MONTHLY, now=NOW
        )


def test_the_forecast_starts_from_what_the_table_has_already_spent(private_home):
    profile = load_named("default", str(CARDIO_SCHEMA))
    cost = planned_release_cost(profile, profile.release_target())
    for k in range(3):
        ledger.enter("cardio", f"r{k}", cost, None, profile="eps1")
    with pytest.raises(BudgetExceededError, match="refuse run 4"):
        check_schedule(str(CARDIO_SCHEMA), "default", MONTHLY, now=NOW)
