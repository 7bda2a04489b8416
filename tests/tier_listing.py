"""`python -m pytest --collect-only -p tests.tier_listing`: after the collection, a line `tier: fast NODE_ID` or
`tier: slow NODE_ID` for each test (the marks tests/conftest.py gives), so that tests/test_tiers.py sees both
tiers in one collection of the whole suite (a collection costs seconds: every test module is imported)."""

from __future__ import annotations


def pytest_collection_finish(session) -> None:
    for item in session.items:
        tiers = [tier for tier in ("fast", "slow") if item.get_closest_marker(tier) is not None]
        print(f"tier: {'+'.join(tiers) or 'none'} {item.nodeid}")
