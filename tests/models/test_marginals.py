"""Measured marginals: replace-one sensitivity, the noise's scale and source, the cost, consistency."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from dpsynth.models.data.binning import cell_count, cell_values
from dpsynth.models.data.demo import SHAPES, make_demo_table
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import ConfigError
from dpsynth.models.marginals.measure import (
    L1_SENSITIVITY,
    L2_SENSITIVITY,
    SCORE_SENSITIVITY,
    MeasuredMarginals,
    MeasurementPlan,
    candidate_pairs,
    consistent_shares,
    fixed_workload,
    marginal_counts,
    marginal_shape,
    measure,
    pair_score,
    plan_for_epsilon,
    plan_for_rho,
    project_to_simplex,
)
from dpsynth.models.privacy.dpsgd_accountant import ORDERS
from dpsynth.models.privacy.secret import PrivacySecret

SECRET = PrivacySecret.from_hex("5e" * 32)

TINY = {
    "name": "tiny",
    "target": "y",
    "columns": {
        "colour": {"type": "categorical", "levels": ["red", "green", "blue"]},
        "gain": {"type": "continuous", "bounds": [0, 10], "decimals": 0, "point_masses": [0]},
        "y": {"type": "binary", "levels": [0, 1]},
    },
}
SMALL = {
    "name": "small",
    "target": "target",
    "columns": {
        "age": {"type": "continuous", "bounds": [17, 90], "decimals": 0},
        "gain": {"type": "continuous", "bounds": [0, 10000], "decimals": 0, "point_masses": [0]},
        "colour": {"type": "categorical", "levels": ["red", "green", "blue", "black", "white"]},
        "flag": {"type": "binary", "levels": ["no", "yes"]},
        "target": {"type": "binary", "levels": [0, 1]},
    },
}


@pytest.fixture(scope="module")
def tiny() -> DatasetSchema:
    return DatasetSchema.from_dict(TINY)


@pytest.fixture(scope="module")
def small() -> DatasetSchema:
    return DatasetSchema.from_dict(SMALL)


@pytest.fixture(scope="module")
def small_rows(small) -> pd.DataFrame:
    return make_demo_table(small, 3000, seed=1, shape=SHAPES["hard"])


def _every_row(schema: DatasetSchema, bins: int) -> list[dict]:
    """One row per combination of cells (plus a missing value) of every column."""
    rng = np.random.default_rng(0)
    options = []
    for col in schema.columns:
        values = list(cell_values(col, np.arange(cell_count(col, bins)), rng, bins)) + [None]
        options.append(values)
    return [dict(zip(schema.column_names, combo, strict=False)) for combo in itertools.product(*options)]


# ------------------------------------------------------------------------------------ sensitivity


def test_replace_one_moves_every_marginal_by_sqrt2_at_most(tiny):
    bins = 2
    every = _every_row(tiny, bins)
    table = pd.DataFrame([every[3], every[10], every[17], every[25]])
    marginals = list(fixed_workload(tiny)) + candidate_pairs(tiny, fixed_workload(tiny))
    for marginal in marginals:
        base = marginal_counts(table, tiny, marginal, bins)
        worst_l2 = worst_l1 = 0.0
        for i, row in itertools.product(range(len(table)), every):
            changed = table.copy()
            changed.iloc[i] = pd.Series(row)
            diff = marginal_counts(changed, tiny, marginal, bins) - base
            worst_l2, worst_l1 = max(worst_l2, np.linalg.norm(diff)), max(worst_l1, np.abs(diff).sum())
        assert worst_l2 == pytest.approx(L2_SENSITIVITY), marginal
        assert worst_l1 == pytest.approx(L1_SENSITIVITY), marginal


def test_selection_score_moves_by_two_at_most(tiny):
    bins = 2
    every = _every_row(tiny, bins)
    table = pd.DataFrame([every[1], every[8], every[20], every[30], every[41]])
    rng = np.random.default_rng(3)
    worst = 0.0
    for pair in candidate_pairs(tiny, []):
        estimate = rng.random(math.prod(marginal_shape(tiny, pair, bins))) * 3  # any noisy estimate, held fixed
        base = pair_score(marginal_counts(table, tiny, pair, bins), estimate)
        for i, row in itertools.product(range(len(table)), every):
            changed = table.copy()
            changed.iloc[i] = pd.Series(row)
            worst = max(worst, abs(pair_score(marginal_counts(changed, tiny, pair, bins), estimate) - base))
    assert worst <= SCORE_SENSITIVITY + 1e-12
    assert worst == pytest.approx(SCORE_SENSITIVITY)  # reached: the bound is not loose


def test_rows_with_a_missing_cell_are_counted_nowhere(tiny):
    table = pd.DataFrame({"colour": ["red", None, "blue", "purple"], "gain": [0, 3, np.nan, 7], "y": [0, 1, 1, 0]})
    counts = marginal_counts(table, tiny, ("colour", "gain"))
    assert counts.sum() == 1  # only the first row has a declared level and a number
    assert marginal_counts(table, tiny, ("y",)).tolist() == [2, 2]


# ------------------------------------------------------------------------------------------ noise


def _standardised_noise(schema, rows, plan, secret, purpose) -> np.ndarray:
    measured = measure(rows, schema, plan, secret, purpose=purpose)
    out = []
    for marginal in measured.marginals:
        true = marginal_counts(rows, schema, marginal.columns, plan.bins)
        out.append((np.asarray(marginal.noisy_counts) - true) / marginal.noise_std)
    return np.concatenate(out)


def test_noise_has_the_declared_std(small, small_rows):
    plan = plan_for_rho(small, 0.5)
    assert plan.noise_std(0) == pytest.approx(plan.noise_multipliers[0] * math.sqrt(2))
    z = np.concatenate([_standardised_noise(small, small_rows, plan, SECRET, f"marginals-{k}") for k in range(12)])
    assert len(z) > 1000
    assert abs(z.std() - 1.0) < 0.1  # the declared std; half or twice (or sqrt(2) off) fails
    assert abs(z.mean()) < 4 / math.sqrt(len(z))
    assert abs(stats.kurtosis(z)) < 0.5  # Gaussian tails, not Laplace's (kurtosis 3)
    assert np.all(np.asarray(measure(small_rows, small, plan, SECRET).marginals[0].noisy_counts) % 1 == 0)


def test_noise_comes_from_the_secret_and_not_a_seed(small, small_rows):
    plan = plan_for_rho(small, 0.5)
    first = measure(small_rows, small, plan, SECRET)
    np.random.seed(1)
    torch.manual_seed(1)
    again = measure(small_rows, small, plan, SECRET)
    np.random.seed(2)
    torch.manual_seed(2)
    other = measure(small_rows, small, plan, PrivacySecret.from_hex("a7" * 32))
    assert first.to_dict() == again.to_dict()
    assert first.marginals[0].noisy_counts != other.marginals[0].noisy_counts


def test_released_counts_are_noisy(small, small_rows):
    measured = measure(small_rows, small, plan_for_rho(small, 0.5), SECRET)
    equal = []
    for marginal in measured.marginals:
        true = marginal_counts(small_rows, small, marginal.columns)
        equal.append(np.asarray(marginal.noisy_counts) == true)
        assert not np.all(equal[-1])
    # A rounded draw is 0 with probability about 1 / (std sqrt(2 pi)): no more cells than that are exact.
    std = measured.marginals[0].noise_std
    assert np.concatenate(equal).mean() < 1.5 / (std * math.sqrt(2 * math.pi)) + 0.02


# ------------------------------------------------------------------------------------------- cost


def test_rdp_is_order_times_rho_summed(small):
    plan = MeasurementPlan(
        (("age",), ("gain", "target")), (3.0, 5.0), selections=2, selection_epsilon=0.3, selected_noise_multiplier=4.0
    )
    rho = 1 / (2 * 9) + 1 / (2 * 25) + 2 * (0.3**2 / 8 + 1 / (2 * 16))
    assert plan.rho() == pytest.approx(rho)
    orders = np.array([1.5, 2.0, 10.0, 64.0])
    np.testing.assert_allclose(plan.rdp(orders), orders * rho)
    # Add/remove-one: sensitivity 1 instead of sqrt(2), the selection half as sensitive.
    rho_ar = 1 / (4 * 9) + 1 / (4 * 25) + 2 * ((0.3 / 2) ** 2 / 8 + 1 / (4 * 16))
    np.testing.assert_allclose(plan.rdp(orders, adjacency="add/remove-one"), orders * rho_ar)


def test_epsilon_is_the_projects_classic_conversion(small):
    plan = plan_for_rho(small, 0.02)
    delta = 1e-5
    grid = np.asarray(ORDERS)
    by_hand = float(np.min(grid * 0.02 + math.log(1 / delta) / (grid - 1)))
    assert plan.epsilon(delta) == pytest.approx(by_hand, rel=1e-12)
    assert by_hand >= 0.02 + 2 * math.sqrt(0.02 * math.log(1 / delta)) - 1e-12  # the continuous optimum
    assert plan.epsilon(delta, conversion="opacus") < by_hand


def test_a_plan_for_epsilon_spends_it(small):
    plan = plan_for_epsilon(small, 1.0, 1e-5, selections=3)
    assert plan.epsilon(1e-5) <= 1.0
    assert plan.epsilon(1e-5) == pytest.approx(1.0, abs=1e-6)
    assert plan.selections == 3
    # Equal rho per measured marginal, a tenth of rho on the selection.
    measured = len(fixed_workload(small)) + 3
    assert measured * 1 / (2 * plan.noise_multipliers[0] ** 2) == pytest.approx(0.9 * plan.rho())
    assert 3 * plan.selection_epsilon**2 / 8 == pytest.approx(0.1 * plan.rho())


def test_a_plan_refuses_nonsense(small):
    with pytest.raises(ConfigError):
        MeasurementPlan((("age",),), (0.0,))
    with pytest.raises(ConfigError):
        MeasurementPlan((("age",),), (1.0, 2.0))
    with pytest.raises(ConfigError):
        plan_for_rho(small, -1.0)


# ------------------------------------------------------------------------------------ consistency


def test_consistent_shares_are_non_negative_sum_to_one_and_agree():
    rng = np.random.default_rng(5)
    marginals = [("a",), ("b",), ("c",), ("a", "c"), ("b", "c"), ("a", "b")]
    sizes = {"a": 6, "b": 3, "c": 2}
    shapes = [tuple(sizes[n] for n in m) for m in marginals]
    noisy = [rng.normal(20, 40, math.prod(s)) for s in shapes]  # many negative counts
    shares, total = consistent_shares(marginals, shapes, noisy, [30.0] * len(marginals))
    assert total > 0
    one_way = {}
    for marginal, table in zip(marginals, shares, strict=False):
        assert table.shape == tuple(sizes[n] for n in marginal)
        assert np.all(table >= 0)
        assert table.sum() == pytest.approx(1.0, abs=1e-9)
        for axis, name in enumerate(marginal):
            margin = table.sum(axis=tuple(a for a in range(table.ndim) if a != axis))
            one_way.setdefault(name, margin)
            np.testing.assert_allclose(margin, one_way[name], atol=1e-8)


def test_consistent_shares_keep_exact_counts():
    counts = np.array([[30.0, 10.0], [0.0, 60.0]])
    marginals = [("a",), ("b",), ("a", "b")]
    shares, total = consistent_shares(
        marginals, [(2,), (2,), (2, 2)], [counts.sum(1), counts.sum(0), counts.ravel()], [1.0, 1.0, 1.0]
    )
    assert total == pytest.approx(100.0)
    np.testing.assert_allclose(shares[2], counts / 100.0, atol=1e-8)


def test_simplex_projection():
    out = project_to_simplex(np.array([5.0, -3.0, 1.0]), 4.0)
    np.testing.assert_allclose(out, [4.0, 0.0, 0.0])
    out = project_to_simplex(np.array([1.0, 2.0, 3.0]), 9.0)
    np.testing.assert_allclose(out, [2.0, 3.0, 4.0])


# ------------------------------------------------------------------------------------ measurement


def test_measurement_covers_the_workload_and_serialises(small, small_rows):
    plan = plan_for_rho(small, 0.5, selections=2)
    measured = measure(small_rows, small, plan, SECRET)
    names = [m.columns for m in measured.marginals]
    assert names[: len(fixed_workload(small))] == list(fixed_workload(small))
    assert sum(m.selected for m in measured.marginals) == 2
    assert len(set(names)) == len(names)
    assert measured.total == pytest.approx(len(small_rows), rel=0.02)
    text = json.dumps(measured.to_dict())
    again = MeasuredMarginals.from_dict(json.loads(text))
    assert again == measured
    np.testing.assert_allclose(measured.one_way("gain"), measured.get(("gain", "target")).table().sum(1), atol=1e-8)


def test_selection_finds_the_dependent_pair(small):
    rows = make_demo_table(small, 3000, seed=2)
    rows["flag"] = np.where(rows["colour"].isin(["red", "green"]), "yes", "no")  # flag follows colour
    plan = MeasurementPlan(
        fixed_workload(small),
        (2.0,) * len(fixed_workload(small)),
        selections=1,
        selection_epsilon=2.0,
        selected_noise_multiplier=2.0,
    )
    chosen = [m.columns for m in measure(rows, small, plan, SECRET).marginals if m.selected]
    assert [frozenset(c) for c in chosen] == [frozenset({"colour", "flag"})]
