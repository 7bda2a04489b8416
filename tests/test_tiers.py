"""The test tiers (tests/conftest.py): `-m fast` runs every stage once (the session's smoke trial, every generator
check of the default generator and of the toy) and leaves the other generators' checks and the other flows to the
whole suite; every test the tier lists names exist, so a renamed one cannot drop out of its tier unseen."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from dpsynth.generator_checks import CHECKS
from dpsynth.models.generator_registry import DEFAULT_GENERATOR
from dpsynth.models.generators import names
from tests.conftest import (
    CONFORMANCE,
    FAST_FLOWS,
    LONGEST_UNITS,
    ROOT,
    SLOW_TESTS,
    longest_first,
    scheduling_unit,
)
from tests.tier_listing import WHOLE_SUITE_TIERS


@pytest.fixture(scope="module")
def tiers(request) -> dict[str, str]:
    """Every test's node id and its tier, from one collection of the whole suite: this session's when it collected
    the whole suite (tests/conftest.py, WHOLE_SUITE_TIERS), else one in a process of its own (tests/tier_listing.py)."""
    if WHOLE_SUITE_TIERS in request.config.stash:
        return dict(request.config.stash[WHOLE_SUITE_TIERS])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-n", "0"]
        + ["-p", "no:cacheprovider", "-p", "tests.tier_listing"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    listed = [line.split(" ", 2)[1:] for line in done.stdout.splitlines() if line.startswith("tier: ")]
    return {test: tier for tier, test in listed}


@pytest.mark.slow  # a collection of the whole suite
def test_the_fast_tier_runs_every_stage_once_and_leaves_the_rest_to_the_whole_suite(tiers):
    everything = list(tiers)
    assert set(tiers.values()) == {"fast", "slow"}  # each test in exactly one tier (`-m fast` selects the first)
    fast = [test for test, tier in tiers.items() if tier == "fast"]
    assert set(fast) < set(everything)
    # One release: the session's smoke trial, shared by the tests that read it.
    released = [test for test in fast if test.startswith("tests/flows/test_trial_release.py::")]
    assert released == [
        "tests/flows/test_trial_release.py::test_the_sessions_smoke_trial_ran_every_stage_and_published_nothing"
    ]
    # The generator checks: all of them for the default generator, none for the others; the toy's too.
    checks = [test for test in fast if test.startswith(f"{CONFORMANCE}::")]
    assert sorted(checks) == sorted(
        f"{CONFORMANCE}::test_generator_check[{check.__name__}-{DEFAULT_GENERATOR}]" for check in CHECKS
    )
    assert len([test for test in everything if test.startswith(f"{CONFORMANCE}::")]) == len(CHECKS) * len(names())
    assert "tests/flows/test_toy_generator.py::test_the_toy_passes_the_generator_conformance_checks" in fast
    # No other flow: every fast test under tests/flows/ is one FAST_FLOWS names.
    for test in fast:
        if test.startswith("tests/flows/"):
            path, name = test.split("::")
            assert path in FAST_FLOWS or f"{path}::{name.split('[')[0]}" in FAST_FLOWS, test
    # Every entry of the lists names collected tests.
    for entry in FAST_FLOWS + SLOW_TESTS:
        assert any(
            test == entry or test.startswith(f"{entry}::") or test.startswith(f"{entry}[") for test in everything
        ), entry


@pytest.mark.slow  # the same collection
def test_the_longest_units_go_out_first_and_each_names_a_unit_of_the_suite(tiers):
    units = list(dict.fromkeys(scheduling_unit(test) for test in tiers))  # in collection order
    assert set(LONGEST_UNITS) <= set(units)  # a renamed module cannot drop out of the table unseen
    assert f"{CONFORMANCE}::{DEFAULT_GENERATOR}" in units and CONFORMANCE not in units  # one unit per generator
    ordered = longest_first(units)
    assert sorted(ordered) == sorted(units)
    listed = ordered[: len(LONGEST_UNITS)]
    assert set(listed) == set(LONGEST_UNITS)
    assert [LONGEST_UNITS[unit] for unit in listed] == sorted(LONGEST_UNITS.values(), reverse=True)
    assert ordered[len(LONGEST_UNITS) :] == [unit for unit in units if unit not in LONGEST_UNITS]


class _Worker:
    """What xdist's scheduler sees of a worker; each batch of tests it is sent goes into the shared `sent` list."""

    def __init__(self, name: str, sent: list[tuple[str, list[int]]]):
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent = sent
        self.pending: list[int] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append((self.gateway.id, list(indexes)))
        self.pending.extend(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


def test_the_scheduler_hands_the_longest_units_out_first_then_the_rest_in_collection_order():
    from tests.conftest import pytest_xdist_make_scheduler

    # The listed units collected shortest first, after two short ones: the scheduler must turn that round.
    listed = sorted(LONGEST_UNITS, key=LONGEST_UNITS.__getitem__)
    collection = ["tests/flows/test_first.py::test_one", "tests/flows/test_first.py::test_two"]
    for unit in listed:
        path, _, generator = unit.partition(f"{CONFORMANCE}::")
        if generator:
            collection += [f"{CONFORMANCE}::test_generator_check[check_{k}-{generator}]" for k in "ab"]
        else:
            collection.append(f"{unit}::test_it")
    collection.append("tests/test_last.py::test_it")
    options = {"dist": "loadscope", "tx": ["2*popen"]}
    config = SimpleNamespace(
        getoption=options.get, getvalue=options.get, option=SimpleNamespace(loadscopereorder=False)
    )
    scheduler = pytest_xdist_make_scheduler(config, None)
    sent: list[tuple[str, list[int]]] = []
    workers = [_Worker("gw0", sent), _Worker("gw1", sent)]
    for worker in workers:
        scheduler.add_node(worker)
    for worker in workers:
        scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    while any(worker.pending for worker in workers):  # each worker runs its tests, one at a time in turn
        for worker in workers:
            if worker.pending:
                scheduler.mark_test_complete(worker, worker.pending.pop(0))
    assert scheduler.tests_finished
    handed = [[scheduling_unit(collection[i]) for i in indexes] for _, indexes in sent]
    assert all(len(set(batch)) == 1 for batch in handed)  # each batch is one unit, whole
    order = [batch[0] for batch in handed]
    assert order == listed[::-1] + ["tests/flows/test_first.py", "tests/test_last.py"]
    assert [name for name, _ in sent[:2]] == ["gw0", "gw1"]  # the two longest start at once
