"""The lifetime ledger: entries, the budget check, withdrawal, and two releases entering at once."""

import multiprocessing

import pytest

from models.errors import BudgetExceededError
from models.lifetime import ReleaseCost, TrainingCurve, lifetime_cost
from tasks import ledger

COST = ReleaseCost(4.0, 1e-5, TrainingCurve(1000, 5000, 32, 1.07, "per_row"), 1.0, True)


@pytest.fixture
def ledger_file(tmp_path, monkeypatch):
    path = tmp_path / "store" / "privacy-ledger.sqlite"
    monkeypatch.setenv("DPSYNTH_LEDGER", str(path))
    return path


def test_entries_count_until_withdrawn_and_publishing_is_idempotent(ledger_file):
    assert ledger.spent("cardio").epsilon == 0.0 and ledger.entries("cardio") == []
    ledger.enter("cardio", "r1", COST, budget=None)
    ledger.enter("cardio", "r1", COST, budget=None)          # a resumed release replaces its own entry
    ledger.enter("other", "r9", COST, budget=None)           # another table has its own ledger
    assert [e.release_id for e in ledger.entries("cardio")] == ["r1"]
    ledger.mark_published("r1", "cardio-gswgan/1")
    ledger.enter("cardio", "r2", COST, budget=None, status="refused")
    ledger.enter("cardio", "r3", COST, budget=None)
    ledger.withdraw("r3")                                    # failed before registering: costs nothing
    ledger.withdraw("r1")                                    # published: never taken out
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


@pytest.mark.parametrize("budget, expected", [(COST.epsilon + 0.5, ["entered", "refused"]),
                                              (100.0, ["entered", "entered"])])
def test_two_releases_entering_at_once_are_both_counted(ledger_file, budget, expected):
    ledger_file.parent.mkdir(parents=True)
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_enter_one, args=(str(ledger_file), f"r{i}", budget, barrier, results))
               for i in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    outcomes = dict(results.get(timeout=5) for _ in workers)
    assert sorted(outcomes.values()) == expected
    entered = sorted(r for r, o in outcomes.items() if o == "entered")
    assert sorted(e.release_id for e in ledger.entries("cardio")) == entered
