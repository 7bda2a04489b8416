"""AIM's derived 1-way share (`aim.one_way_share: auto` or a rule, models/generators/aim/privacy.py
`derived_one_way_share`): it reads public facts only (the schema's cells, rho, the rounds and the number
of training rows, which replace-one neighbours share), it shrinks with more rows and fewer cells, it never
passes its cap, and the plan the budget gives is what the fit spends."""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsynth.models.config import load_profile
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators import get
from dpsynth.models.generators.aim.config import (
    DEFAULT_ONE_WAY_NOISE_FRACTION,
    DEFAULT_ONE_WAY_SHARE_CAP,
    AIMConfig,
    OneWayRule,
)
from dpsynth.models.generators.aim.fit import budget, check_budget, fit, largest_cells
from dpsynth.models.generators.aim.privacy import AIMBudget
from dpsynth.models.privacy.secret import PrivacySecret
from tests.conftest import CARDIO_SCHEMA, TEST_SECRET_HEX
from tests.models.aim_ledgers import keep_ledgers
from tests.models.test_mst import BINS, ROWS, SCHEMA, _table

SECRET = PrivacySecret.from_hex(TEST_SECRET_HEX)
CENSUS_SCHEMA = CARDIO_SCHEMA.parent / "census-demo.yaml"
# A budget at which the rule lands strictly between 0 and its cap on SCHEMA's 4,000 rows (checked below).
RHO, ROUNDS = 0.01, 16
RULE = OneWayRule(noise_fraction=0.2, cap=0.5)
EPS1_RHO = 0.0187  # AIM's rho in `aim-eps1` at whole-release epsilon 1 (after the fine histograms)


def _columns(path) -> tuple:
    return tuple(DatasetSchema.from_yaml(path).columns)


def _fit_spending(table, one_way_share):
    """A fit of `table` at RHO, and the ledger of every mechanism it ran."""
    with pytest.MonkeyPatch.context() as patch:
        ledgers = keep_ledgers(patch)
        result = fit(
            table, SCHEMA.columns, SCHEMA.target, RHO, SECRET.numpy, bins=BINS, rounds=ROUNDS, max_model_mb=1.0,
            round_iterations=5, iterations=10, workload="pairs-and-target-triples", one_way_share=one_way_share,
        )  # fmt: skip
    return result, ledgers[0]


def test_the_derived_share_is_the_same_for_two_tables_that_differ_in_their_values():
    plan = budget(SCHEMA.columns, RHO, ROUNDS, RULE, 0.0, bins=BINS, rows=ROWS)  # no row read
    assert 0.0 < plan.one_way_share < RULE.cap
    first, _ = _fit_spending(_table(seed=0), RULE)
    other = _table(seed=1)
    assert not other.equals(_table(seed=0))
    second, _ = _fit_spending(other, RULE)
    one_row = _table(seed=0)
    one_row.loc[0] = _table(seed=1).loc[0]  # replace-one neighbours
    third, _ = _fit_spending(one_row, RULE)
    shares = {r.info["budget"]["one_way_share"] for r in (first, second, third)}
    assert shares == {plan.one_way_share}
    # The manifest records the rule next to the share, as it records the rounds.
    assert first.info["budget"]["one_way_rule"] == {"noise_fraction": 0.2, "cap": 0.5, "largest_cells": 21}


def test_the_accountants_plan_is_what_the_fit_spends_at_the_derived_share():
    table = _table()
    plan = budget(SCHEMA.columns, RHO, ROUNDS, RULE, 0.0, bins=BINS, rows=len(table))
    result, ledger = _fit_spending(table, RULE)
    d = len(SCHEMA.columns)
    one_ways = ledger.entries[:d]
    assert [e["kind"] for e in one_ways] == ["measure"] * d and all(len(e["clique"]) == 1 for e in one_ways)
    assert [e["std"] for e in one_ways] == [plan.one_way_std] * d
    assert math.fsum(e["rho"] for e in one_ways) == pytest.approx(plan.one_way_share * RHO, rel=1e-12)
    assert result.info["rounds"][0]["std"] == plan.initial_std
    assert math.fsum(e["rho"] for e in ledger.entries) == pytest.approx(RHO, rel=1e-12)
    # The same split as the declared share of that value: the rule only chooses the number.
    declared = AIMBudget(RHO, d, ROUNDS, one_way_share=plan.one_way_share)
    assert (declared.one_way_std, declared.initial_std) == (plan.one_way_std, plan.initial_std)


