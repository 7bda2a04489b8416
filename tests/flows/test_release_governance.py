"""No release stops on its rows, and a profile's schedule ends where it says: a split that drew no row of
a target level publishes as any other (the missing level recorded internally), and a release past the
profile's `planned_releases` or `releases_until` is refused before any work."""

import json

import numpy as np
import pytest
import yaml

from dpsynth.flows.cli import main
from dpsynth.models.config import load_profile
from dpsynth.models.privacy.secret import PrivacySecret
from dpsynth.tasks import ledger
from dpsynth.tasks.decision import planned_release_cost
from tests.conftest import CARDIO_SCHEMA, TEST_SECRET_HEX


@pytest.fixture
def fixed_secret(monkeypatch):
    """Every run draws the test secret (a release never accepts a fixed one: this is the test's hand)."""
    secret = PrivacySecret.from_hex(TEST_SECRET_HEX)
    monkeypatch.setattr(PrivacySecret, "generate", classmethod(lambda cls: secret))
    return secret


def test_a_split_without_a_row_of_the_rarer_level_publishes_and_records_it_internally(
    isolated_workdir, demo_frame, cardio_schema, fixed_secret, smoke_release, capfd
):
    # The rarer target level has 5 rows, all of which the test secret puts in the training split: the
    # validation and test splits lack it. The release goes on as with any other table (no stop on a fact
    # of the rows: docs/privacy.md, section 12) and records the missing level in its run folder only.
    draws = fixed_secret.numpy("split").random(len(demo_frame))
    rare = np.flatnonzero(draws < 0.5)[:5]
    table = demo_frame.copy()
    table["cardio"] = 0
    table.loc[rare, "cardio"] = 1
    data = isolated_workdir / "five-rare.csv"
    table.to_csv(data, sep=cardio_schema.separator, index=False)
    argv = ["release", "--config", str(CARDIO_SCHEMA), "--data", str(data), "--profile", smoke_release]

    assert main(argv) == 0
    err = capfd.readouterr().err
    assert "Traceback" not in err and "no row with target" not in err
    [entry] = ledger.entries("cardio")
    assert entry.status == "published"
    [run] = (isolated_workdir / "runs" / "release").glob("*/run.json")
    assert json.loads(run.read_text())["status"] == "published"
    manifest = json.loads((run.parent / "split" / "manifest.json").read_text())
    assert manifest["info"]["missing_target_levels"] == {"val": ["1"], "test": ["1"]}
    bundle = run.parent / "bundle"
    assert "missing_target_levels" not in "".join(
        p.read_text(errors="ignore") for p in bundle.rglob("*") if p.is_file()
    )


def _profile_with(folder, smoke_release, **privacy) -> str:
    with open(smoke_release) as handle:
        profile = yaml.safe_load(handle)
    profile["privacy"] = {**profile.get("privacy", {}), **privacy}
    path = folder / "windowed.yaml"
    path.write_text(yaml.safe_dump(profile))
    return str(path)


def test_a_release_past_the_profiles_planned_releases_or_end_date_is_refused(
    isolated_workdir, demo_csv, smoke_release, capfd
):
    counted = _profile_with(isolated_workdir, smoke_release, planned_releases=1)
    profile = load_profile(counted)
    ledger.enter(
        "cardio",
        "cardio-earlier-000000000000",
        planned_release_cost(profile, profile.release_target()),
        None,
        profile=profile.name,
    )
    argv = ["release", "--config", str(CARDIO_SCHEMA), "--data", str(demo_csv), "--profile"]
    assert main([*argv, counted]) == 5
    err = capfd.readouterr().err
    assert "privacy.planned_releases" in err and "Traceback" not in err
    assert not (isolated_workdir / "runs").exists() and len(ledger.entries("cardio")) == 1

    ended = _profile_with(isolated_workdir, smoke_release, releases_until="2020-01-31")
    assert main([*argv, ended]) == 5
    assert "privacy.releases_until" in capfd.readouterr().err
    assert not (isolated_workdir / "runs").exists()


def test_the_window_is_checked_by_date_and_by_this_profiles_releases_only(private_home):
    from datetime import date

    profile = load_profile("default", CARDIO_SCHEMA)
    cost = planned_release_cost(profile, profile.release_target())
    for k in range(5):
        ledger.enter("cardio", f"d{k}", cost, None, profile="default")
    ledger.enter("cardio", "e0", cost, None, profile="eps1")
    ledger.check_release_window("cardio", profile)  # 5 of default's 6
    ledger.enter("cardio", "d5", cost, None, profile="default")
    ledger.check_release_window("cardio", profile, release_id="d5")  # a release resuming itself
    with pytest.raises(ledger.BudgetExceededError, match="planned_releases"):
        ledger.check_release_window("cardio", profile)
    import dataclasses

    until = dataclasses.replace(
        profile, privacy=dataclasses.replace(profile.privacy, planned_releases=None, releases_until="2027-06-30")
    )
    ledger.check_release_window("cardio", until, today=date(2027, 6, 30))
    with pytest.raises(ledger.BudgetExceededError, match="releases_until"):
        ledger.check_release_window("cardio", until, today=date(2027, 7, 1))


def _forecast(config, profile, releases, capfd) -> dict:
    assert main(["ledger", "--config", config, "--profile", profile, "--forecast", str(releases), "--json"]) == 0
    return json.loads(capfd.readouterr().out.strip().splitlines()[-1])["forecast"]


def test_the_forecast_made_before_names_the_release_and_the_rule_that_release_then_refuses(
    isolated_workdir, demo_csv, smoke_release, capfd
):
    """Issue 40: the forecast said "every one fits" where release then refused on privacy.planned_releases.
    Publishing smoke releases (profile planning 2) until one is refused, against the forecast made first."""
    planned = _profile_with(isolated_workdir, smoke_release, planned_releases=2)
    config = str(CARDIO_SCHEMA)
    before = _forecast(config, planned, 3, capfd)
    assert [(v["fits"], v["rule"]) for v in before["verdicts"]] == [
        (True, None),
        (True, None),
        (False, "privacy.planned_releases"),
    ]
    assert before["stops_at"] == 3
    argv = ["release", "--config", config, "--data", str(demo_csv), "--profile", planned, "--allow-same-input"]
    made = 0
    while main(argv) == 0:
        made += 1
        assert made <= 3, "release never refused"
    refused_at = made + 1
    err = capfd.readouterr().err
    assert refused_at == before["stops_at"] and before["verdicts"][refused_at - 1]["rule"] in err
    assert before["verdicts"][refused_at - 1]["reason"].split(" Nothing was")[0] in err
    # After the refusal the forecast still says so (before: "they fit").
    after = _forecast(config, planned, 2, capfd)
    assert [(v["fits"], v["rule"]) for v in after["verdicts"]] == [(False, "privacy.planned_releases")] * 2
