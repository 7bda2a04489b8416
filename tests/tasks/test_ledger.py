"""The lifetime ledger: entries, the budget check, withdrawal, and two releases entering at once."""

import multiprocessing

import pytest

from dpsynth.models.errors import BudgetExceededError
from dpsynth.models.privacy.lifetime import ReleaseCost, TrainingCurve, lifetime_cost
from dpsynth.tasks import ledger

COST = ReleaseCost(4.0, 1e-5, TrainingCurve(1000, 5000, 32, 1.07, "per_row"), 1.0, True)


@pytest.fixture
def ledger_file(tmp_path, monkeypatch):
    path = tmp_path / "store" / "privacy-ledger.sqlite"
    monkeypatch.setenv("DPSYNTH_LEDGER", str(path))
    return path


def test_entries_count_until_withdrawn_and_publishing_is_idempotent(ledger_file):
    assert ledger.spent("cardio").epsilon == 0.0 and ledger.entries("cardio") == []
    ledger.enter("cardio", "r1", COST, budget=None)
    ledger.enter("cardio", "r1", COST, budget=None)  # a resumed release replaces its own entry
    ledger.enter("other", "r9", COST, budget=None)  # another table has its own ledger
    assert [e.release_id for e in ledger.entries("cardio")] == ["r1"]
    ledger.mark_published("r1", "cardio-gswgan/1")
    ledger.enter("cardio", "r2", COST, budget=None, status="refused")
    ledger.enter("cardio", "r3", COST, budget=None)
    ledger.withdraw("r3")  # failed before registering: costs nothing
    ledger.withdraw("r1")  # published: never taken out
    statuses = {e.release_id: e.status for e in ledger.entries("cardio")}
    assert statuses == {"r1": "published", "r2": "refused"}
    assert ledger.spent("cardio").epsilon == lifetime_cost([COST, COST]).epsilon < 8.0
    assert ledger_file.stat().st_mode & 0o077 == 0


def test_the_budget_is_checked_before_work_and_again_on_entry(ledger_file):
    ledger.enter("cardio", "r1", COST, budget=10.0)
    two = lifetime_cost([COST, COST]).epsilon
    ledger.check_lifetime("cardio", COST, budget=two + 0.01)
    with pytest.raises(BudgetExceededError, match="lifetime_budget") as refused:
        ledger.check_lifetime("cardio", COST, budget=two - 0.01)
    assert refused.value.exit_code == 5
    # A release's own entry is not counted twice when it resumes.
    ledger.check_lifetime("cardio", COST, budget=COST.epsilon, release_id="r1")
    with pytest.raises(BudgetExceededError, match="at publication"):
        ledger.enter("cardio", "r2", COST, budget=two - 0.01)
    assert [e.release_id for e in ledger.entries("cardio")] == ["r1"]
    report = ledger.summary("cardio")
    assert report["lifetime_budget"] == 10.0 and report["remaining_epsilon"] == pytest.approx(10.0 - COST.epsilon)


def _enter_one(path: str, release_id: str, budget: float, barrier, results) -> None:
    import os

    os.environ["DPSYNTH_LEDGER"] = path
    barrier.wait()
    try:
        ledger.enter("cardio", release_id, COST, budget=budget)
        results.put((release_id, "entered"))
    except BudgetExceededError:
        results.put((release_id, "refused"))