def test_many_rows_of_few_levels_get_a_smaller_share_than_fewer_rows_of_many_levels():
    # Cardio's 12 columns (2-3 levels; 20 cells per continuous column) at 55,931 training rows (a
    # 70,000-row table's split) against the census schema's 15 (up to 42 levels) at 16,000.
    cardio, census = _columns(CARDIO_SCHEMA), _columns(CENSUS_SCHEMA)
    assert largest_cells(cardio, 20) == 20 and largest_cells(census, 20) == 42
    large = budget(cardio, EPS1_RHO, None, "auto", 0.0, bins=20, rows=55_931)
    small = budget(census, EPS1_RHO, None, "auto", 0.0, bins=20, rows=16_000)
    assert large.one_way_share == 0.0  # the paper's: each 1-way marginal at the first rounds' std
    assert small.one_way_share == DEFAULT_ONE_WAY_SHARE_CAP
    # On one schema the share falls as the rows grow, to 0 once the paper's std is within the fraction.
    shares = [budget(census, EPS1_RHO, None, "auto", 0.0, bins=20, rows=n).one_way_share for n in (16_000, 40_000)]
    shares.append(budget(census, EPS1_RHO, None, "auto", 0.0, bins=20, rows=60_000).one_way_share)
    assert shares[0] > shares[1] > shares[2] > 0.0
    assert budget(census, EPS1_RHO, None, "auto", 0.0, bins=20, rows=200_000).one_way_share == 0.0


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 10**7),
    rho=st.floats(1e-4, 10.0),
    noise_fraction=st.floats(1e-3, 1.0),
    cap=st.floats(0.01, 0.9),
)
def test_the_derived_share_never_exceeds_its_cap_and_never_falls_below_the_papers_spend(rows, rho, noise_fraction, cap):
    rule = OneWayRule(noise_fraction=noise_fraction, cap=cap)
    plan = budget(SCHEMA.columns, rho, ROUNDS, rule, 0.0, bins=BINS, rows=rows)
    assert 0.0 <= plan.one_way_share <= cap
    paper = AIMBudget(rho, len(SCHEMA.columns), ROUNDS)
    target = noise_fraction * rows / largest_cells(SCHEMA.columns, BINS)
    capped = AIMBudget(rho, len(SCHEMA.columns), ROUNDS, one_way_share=cap)
    if plan.one_way_share > 0:
        # A positive share only when it measures the 1-way marginals more precisely than the paper's std,
        # and no more precisely than the target (the least share that reaches it) unless capped.
        assert plan.one_way_std < paper.one_way_std
        assert plan.one_way_std == pytest.approx(target, rel=1e-9) or plan.one_way_share == cap
    else:
        # 0 when the paper's std already reaches the target, or when the cap could not beat it.
        assert paper.one_way_std <= target or capped.one_way_std >= paper.one_way_std * (1 - 1e-12)


def test_auto_is_the_rule_at_its_chosen_constants_and_a_profile_may_declare_another():
    assert OneWayRule() == OneWayRule(noise_fraction=DEFAULT_ONE_WAY_NOISE_FRACTION, cap=DEFAULT_ONE_WAY_SHARE_CAP)
    columns = SCHEMA.columns
    assert budget(columns, RHO, ROUNDS, "auto", 0.0, bins=BINS, rows=ROWS) == budget(
        columns, RHO, ROUNDS, OneWayRule(), 0.0, bins=BINS, rows=ROWS
    )
    assert AIMConfig(one_way_share="auto").one_way_share == "auto"
    assert AIMConfig(one_way_share=0.33).one_way_share == 0.33  # the declared number still works
    with pytest.raises(ConfigError):
        AIMConfig(one_way_share="half")
    with pytest.raises(ConfigError):
        AIMConfig(one_way_share={"noise_fraction": 0.1, "cap": 1.0})
    with pytest.raises(ConfigError, match="training rows"):
        budget(columns, RHO, ROUNDS, "auto", 0.0)  # a derived share needs the rows: none is guessed


def test_a_profile_with_a_derived_share_checks_both_ends_and_publishes_the_rule_not_the_share(tmp_path):
    (tmp_path / "profiles").mkdir()
    spec = {"name": "p", "extends": "aim-eps1", "aim": {"one_way_share": {"noise_fraction": 0.1, "cap": 0.3}}}
    (tmp_path / "profiles" / "p.yaml").write_text(yaml.safe_dump(spec))
    schema = DatasetSchema.from_yaml(CARDIO_SCHEMA)
    profile = load_profile("p", tmp_path / "schema.yaml")
    assert profile.aim.one_way_share == OneWayRule(noise_fraction=0.1, cap=0.3)
    aim = get("aim")
    setting = profile.settings[0]
    aim.check(profile, setting, schema)
    facts = aim.training_facts(profile, setting)
    text = facts.parameters["aim_one_way_share"]
    assert isinstance(text, str) and "0.1" in text and "0.3" in text  # the rule; the number is the run's
    # The whole release's rho does not depend on the split: the same as at a declared share.
    declared = load_profile("aim-eps1", CARDIO_SCHEMA)
    assert facts.parameters["aim_rho"] == aim.training_facts(declared, declared.settings[0]).parameters["aim_rho"]
    # A cap that leaves the pair rounds no room is refused before any row is read, as a declared share.
    with pytest.raises(ConfigError, match="numeric_pair_share"):
        check_budget(tuple(schema.columns), 0.02, None, OneWayRule(cap=0.8), 0.3)
