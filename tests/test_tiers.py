"""The test tiers (tests/conftest.py): `-m fast` runs every stage once (the session's smoke trial, every generator
check of the default generator and of the toy) and leaves the other generators' checks and the other flows to the
whole suite; every test the tier lists names exist, so a renamed one cannot drop out of its tier unseen."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dpsynth.generator_checks import CHECKS
from dpsynth.models.generator_registry import DEFAULT_GENERATOR
from dpsynth.models.generators import names
from tests.conftest import CONFORMANCE, FAST_FLOWS, ROOT, SLOW_TESTS


def _collected() -> dict[str, str]:
    """Every test's node id and its tier, from one collection of the whole suite (tests/tier_listing.py)."""
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
def test_the_fast_tier_runs_every_stage_once_and_leaves_the_rest_to_the_whole_suite():
    tiers = _collected()
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
