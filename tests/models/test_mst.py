"""MST (models/generators/mst/): the noise scales its rho implies, the exponential mechanism and its score's
replace-one sensitivity, the epsilon its schedule reports, the rho it takes from a budget, the light
sampler (no jax, private-pgm or torch), point masses, and the noise's source (the run's secret)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch

from dpsynth.models.config import MarginalsConfig, PrivacyConfig, Profile, Setting
from dpsynth.models.data.binning import cell_codes, cell_count, writable_cells
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import BudgetExceededError, ConfigError
from dpsynth.models.generators import get
from dpsynth.models.generators.graphical.mechanisms import (
    L2_SENSITIVITY,
    SCORE_SENSITIVITY,
    epsilon_of,
    exponential_mechanism,
    gaussian_counts,
    gaussian_std,
    rho_for_epsilon,
    selection_probabilities,
)
from dpsynth.models.generators.graphical.model import MSTModel, conditional_draws
from dpsynth.models.generators.mst import fit as mst_fit
from dpsynth.models.generators.mst.adapter import LABELS, generator_file, training_rho
from dpsynth.models.generators.mst.config import MSTConfig
from dpsynth.models.generators.mst.privacy import DisjointSet, MSTBudget, select_tree
from dpsynth.models.generators.mst.sampler import MSTSampler
from dpsynth.models.marginals.measure import MeasurementPlan, epsilon_of_rho, rho_of, selection_rho
from dpsynth.models.privacy.dpsgd_accountant import ORDERS
from dpsynth.models.privacy.lifetime import ReleaseCost
from dpsynth.models.privacy.secret import PrivacySecret
from tests.conftest import TEST_SECRET_HEX

SECRET = PrivacySecret.from_hex(TEST_SECRET_HEX)
SCHEMA = DatasetSchema.from_dict(
    {
        "name": "mst_test",
        "target": "y",
        "columns": {
            "money": {"type": "continuous", "bounds": [0.0, 1000.0], "decimals": 0, "point_masses": [0.0]},
            "rate": {"type": "continuous", "bounds": [0.0, 10.0], "decimals": 1, "point_masses": [2.5]},
            "colour": {"type": "categorical", "levels": ["red", "green", "blue", "grey"]},
            "y": {"type": "binary", "levels": [0, 1]},
        },
    }
)
ROWS = 4000
RHO = 2.0
BINS = 20


def _table(rows: int = ROWS, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    y = (rng.random(rows) < 0.3).astype(np.int64)
    at_zero = rng.random(rows) < np.where(y == 1, 0.4, 0.8)
    money = np.where(at_zero, 0, np.minimum(np.round(rng.exponential(150, rows)), 1000)).astype(np.int64)
    rate = np.where(rng.random(rows) < 0.25, 2.5, np.round(rng.uniform(0, 10, rows), 1))
    colour = np.array(["red", "green", "blue", "grey"], dtype=object)[rng.choice(4, rows, p=[0.5, 0.3, 0.15, 0.05])]
    return pd.DataFrame({"money": money, "rate": rate, "colour": colour, "y": y})


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return _table()


def _recorded_fit(table: pd.DataFrame, **options) -> tuple:
    """A fit at RHO, with the noise std of every Gaussian mechanism it ran, in order."""
    recorded: list[float] = []

    def recording(counts, std, rng):
        recorded.append(std)
        return gaussian_counts(counts, std, rng)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mst_fit, "gaussian_counts", recording)
        result = mst_fit.fit(table, SCHEMA.columns, RHO, SECRET.numpy, BINS, **options)
    return result, recorded


@pytest.fixture(scope="module")
def fitted(table):
    return _recorded_fit(table, iterations=300)


def _profile(rho: float | None = None, budget: float | None = 1.0, marginals: bool = True, **privacy) -> Profile:
    return Profile(
        name="t",
        generator="mst",
        settings=(Setting("s"),),
        privacy=PrivacyConfig(epsilon_budget=budget, **privacy),
        marginals=MarginalsConfig(enabled=marginals, rho=0.005),
        mst=MSTConfig(rho=rho, iterations=300),
    )


# ------------------------------------------------------------------------------------- noise scales


def test_the_thirds_add_up_to_rho_at_the_noise_scales_it_implies():
    d, rho = 15, 0.0208
    budget = MSTBudget(rho, d)
    assert budget.phase_rho == pytest.approx((rho / 3,) * 3, rel=1e-15) and sum(budget.phase_rho) == pytest.approx(rho)
    # Replace-one: a Gaussian at std s on counts (L2 sensitivity sqrt 2) costs 2 / (2 s^2) = 1 / s^2.
    assert L2_SENSITIVITY == math.sqrt(2) and SCORE_SENSITIVITY == 2.0
    assert budget.one_way_std == pytest.approx(math.sqrt(3 * d / rho), rel=1e-12)
    assert budget.two_way_std == pytest.approx(math.sqrt(3 * (d - 1) / rho), rel=1e-12)
    assert budget.selection_epsilon == pytest.approx(math.sqrt(8 * (rho / 3) / (d - 1)), rel=1e-12)
    assert budget.spent() == pytest.approx(rho, rel=1e-12)
    # The project's own convention agrees: noise multiplier m = std / sqrt(2), rho_of(m) = 1 / (2 m^2), and
    # an exponential-mechanism round at epsilon e costs e^2 / 8 (bounded range).
    assert rho_of(budget.one_way_std / math.sqrt(2)) == pytest.approx(rho / 3 / d, rel=1e-12)
    assert rho_of(budget.two_way_std / math.sqrt(2)) == pytest.approx(rho / 3 / (d - 1), rel=1e-12)
    assert selection_rho(budget.selection_epsilon) == pytest.approx(rho / 3 / (d - 1), rel=1e-12)
    assert budget.selection_epsilon**2 / 8 == pytest.approx(rho / 3 / (d - 1), rel=1e-12)
    with pytest.raises(ConfigError, match="at least two columns"):
        MSTBudget(rho, 1)


def test_declared_shares_split_rho_between_the_phases_and_still_add_up_to_it():
    d, rho = 15, 0.0208
    budget = MSTBudget(rho, d, one_way_share=0.45, selection_share=0.1)
    assert budget.phase_rho == pytest.approx((0.45 * rho, 0.1 * rho, 0.45 * rho), rel=1e-12)
    assert budget.one_way_std == pytest.approx(math.sqrt(d / (0.45 * rho)), rel=1e-12)
    assert budget.two_way_std == pytest.approx(math.sqrt((d - 1) / (0.45 * rho)), rel=1e-12)
    assert budget.selection_epsilon == pytest.approx(math.sqrt(8 * 0.1 * rho / (d - 1)), rel=1e-12)
    assert budget.spent() == pytest.approx(rho, rel=1e-12)
    for one_way, selection in ((0.6, 0.4), (0.0, 0.5), (0.5, 0.0), (1.2, 0.1)):
        with pytest.raises(ConfigError, match="one_way_share"):
            MSTBudget(rho, d, one_way, selection)
    with pytest.raises(ConfigError, match="add up"):
        MSTConfig(one_way_share=0.6, selection_share=0.4)


def test_the_fit_draws_every_gaussian_at_the_scales_of_its_declared_shares(table):
    result, recorded = _recorded_fit(table, iterations=50, shares=(0.5, 0.1))
    d = len(SCHEMA.columns)
    budget = MSTBudget(RHO, d, 0.5, 0.1)
    assert recorded == [budget.one_way_std] * d + [budget.two_way_std] * (d - 1)
    assert result.info["budget"]["phase_rho"] == pytest.approx([0.5 * RHO, 0.1 * RHO, 0.4 * RHO], rel=1e-12)
    assert result.info["budget"]["rho_spent"] == pytest.approx(RHO, rel=1e-12)


def test_gaussian_counts_have_the_std_rho_implies():
    std = gaussian_std(0.01)
    assert std == pytest.approx(10.0)
    noise = gaussian_counts(np.zeros(200_000), std, np.random.default_rng(3))
    assert np.all(noise == np.rint(noise))  # integer draws: post-processing of the Gaussian
    assert noise.std() == pytest.approx(math.sqrt(std**2 + 1 / 12), rel=0.01)  # rounding adds 1/12
    assert abs(noise.mean()) < 5 * std / math.sqrt(len(noise))


def test_the_fit_draws_every_gaussian_at_its_budget_scale(fitted):
    result, recorded = fitted
    d = len(SCHEMA.columns)
    budget = MSTBudget(RHO, d)
    assert recorded == [budget.one_way_std] * d + [budget.two_way_std] * (d - 1)
    assert result.info["budget"]["rho_spent"] == pytest.approx(RHO, rel=1e-12)
    assert len(result.info["tree"]) == d - 1


def test_a_replaced_row_moves_each_count_vector_by_l2_sqrt2_and_each_score_by_at_most_2():
    rng = np.random.default_rng(5)
    a, b = rng.integers(0, 3, 30), rng.integers(0, 4, 30)
    estimate = rng.random(12) * 5
    base_counts = mst_fit.joint_counts(a, b, 3, 4)
    base_score = np.abs(base_counts - estimate).sum()
    for row, new_a, new_b in itertools.product(range(5), range(3), range(4)):
        a2, b2 = a.copy(), b.copy()
        a2[row], b2[row] = new_a, new_b
        counts = mst_fit.joint_counts(a2, b2, 3, 4)
        assert np.linalg.norm(counts - base_counts) <= L2_SENSITIVITY + 1e-12
        assert np.abs(np.bincount(a2, minlength=3) - np.bincount(a, minlength=3)).sum() <= 2
        assert abs(np.abs(counts - estimate).sum() - base_score) <= SCORE_SENSITIVITY + 1e-12


# --------------------------------------------------------------------------------- the selection


def test_the_noise_penalty_takes_a_public_amount_per_cell_from_each_score():
    rng = np.random.default_rng(2)
    reduced = [rng.integers(0, size, 50) for size in (2, 3, 4)]
    shares = [np.full(size, 1.0 / size) for size in (2, 3, 4)]
    plain = mst_fit.pair_scores(reduced, [2, 3, 4], shares)
    expected = np.abs(mst_fit.joint_counts(reduced[0], reduced[1], 2, 3) - 50 / 6).sum()
    assert plain[(0, 1)] == pytest.approx(expected, rel=1e-12)
    penalised = mst_fit.pair_scores(reduced, [2, 3, 4], shares, penalty_std=10.0)
    for (a, b), score in penalised.items():
        cells = [2, 3, 4][a] * [2, 3, 4][b]
        assert score == pytest.approx(plain[(a, b)] - math.sqrt(2 / math.pi) * 10.0 * cells, rel=1e-12)


def test_the_exponential_mechanism_draws_with_the_formulas_probabilities():
    scores, eps = np.array([0.0, 2.0, 5.0]), 1.2
    expected = np.exp(eps * scores / (2 * SCORE_SENSITIVITY))
    expected /= expected.sum()
    assert selection_probabilities(scores, eps) == pytest.approx(expected, rel=1e-12)
    rng = np.random.default_rng(11)
    draws = 40_000
    picks = np.bincount([exponential_mechanism(scores, eps, rng) for _ in range(draws)], minlength=3)
    assert np.all(np.abs(picks / draws - expected) < 4 * np.sqrt(expected * (1 - expected) / draws))


def test_select_tree_is_a_spanning_tree():
    scores = {(a, b): float(a + b) for a in range(5) for b in range(a + 1, 5)}
    edges = select_tree(scores, 5, 1.0, np.random.default_rng(0))
    assert len(edges) == 4
    components = DisjointSet(5)
    for a, b in edges:
        assert components.find(a) != components.find(b)
        components.union(a, b)


def test_one_way_estimate_projects_onto_the_scaled_simplex():
    y, w = np.array([50.0, -3.0, 20.0, 40.0]), np.ones(4)
    mu = mst_fit.one_way_estimate(y, w, 100.0)
    assert mu.sum() == pytest.approx(100.0) and mu[1] == 0.0 and np.all(mu >= 0)
    shift = mu[[0, 2, 3]] - y[[0, 2, 3]]  # unweighted: the same shift for every positive cell
    assert np.allclose(shift, shift[0])


def test_domain_reduction_keeps_writable_cells_above_three_std_and_merges_the_rest():
    col = SCHEMA.column("colour")
    noisy, std = np.array([100.0, 29.0, 31.0, -5.0]), 10.0
    reduced = mst_fit.reduce_domain(noisy, col, BINS, std)
    assert list(reduced.mapping) == [0, 2, 1, 2]
    # The "other" code's measurement and query carry 1 / sqrt(members): its noise std stays `std`.
    assert reduced.y == pytest.approx([100.0, 31.0, 24.0 / math.sqrt(2)])
    assert reduced.w == pytest.approx([1.0, 1.0, 1 / math.sqrt(2)])


# ---------------------------------------------------------------------------- epsilon and rho


def test_epsilon_of_rho_is_the_measurement_plans_conversion():
    plan = MeasurementPlan((("a",), ("b",)), (3.0, 4.0))
    for conversion in ("classic", "opacus"):
        assert epsilon_of_rho(plan.rho(), 1e-5, conversion) == plan.epsilon(1e-5, conversion)
    grid = np.asarray(ORDERS)
    assert epsilon_of_rho(0.02, 1e-5) == float(np.min(grid * 0.02 + math.log(1e5) / (grid - 1)))
    assert epsilon_of_rho(0.0, 1e-5) == 0.0
    with pytest.raises(ConfigError):
        epsilon_of_rho(-1.0, 1e-5)


def test_the_schedule_reports_the_conversion_of_msts_rho_plus_the_marginals():
    profile = _profile(rho=0.05, budget=None)
    setting = profile.release_target()
    schedule = get("mst").schedule(profile, setting)
    assert schedule.iterations == (0, 1) and schedule.first_trained == 1
    assert schedule.epsilons == (epsilon_of_rho(0.005, 1e-5), epsilon_of_rho(0.055, 1e-5))
    no_marginals = _profile(rho=0.05, budget=None, marginals=False)
    assert get("mst").schedule(no_marginals, setting).epsilons == (0.0, epsilon_of_rho(0.05, 1e-5))


def test_a_null_rho_is_the_largest_that_fits_the_budget_with_the_marginals():
    profile = _profile(rho=None, budget=1.0)
    setting = profile.release_target()
    rho = training_rho(profile, setting)
    assert epsilon_of(rho + 0.005, 1e-5) <= 1.0 < epsilon_of(rho * 1.000001 + 0.005, 1e-5)
    assert rho_for_epsilon(1.0, 1e-5) == pytest.approx(0.0208, rel=0.01)  # without the marginals
    plan = get("mst").plan(profile, setting)
    assert plan.iterations == (0, 1) and plan.epsilon == epsilon_of_rho(rho + 0.005, 1e-5) <= 1.0
    with pytest.raises(ConfigError, match="no budget"):
        training_rho(_profile(rho=None, budget=None), setting)
    with pytest.raises(BudgetExceededError, match="measured marginals alone"):
        training_rho(_profile(rho=None, budget=0.3), setting)
    with pytest.raises(BudgetExceededError):  # a rho given by hand above the budget
        get("mst").plan(_profile(rho=0.5, budget=1.0), setting)


def test_mst_trains_only_private_settings_of_two_columns_or_more():
    profile = _profile(rho=0.05)
    with pytest.raises(ConfigError, match="non-private baseline"):
        get("mst").check(profile, Setting("np", private=False))
    one = DatasetSchema.from_dict(
        {"name": "one", "target": "y", "columns": {"y": {"type": "binary", "levels": [0, 1]}}}
    )
    with pytest.raises(ConfigError, match="one column"):
        get("mst").check(profile, profile.release_target(), one)


def test_the_lifetime_curve_is_order_times_the_rho_spent():
    profile = _profile(rho=0.05)
    setting = profile.release_target()
    for trained, rho in ((1, 0.055), (0, 0.005)):
        curve = get("mst").training_curve(profile, setting, trained)
        orders, rdp = ReleaseCost(1.0, 1e-5, curve, choice_epsilon=0.0).rdp()
        assert rdp == pytest.approx(orders * rho, rel=1e-12)


def test_every_public_parameter_is_labelled_and_depends_on_the_profile_only():
    profile = _profile(rho=0.06)
    facts = get("mst").training_facts(profile, profile.release_target())
    assert set(facts.parameters) == set(LABELS) and set(facts.parameters) <= set(facts.labels)
    p = facts.parameters
    phases = p["mst_rho_one_way"] + p["mst_rho_selection"] + p["mst_rho_two_way"]
    assert p["mst_rho"] == 0.06 and p["mst_rho_shapes"] == pytest.approx(0.1 * 0.06, rel=1e-12)  # mst.shape_share
    assert phases + p["mst_rho_shapes"] == pytest.approx(0.06, rel=1e-12)
    assert p["mst_gaussian_sensitivity"] == math.sqrt(2) and p["mst_score_sensitivity"] == 2.0


# ------------------------------------------------------------------------------------- sampling


def test_a_sample_is_schema_shaped_and_the_arrays_round_trip(fitted, table):
    model = fitted[0].model
    rows = model.sample(500, np.random.default_rng(1))
    assert list(rows.columns) == SCHEMA.column_names and len(rows) == 500
    assert rows.dtypes.to_dict() == TableEncoder(SCHEMA).decode(TableEncoder(SCHEMA).encode(table)).dtypes.to_dict()
    again = MSTModel.from_arrays(*model.to_arrays())
    pd.testing.assert_frame_equal(again.sample(500, np.random.default_rng(1)), rows)
    for col in SCHEMA.columns:  # every value codes back to a writable cell
        codes = cell_codes(col, rows[col.name].to_numpy(), BINS)
        assert (codes >= 0).all() and writable_cells(col, BINS)[codes].all()
    assert model.sample(0, np.random.default_rng(1)).shape == (0, len(SCHEMA.columns))


def test_declared_point_masses_survive_sampling_exactly(fitted, table):
    sampler = MSTSampler(generator_file(fitted[0].model, SCHEMA, 1, 1.0, 1e-5))
    rows = TableEncoder(SCHEMA).decode(sampler.sample(20_000, 2))  # through the released file's path
    for name, mass in (("money", 0.0), ("rate", 2.5)):
        col = SCHEMA.column(name)
        in_mass_cell = cell_codes(col, rows[name].to_numpy(), BINS) == BINS  # the first cell after the bins
        assert np.array_equal(in_mass_cell, rows[name].to_numpy() == mass)
        assert float(in_mass_cell.mean()) == pytest.approx(float((table[name] == mass).mean()), abs=0.03)


def test_checkpoint_zero_is_uniform_over_the_writable_cells():
    col = DatasetSchema.from_dict(
        {
            "name": "grid",
            "target": "y",
            "columns": {
                "years": {"type": "continuous", "bounds": [1, 16], "decimals": 0},
                "y": {"type": "binary", "levels": [0, 1]},
            },
        }
    )
    model = MSTModel.uniform(col.columns, BINS)
    writable = writable_cells(col.column("years"), BINS)
    assert writable.sum() == 16 and not writable.all()  # 20 bins over [1, 16]: four hold no integer
    rows = model.sample(16_000, np.random.default_rng(0))
    counts = np.bincount(cell_codes(col.column("years"), rows["years"].to_numpy(), BINS), minlength=BINS)
    assert (counts[~writable] == 0).all() and np.abs(counts[writable] - 1000).max() <= 1  # stratified


def test_stratified_draws_match_each_configuration_within_one_row():
    probs = np.array([[0.5, 0.5, 0.0], [0.1, 0.6, 0.3]])
    group = np.random.default_rng(0).integers(0, 2, 1001)
    picks = conditional_draws(probs, group, np.random.default_rng(1))
    for g in range(2):
        counts = np.bincount(picks[group == g], minlength=3)
        assert np.all(np.abs(counts - probs[g] * (group == g).sum()) <= 1.0)
    assert not np.any(picks[group == 0] == 2)  # never where the probability is 0


@pytest.mark.slow
def test_sampling_a_saved_model_imports_no_jax_mbi_or_torch(fitted, tmp_path):
    arrays, meta = fitted[0].model.to_arrays()
    np.savez(tmp_path / "arrays.npz", **arrays)
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    torch.save(generator_file(fitted[0].model, SCHEMA, 1, 1.0, 1e-5) | {"generator_type": "mst"}, tmp_path / "g.pt")
    script = textwrap.dedent(f"""
        import json, sys
        import numpy as np
        from dpsynth.models.generators.graphical.model import MSTModel
        with np.load({str(tmp_path / "arrays.npz")!r}, allow_pickle=False) as npz:
            arrays = {{k: npz[k] for k in npz.files}}
        model = MSTModel.from_arrays(arrays, json.loads(open({str(tmp_path / "meta.json")!r}).read()))
        assert len(model.sample(1000, np.random.default_rng(0))) == 1000
        heavy = [name for name in ("jax", "jaxlib", "mbi", "torch") if name in sys.modules]
        assert not heavy, heavy
        from dpsynth.models.generators.samplers import load_sampler  # the pyfunc model's path (torch)
        assert load_sampler({str(tmp_path / "g.pt")!r}).sample(1000, 0).shape[0] == 1000
        heavy = [name for name in ("jax", "jaxlib", "mbi") if name in sys.modules]
        assert not heavy, heavy
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