@pytest.mark.parametrize(
    "budget, expected", [(COST.epsilon + 0.5, ["entered", "refused"]), (100.0, ["entered", "entered"])]
)
def test_two_releases_entering_at_once_are_both_counted(ledger_file, budget, expected):
    ledger_file.parent.mkdir(parents=True)
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    workers = [
        context.Process(target=_enter_one, args=(str(ledger_file), f"r{i}", budget, barrier, results)) for i in range(2)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    outcomes = dict(results.get(timeout=5) for _ in workers)
    assert sorted(outcomes.values()) == expected
    entered = sorted(r for r, o in outcomes.items() if o == "entered")
    assert sorted(e.release_id for e in ledger.entries("cardio")) == entered


def test_the_same_input_file_as_the_last_release_is_refused(ledger_file):
    ledger.check_new_input("cardio", "aa")  # an empty ledger refuses nothing
    ledger.enter("cardio", "r1", COST, budget=None, input_sha256="aa")
    ledger.enter("other", "r9", COST, budget=None, input_sha256="bb")
    with pytest.raises(BudgetExceededError, match="byte for byte") as refused:
        ledger.check_new_input("cardio", "aa")
    assert refused.value.exit_code == 5 and "r1" in str(refused.value)
    ledger.check_new_input("cardio", "aa", release_id="r1")  # a release resuming itself
    ledger.check_new_input("cardio", "bb")  # another table's file is not this table's
    ledger.enter("cardio", "r2", COST, budget=None, input_sha256="cc")
    ledger.check_new_input("cardio", "aa")  # only the last release's file counts
    ledger.enter("cardio", "r3", COST, budget=None, input_sha256="dd")
    ledger.withdraw("r3")  # withdrawn: counts for nothing
    with pytest.raises(BudgetExceededError):
        ledger.check_new_input("cardio", "cc")
    assert "input_sha256" not in ledger.summary("cardio")["releases"][0]  # internal, never shown


def test_a_ledger_from_before_input_hashes_gains_the_column(ledger_file):
    import sqlite3

    ledger_file.parent.mkdir(parents=True)
    with sqlite3.connect(ledger_file) as db:
        db.execute(ledger._SCHEMA.replace(",\n    input_sha256 TEXT,\n    profile TEXT)", ")"))
    ledger.enter("cardio", "r1", COST, budget=None, input_sha256="aa", profile="default")
    with pytest.raises(BudgetExceededError):
        ledger.check_new_input("cardio", "aa")
    assert ledger.releases_of_profile("cardio", "default") == 1


def test_a_schedules_releases_are_counted_by_profile_aborted_ones_too(ledger_file):
    ledger.enter("cardio", "r1", COST, budget=None, profile="default")
    # No release stops on its rows any more, so nothing enters "aborted"; an earlier version's entry counts.
    with pytest.raises(ValueError, match="aborted"):
        ledger.enter("cardio", "r2", COST, budget=None, profile="default", status="aborted")
    ledger.enter("cardio", "r2", COST, budget=None, profile="default")
    with ledger._writing() as db:
        db.execute("UPDATE releases SET status = 'aborted' WHERE release_id = 'r2'")
    ledger.enter("cardio", "r3", COST, budget=None, profile="eps1")
    ledger.enter("cardio", "r4", COST, budget=None, profile="default")
    ledger.withdraw("r4")
    assert ledger.releases_of_profile("cardio", "default") == 2
    assert ledger.releases_of_profile("cardio", "default", excluding="r1") == 1
    assert ledger.releases_of_profile("other", "default") == 0
    assert ledger.spent("cardio").epsilon == pytest.approx(lifetime_cost([COST] * 3).epsilon)  # aborted counts


def test_forecast_composes_more_releases_as_the_ledger_would_and_says_where_it_stops(ledger_file):
    ledger.enter("cardio", "r1", COST, budget=None)
    result = ledger.forecast("cardio", COST, 6, budget=10.0)
    composed = [lifetime_cost([COST] * (1 + k)).epsilon for k in range(1, 7)]
    first_over = next(k for k, total in enumerate(composed, start=1) if total > 10.0)
    assert 1 < first_over < 6 and result["stops_at"] == first_over
    # Refused releases cost nothing: the spending stays at the last one that fitted.
    fitted = composed[first_over - 2]
    assert result["after"] == pytest.approx(composed[: first_over - 1] + [fitted] * (7 - first_over))
    assert result["spent_epsilon"] == pytest.approx(COST.epsilon)
    assert ledger.forecast("cardio", COST, 3, budget=None)["after"] == pytest.approx(composed[:3])
    assert ledger.forecast("cardio", COST, 2, budget=None)["stops_at"] is None
    assert ledger.forecast("cardio", COST, first_over - 1, budget=10.0)["stops_at"] is None


def test_the_same_input_refusal_reads_the_rows_so_the_privacy_statement_names_it(ledger_file):
    import hashlib

    from dpsynth.models.config import load_profile
    from dpsynth.tasks.decision import statement_for

    extract = b"id;cardio\n1;0\n2;1\n"
    one_row_replaced = b"id;cardio\n1;0\n2;0\n"
    ledger.enter("cardio", "r1", COST, budget=None, input_sha256=hashlib.sha256(extract).hexdigest())
    with pytest.raises(BudgetExceededError, match="byte for byte"):
        ledger.check_new_input("cardio", hashlib.sha256(extract).hexdigest())
    ledger.check_new_input("cardio", hashlib.sha256(one_row_replaced).hexdigest())  # one row apart: it runs
    # So epsilon does not cover it, and a publishing release's statement says so, with what it reveals.
    default = load_profile("default")
    named = [
        i for i in statement_for(default, default.release_target(), release=True).does_not_cover if "same-input" in i
    ]
    assert len(named) == 1 and "not one row changed" in named[0] and "--allow-same-input" in named[0]
    trial = load_profile("smoke")  # a trial never checks its input against the ledger
    assert not [
        i for i in statement_for(trial, trial.release_target(), release=True).does_not_cover if "same-input" in i
    ]
