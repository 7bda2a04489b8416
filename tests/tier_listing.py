"""`python -m pytest --collect-only -p tests.tier_listing`: after the collection, a line `tier: fast NODE_ID` or
`tier: slow NODE_ID` for each test (the marks tests/conftest.py gives), so that tests/test_tiers.py sees both
tiers in one collection of the whole suite (a collection costs seconds: every test module is imported)."""

from __future__ import annotations

import pytest

# Every test's tier (`tier_of`), kept by tests/conftest.py when its process collected the whole suite: what
# tests/test_tiers.py reads then instead of collecting the whole suite again in a process of its own (about 18 CPU
# seconds on this machine). Defined here, in a module imported under one name only: pytest imports tests/conftest.py
# as `conftest`, and the tests import it again as `tests.conftest`.
WHOLE_SUITE_TIERS = pytest.StashKey[dict[str, str]]()


def tier_of(item) -> str:
    """`fast`, `slow`, or what else the test's marks make of it (`fast+slow`, `none`)."""
    tiers = [tier for tier in ("fast", "slow") if item.get_closest_marker(tier) is not None]
    return "+".join(tiers) or "none"


def pytest_collection_finish(session) -> None:
    for item in session.items:
        print(f"tier: {tier_of(item)} {item.nodeid}")