# ------------------------------------------------------------------------------- the noise source


def test_all_privacy_noise_comes_from_the_secrets_streams(table, fitted):
    # The same secret draws the same noise: the same model; another secret, other measurements.
    again = mst_fit.fit(table, SCHEMA.columns, RHO, SECRET.numpy, BINS, iterations=300)
    first = fitted[0].model
    assert again.info == fitted[0].info
    assert all(np.array_equal(a, b) for a, b in zip(first.tables, again.model.tables, strict=True))
    other = mst_fit.fit(table, SCHEMA.columns, RHO, PrivacySecret.from_hex("a7" * 32).numpy, BINS, iterations=300)
    assert any(
        a.shape != b.shape or not np.array_equal(a, b) for a, b in zip(first.tables, other.model.tables, strict=True)
    )


def test_writable_cells_name_every_cell_and_keep_every_cell_of_a_discrete_column(cardio_schema):
    columns = [*cardio_schema.columns, *SCHEMA.columns]
    columns.append(dataclasses.replace(SCHEMA.column("rate"), bounds=(0.0, 1.0), decimals=1))
    for col, bins in itertools.product(columns, (5, 20, 40)):
        writable = writable_cells(col, bins)
        assert len(writable) == cell_count(col, bins)
        assert writable.all() or col.is_continuous
