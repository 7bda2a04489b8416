"""AIM (models/generators/aim/): its budget adds up to rho exactly, every round's selection and measurement
is accounted at the scale it ran, the score's replace-one sensitivity (brute force), the workload's
candidates and weights, the numpy inference and estimator against private-pgm's, the epsilon its schedule
reports, determinism under a fixed secret, and sampling (point masses, values within their bins)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from dpsynth.models.config import MarginalsConfig, PrivacyConfig, Profile, Setting
from dpsynth.models.data.binning import cell_codes, writable_cells
from dpsynth.models.data.demo import MeasuredShape, make_demo_table
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import BudgetExceededError, ConfigError
from dpsynth.models.generators import get
from dpsynth.models.generators.aim import coarse, mechanism
from dpsynth.models.generators.aim.adapter import LABELS, training_rho
from dpsynth.models.generators.aim.config import AIMConfig
from dpsynth.models.generators.aim.estimation import Estimator, Measurement
from dpsynth.models.generators.aim.fit import fit, writable_map
from dpsynth.models.generators.aim.inference import TreeMarginals
from dpsynth.models.generators.aim.privacy import (
    L2_SENSITIVITY,
    AIMBudget,
    RhoLedger,
    last_round,
    round_rho,
    score_sensitivity,
)
from dpsynth.models.generators.aim.sampler import AIMSampler
from dpsynth.models.generators.graphical.jax_runtime import load_jax
from dpsynth.models.generators.graphical.mechanisms import (
    epsilon_of,
    exponential_mechanism,
    gaussian_counts,
    rho_for_epsilon,
)
from dpsynth.models.generators.mst.adapter import generator_file
from dpsynth.models.marginals.measure import epsilon_of_rho, rho_of, selection_rho
from dpsynth.models.privacy.lifetime import ReleaseCost
from dpsynth.models.privacy.secret import PrivacySecret
from tests.conftest import TEST_SECRET_HEX
from tests.models.aim_ledgers import keep_ledgers
from tests.models.test_mst import BINS, SCHEMA, _table

SECRET = PrivacySecret.from_hex(TEST_SECRET_HEX)
RHO = 2.0
ROUNDS = 16  # 4 columns: the 1-way marginals take 0.225 rho, then rounds at rho / 16 until the last


def _fit(secret: PrivacySecret = SECRET, table: pd.DataFrame | None = None):
    return fit(
        _table() if table is None else table,
        SCHEMA.columns,
        SCHEMA.target,
        RHO,
        secret.numpy,
        bins=BINS,
        rounds=ROUNDS,
        max_model_mb=1.0,
        round_iterations=50,
        iterations=100,
        workload="pairs-and-target-triples",
    )


@pytest.fixture(scope="module")
def fitted():
    """A fit at RHO, with every Gaussian (std) and selection (epsilon, sensitivity) it ran, in order."""
    calls: list[tuple] = []

    def measuring(counts, std, rng):
        calls.append(("measure", std))
        return gaussian_counts(counts, std, rng)

    def selecting(scores, epsilon, rng, sensitivity):
        calls.append(("select", epsilon, sensitivity, len(scores)))
        return exponential_mechanism(scores, epsilon, rng, sensitivity)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mechanism, "gaussian_counts", measuring)
        patch.setattr(mechanism, "exponential_mechanism", selecting)
        ledger = keep_ledgers(patch)
        result = _fit()
    return result, calls, ledger[0]


def _profile(rho: float | None = None, budget: float | None = 1.0, marginals: bool = True) -> Profile:
    return Profile(
        name="t",
        generator="aim",
        settings=(Setting("s"),),
        privacy=PrivacyConfig(epsilon_budget=budget),
        marginals=MarginalsConfig(enabled=marginals, rho=0.005),
        aim=AIMConfig(rho=rho, rounds=ROUNDS, iterations=100, round_iterations=50),
    )


# ------------------------------------------------------------------------------------------ budget


def test_the_starting_scales_spend_rho_in_t_rounds_and_the_last_round_takes_what_is_left():
    budget = AIMBudget(0.02, 15, 240)
    # Replace-one: a Gaussian at std s on counts (L2 sensitivity sqrt 2) costs 1 / s^2; a selection e^2 / 8.
    assert L2_SENSITIVITY == math.sqrt(2)
    assert 240 * round_rho(budget.initial_std, budget.initial_epsilon) == pytest.approx(0.02, rel=1e-12)
    assert 1 / budget.initial_std**2 == pytest.approx(0.9 * 0.02 / 240, rel=1e-12)
    assert rho_of(budget.initial_std / math.sqrt(2)) == pytest.approx(0.9 * 0.02 / 240, rel=1e-12)  # the project's
    assert selection_rho(budget.initial_epsilon) == pytest.approx(0.1 * 0.02 / 240, rel=1e-12)
    std, epsilon = last_round(0.0037)
    assert round_rho(std, epsilon) == pytest.approx(0.0037, rel=1e-14)
    assert 1 / std**2 == pytest.approx(0.9 * 0.0037, rel=1e-12) and epsilon**2 / 8 == pytest.approx(0.1 * 0.0037)
    with pytest.raises(ConfigError, match="too few"):
        AIMBudget(0.02, 15, 15)  # the 1-way marginals and two rounds would not fit
    with pytest.raises(ConfigError, match="two columns"):
        AIMBudget(0.02, 1, 16)


def test_a_one_way_share_spends_that_share_on_the_1_way_marginals_and_plans_the_rounds_on_the_rest():
    budget = AIMBudget(0.02, 15, 240, one_way_share=0.3)
    # d 1-way marginals at s1 cost d / s1^2 = 0.3 rho together; T rounds at the starting scales the rest.
    assert 15 / budget.one_way_std**2 == pytest.approx(0.3 * 0.02, rel=1e-12)
    assert 240 * round_rho(budget.initial_std, budget.initial_epsilon) == pytest.approx(0.7 * 0.02, rel=1e-12)
    assert budget.one_way_std < AIMBudget(0.02, 15, 240).one_way_std  # less noise than at the first rounds' std
    # Share 0 is the paper's: each 1-way marginal at the first rounds' std, the rounds planned on all of rho.
    paper = AIMBudget(0.02, 15, 240)
    assert paper.one_way_std == paper.initial_std and paper.rounds_rho == 0.02
    assert AIMBudget(0.02, 15, 15, one_way_share=0.3).rounds == 15  # the 1-ways no longer share the T rounds
    with pytest.raises(ConfigError, match="one_way_share"):
        AIMBudget(0.02, 15, 240, one_way_share=1.0)


def test_at_a_one_way_share_the_1_way_marginals_run_at_its_std_and_everything_adds_up_to_rho():
    calls: list[float] = []

    def measuring(counts, std, rng):
        calls.append(std)
        return gaussian_counts(counts, std, rng)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mechanism, "gaussian_counts", measuring)
        ledgers = keep_ledgers(patch)
        result = fit(
            _table(), SCHEMA.columns, SCHEMA.target, RHO, SECRET.numpy, bins=BINS, rounds=ROUNDS,
            max_model_mb=1.0, round_iterations=50, iterations=100, workload="pairs-and-target-triples",
            one_way_share=0.4,
        )  # fmt: skip
    d = len(SCHEMA.columns)
    budget = AIMBudget(RHO, d, ROUNDS, one_way_share=0.4)
    entries = ledgers[0].entries
    assert calls[:d] == [budget.one_way_std] * d
    assert [e["std"] for e in entries[:d]] == [budget.one_way_std] * d
    assert math.fsum(e["rho"] for e in entries[:d]) == pytest.approx(0.4 * RHO, rel=1e-12)
    assert result.info["rounds"][0]["std"] == budget.initial_std
    assert math.fsum(e["rho"] for e in entries) == pytest.approx(RHO, rel=1e-12)
    assert result.info["rho_spent"] == pytest.approx(RHO, rel=1e-12)
    assert result.info["budget"]["one_way_share"] == 0.4


def test_the_ledger_refuses_a_spend_past_rho():
    ledger = RhoLedger(1.0)
    ledger.measure((0,), 1.5)  # 1 / 2.25
    with pytest.raises(BudgetExceededError):
        ledger.measure((1,), 1.0)
    assert ledger.spent == pytest.approx(1 / 2.25)


def test_every_mechanism_run_is_accounted_at_its_scale_and_they_add_up_to_rho(fitted):
    result, calls, ledger = fitted
    d = len(SCHEMA.columns)
    budget = AIMBudget(RHO, d, ROUNDS)
    entries = ledger.entries
    # What ran is what the ledger holds, in order: the 1-way measurements, then selection and measurement.
    assert [c[0] for c in calls] == [e["kind"] for e in entries]
    assert [e["kind"] for e in entries[:d]] == ["measure"] * d
    assert all(e["std"] == budget.initial_std for e in entries[:d])
    rounds = entries[d:]
    assert [e["kind"] for e in rounds] == ["select", "measure"] * (len(rounds) // 2) and len(rounds) % 2 == 0
    for call, entry in zip(calls, entries, strict=True):
        if entry["kind"] == "measure":
            assert call[1] == entry["std"] and entry["rho"] == pytest.approx(1 / entry["std"] ** 2, rel=1e-15)
        else:
            assert call[1:3] == (entry["epsilon"], entry["sensitivity"])
            assert entry["rho"] == pytest.approx(entry["epsilon"] ** 2 / 8, rel=1e-15)
    assert math.fsum(e["rho"] for e in entries) == pytest.approx(RHO, rel=1e-12)
    assert result.info["rho_spent"] == pytest.approx(RHO, rel=1e-12)
    # Each round recorded its scales, and a round after an annealed one runs at half the std.
    assert len(result.info["rounds"]) == len(rounds) // 2
    for before, after in itertools.pairwise(result.info["rounds"][:-1]):
        assert after["std"] == (before["std"] / 2 if before["annealed"] else before["std"])
    # The last round spent exactly what was left.
    last_select, last_measure = rounds[-2], rounds[-1]
    left = RHO - math.fsum(e["rho"] for e in entries[:-2])
    assert (last_measure["std"], last_select["epsilon"]) == last_round(left)


# ------------------------------------------------------------------------------------- selection


def test_a_replaced_row_moves_each_weighted_score_by_at_most_twice_its_weight():
    rng = np.random.default_rng(5)
    sizes = [3, 4, 2]
    codes = [rng.integers(0, s, 30) for s in sizes]
    candidates = mechanism.candidate_weights(mechanism.workload(3, 2, "pairs-and-target-triples"))
    model = TreeMarginals([(0,), (1,), (2,)], [rng.random(s) * 10 for s in sizes], [])
    base = mechanism.scores(candidates, {c: mechanism.counts(codes, sizes, c) for c in candidates}, model, 3.0)
    bound = np.array([score_sensitivity([w]) for w in candidates.values()])
    for row in range(4):
        for values in itertools.product(*(range(s) for s in sizes)):
            other = [c.copy() for c in codes]
            for j, v in enumerate(values):
                other[j][row] = v
            answers = {c: mechanism.counts(other, sizes, c) for c in candidates}
            for c in candidates:
                assert np.linalg.norm(answers[c] - mechanism.counts(codes, sizes, c)) <= L2_SENSITIVITY + 1e-12
            moved = np.abs(mechanism.scores(candidates, answers, model, 3.0) - base)
            assert np.all(moved <= bound + 1e-9)
    assert score_sensitivity([1.0, 3.0, 2.0]) == 6.0


def test_the_candidates_are_the_workloads_downward_closure_weighted_by_the_columns_they_cover():
    work = mechanism.workload(4, 3, "pairs-and-target-triples")
    assert work[:6] == list(itertools.combinations(range(4), 2))
    assert work[6:] == [(0, 1, 3), (0, 2, 3), (1, 2, 3)]
    assert mechanism.workload(4, 3, "pairs") == work[:6]
    weights = mechanism.candidate_weights(work)
    assert set(weights) == {c for w in work for r in (1, 2, 3) for c in itertools.combinations(w, r)}
    assert weights[(0,)] == 3 + 2 and weights[(3,)] == 3 + 3  # in 3 pairs and 2 (or 3) triples
    assert weights[(0, 3)] == pytest.approx(sum(len({0, 3} & set(w)) for w in work))


def test_candidates_within_the_cap_or_inside_the_model_are_allowed():
    weights = {(0,): 1.0, (0, 1): 2.0, (1, 2): 2.0, (0, 1, 2): 3.0}
    sizes = {(0,): 1.0, (0, 1): 1.0, (1, 2): 5.0, (0, 1, 2): 9.0}
    allowed = mechanism.within_cap(weights, [(0, 1)], 2.0, lambda cliques: max(sizes[c] for c in cliques))
    assert list(allowed) == [(0,), (0, 1)]


# ----------------------------------------------------------------------------- inference and estimation


def _measurements(rng: np.random.Generator, sizes: list[int]) -> list[Measurement]:
    cliques = [(j,) for j in range(len(sizes))] + [(0, 1), (1, 2, 3), (3, 4), (0, 4)]
    return [Measurement(c, rng.random(int(np.prod([sizes[j] for j in c]))) * 100, 5.0) for c in cliques]


def test_the_numpy_estimate_and_its_marginals_are_private_pgms():
    from mbi import LinearMeasurement, estimation

    sizes = [3, 4, 2, 5, 3]
    measurements = _measurements(np.random.default_rng(0), sizes)
    estimator = Estimator(sizes, 1000.0)
    names = estimator.names
    linear = [LinearMeasurement(m.y, tuple(names[j] for j in m.clique), m.std) for m in measurements]
    reference = estimation.MirrorDescent().estimate(estimator.domain, linear, known_total=1000.0, iters=1000)
    # The marginals of private-pgm's model, from its potentials by the numpy junction tree: exact.
    potentials = {
        tuple(names.index(a) for a in reference.potentials[c].domain.attributes): np.asarray(
            reference.potentials[c].values
        )
        for c in reference.potentials.cliques
    }
    exact = estimator.junction_tree(potentials).marginals()
    for clique in [(0,), (0, 1), (1, 2, 3), (0, 3), (2, 4), (0, 2, 4), (0, 1, 2, 3, 4)]:
        expected = np.asarray(reference.project(tuple(names[j] for j in clique)).datavector(flatten=False))
        assert exact.marginal(clique) == pytest.approx(expected, rel=1e-9, abs=1e-9)
        assert exact.marginal(clique).sum() == pytest.approx(1000.0, rel=1e-12)
    # The numpy mirror descent minimises the same loss (from a first step of its own): converged, it lands
    # where private-pgm does.
    ours = estimator.round_fit(measurements, 1000).marginals()
    for clique in [(0, 1), (1, 2, 3), (0, 3), (0, 1, 2, 3, 4)]:
        expected = np.asarray(reference.project(tuple(names[j] for j in clique)).datavector(flatten=False))
        assert ours.marginal(clique) == pytest.approx(expected, abs=0.05)  # counts of 1000
    # A forest (columns not yet joined) is independent across its trees.
    forest = Estimator(sizes, 1000.0).round_fit(measurements[:6], 50).marginals()
    joint = forest.marginal((0, 2))
    assert joint == pytest.approx(np.outer(joint.sum(axis=1), joint.sum(axis=0)) / 1000.0, rel=1e-9)


# ----------------------------------------------------------------------------------- the adapter


def test_the_schedule_reports_the_conversion_of_aims_rho_plus_the_marginals():
    profile = _profile(rho=0.05, budget=None)
    setting = profile.release_target()
    schedule = get("aim").schedule(profile, setting)
    assert schedule.iterations == (0, 1) and schedule.first_trained == 1
    assert schedule.epsilons == (epsilon_of_rho(0.005, 1e-5), epsilon_of_rho(0.055, 1e-5))
    curve = get("aim").training_curve(profile, setting, 1)
    orders, rdp = ReleaseCost(1.0, 1e-5, curve, choice_epsilon=0.0).rdp()
    assert rdp == pytest.approx(orders * 0.055, rel=1e-12)


def test_a_null_rho_is_the_largest_that_fits_the_budget_with_the_marginals():
    profile = _profile(rho=None, budget=1.0)
    setting = profile.release_target()
    rho = training_rho(profile, setting)
    assert rho == rho_for_epsilon(1.0, 1e-5, 0.005)
    assert epsilon_of(rho + 0.005, 1e-5) <= 1.0 < epsilon_of(rho * 1.000001 + 0.005, 1e-5)
    with pytest.raises(ConfigError, match="no budget"):
        training_rho(_profile(rho=None, budget=None), setting)
    with pytest.raises(BudgetExceededError):
        get("aim").plan(_profile(rho=0.5, budget=1.0), setting)
    with pytest.raises(ConfigError, match="non-private baseline"):
        get("aim").check(profile, Setting("np", private=False))
    with pytest.raises(ConfigError, match="too few"):
        get("aim").check(_profile(rho=0.05), setting, _wide_schema(20))  # 8 rounds for 20 columns


def _wide_schema(columns: int):
    from dpsynth.models.data.schema import DatasetSchema

    spec = {f"c{j}": {"type": "binary", "levels": [0, 1]} for j in range(columns)}
    return DatasetSchema.from_dict({"name": "wide", "target": "c0", "columns": spec})


def test_every_public_parameter_is_labelled_and_depends_on_the_profile_only():
    profile = _profile(rho=0.06)
    facts = get("aim").training_facts(profile, profile.release_target())
    assert set(facts.parameters) == set(LABELS)
    assert facts.parameters["aim_rho"] == 0.06 and facts.parameters["aim_rounds"] == ROUNDS
    assert facts.parameters["aim_gaussian_sensitivity"] == math.sqrt(2)
    assert facts.parameters["aim_score_sensitivity"] == 2.0


# ------------------------------------------------------------------------ determinism and sampling


def test_the_same_secret_draws_the_same_model_and_another_secret_another(fitted):
    first = fitted[0]
    again = _fit()
    assert again.info == first.info
    assert all(np.array_equal(a, b) for a, b in zip(first.model.tables, again.model.tables, strict=True))
    other = _fit(PrivacySecret.from_hex("a7" * 32))
    assert other.info["rounds"] != first.info["rounds"] or any(
        a.shape != b.shape or not np.array_equal(a, b)
        for a, b in zip(first.model.tables, other.model.tables, strict=True)
    )


def test_declared_point_masses_survive_sampling_exactly(fitted):
    table = _table()
    sampler = AIMSampler(generator_file(fitted[0].model, SCHEMA, 1, 1.0, 1e-5))
    rows = TableEncoder(SCHEMA).decode(sampler.sample(20_000, 2))  # through the released file's path
    for name, mass in (("money", 0.0), ("rate", 2.5)):
        col = SCHEMA.column(name)
        in_mass_cell = cell_codes(col, rows[name].to_numpy(), BINS) == BINS  # the first cell after the bins
        assert np.array_equal(in_mass_cell, rows[name].to_numpy() == mass)
        assert float(in_mass_cell.mean()) == pytest.approx(float((table[name] == mass).mean()), abs=0.03)


def test_continuous_values_decode_within_the_cells_the_model_draws(fitted):
    model = fitted[0].model
    rows = model.sample(20_000, np.random.default_rng(4))
    for j, col in enumerate(SCHEMA.columns):
        if not col.is_continuous:
            continue
        mapping = writable_map(col, BINS)
        codes = cell_codes(col, rows[col.name].to_numpy(), BINS)
        assert (codes >= 0).all() and writable_cells(col, BINS)[codes].all()
        low, high = col.bounds
        assert rows[col.name].between(low, high).all()
        # The model's 1-way shares of each cell: the sample's cells match them (stratified draws), so every
        # value landed in the cell drawn for it.
        k = next(k for k, clique in enumerate(model.cliques) if j in clique)
        table = model.tables[k]
        shares = table.sum(axis=tuple(i for i, a in enumerate(model.cliques[k]) if a != j))
        drawn = np.bincount(mapping[codes], minlength=len(shares)) / len(rows)
        assert drawn == pytest.approx(shares, abs=0.01)


# -------------------------------------------------------------- pairs of continuous columns (issue 41)

PAIRED = DatasetSchema.from_dict(
    {
        "name": "paired",
        "target": "y",
        "columns": {
            "age": {"type": "continuous", "bounds": [20.0, 80.0], "decimals": 0},
            "height": {"type": "continuous", "bounds": [120.0, 220.0], "decimals": 0},
            "upper": {"type": "continuous", "bounds": [60.0, 240.0], "decimals": 0},
            "lower": {"type": "continuous", "bounds": [30.0, 160.0], "decimals": 0},
            "level": {"type": "categorical", "levels": [1, 2, 3]},
            "y": {"type": "binary", "levels": [0, 1]},
        },
    }
)
PAIRED_ROWS = 5000


def _paired_fit(config: AIMConfig, selections: list | None = None, ledgers: list | None = None):
    """AIM on a generated measured-shape table at epsilon 1 (delta 1e-5) with `config`'s workload keys;
    `selections` collects each round's (weights of its candidates, sensitivity the mechanism ran at),
    `ledgers` the run's rho ledger."""
    table = make_demo_table(PAIRED, PAIRED_ROWS, seed=3, shape=MeasuredShape())
    with pytest.MonkeyPatch.context() as patch:
        if selections is not None:
            pool: list[float] = []
            original_scores = mechanism.scores

            def scoring(candidates, *args, **kwargs):
                pool.extend(candidates.values())
                return original_scores(candidates, *args, **kwargs)

            def selecting(scores, epsilon, rng, sensitivity):
                assert len(pool) == len(scores)  # every candidate of the round was scored with its weight
                selections.append((list(pool), sensitivity))
                pool.clear()
                return exponential_mechanism(scores, epsilon, rng, sensitivity)

            patch.setattr(mechanism, "scores", scoring)
            patch.setattr(mechanism, "exponential_mechanism", selecting)
        if ledgers is not None:
            original_ledger = mechanism.RhoLedger

            def keep(rho):
                ledgers.append(original_ledger(rho))
                return ledgers[-1]

            patch.setattr(mechanism, "RhoLedger", keep)
        return fit(
            table,
            PAIRED.columns,
            PAIRED.target,
            rho_for_epsilon(1.0, 1e-5),
            SECRET.numpy,
            bins=config.bins,
            rounds=None,
            max_model_mb=config.max_model_mb,
            round_iterations=config.round_iterations,
            iterations=50,  # the released estimate only: the rounds ran at the section's defaults
            workload=config.workload,
            numeric_pair_weight=config.numeric_pair_weight,
            numeric_pair_groups=config.numeric_pair_groups,
            one_way_share=config.one_way_share,
            numeric_pair_share=config.numeric_pair_share,
            pair_round_groups=config.pair_round_groups,
        )


def _continuous_pairs(result) -> list[list[str]]:
    continuous = {c.name for c in PAIRED.columns if c.is_continuous}
    return [r["clique"] for r in result.info["rounds"] if len(r["clique"]) == 2 and set(r["clique"]) <= continuous]


def test_at_epsilon_1_grouped_candidates_measure_a_pair_of_continuous_columns():
    # The paper's candidates only (numeric_pair_groups 0, the default): no round can afford such a pair
    # on its fine cells; with 5 groups the rounds measure one over its groups of cells.
    assert AIMConfig().numeric_pair_groups == 0
    assert _continuous_pairs(_paired_fit(AIMConfig())) == []
    fitted_grouped = _paired_fit(AIMConfig(numeric_pair_groups=5))
    assert ["upper", "lower"] in _continuous_pairs(fitted_grouped)
    assert any(r["grouped"] for r in fitted_grouped.info["rounds"])


def test_each_selection_runs_at_twice_the_largest_weight_among_its_candidates_weights_included():
    selections: list = []
    ledgers: list[RhoLedger] = []
    weighted = _paired_fit(AIMConfig(numeric_pair_weight=8.0), selections, ledgers)
    plain_weights = mechanism.candidate_weights(mechanism.workload(6, 5, "pairs-and-target-triples"))
    selects = [e for e in ledgers[0].entries if e["kind"] == "select"]
    assert len(selections) == len(selects) == len(weighted.info["rounds"]) >= 1
    for (weights, sensitivity), entry in zip(selections, selects, strict=True):
        assert sensitivity == 2.0 * max(weights) == entry["sensitivity"]
        assert entry["rho"] == pytest.approx(entry["epsilon"] ** 2 / 8.0, rel=1e-12)
        # The weights lifted the pairs of continuous columns past every unweighted candidate's weight,
        # and the mechanism paid for it.
        assert sensitivity > 2.0 * max(plain_weights.values())


def test_workload_weights_lift_only_pairs_of_continuous_columns():
    work = mechanism.workload(4, 3, "pairs-and-target-triples")
    weights = mechanism.workload_weights(work, continuous=[0, 1], numeric_pair_weight=5.0)
    assert weights[(0, 1)] == 5.0 and all(w == 1.0 for c, w in weights.items() if c != (0, 1))
    compiled = mechanism.candidate_weights(work, weights)
    plain = mechanism.candidate_weights(work)
    assert compiled[(0, 1)] == plain[(0, 1)] + 4.0 * 2  # the pair covers both its columns
    assert compiled[(0,)] == plain[(0,)] + 4.0 and compiled[(2,)] == plain[(2,)]
    assert mechanism.candidate_weights(work, mechanism.workload_weights(work, [0, 1], 1.0)) == plain


def test_a_replaced_row_moves_each_grouped_weighted_score_by_at_most_twice_its_weight():
    rng = np.random.default_rng(7)
    sizes = [6, 5, 2]
    codes = [rng.integers(0, s, 25) for s in sizes]
    model = TreeMarginals([(0,), (1,), (2,)], [rng.random(s) * 10 for s in sizes], [])
    groups = mechanism.pair_groups([(0, 1)], [0, 1], sizes, model, 2)
    assert set(groups) == {(0, 1)} and [g.shape for g in groups[(0, 1)]] == [(6, 2), (5, 2)]
    candidates = {(0, 1): 7.0}

    def grouped(cols):
        return {(0, 1): coarse.aggregate(mechanism.counts(cols, sizes, (0, 1)).reshape(6, 5), groups[(0, 1)]).ravel()}

    base = mechanism.scores(candidates, grouped(codes), model, 3.0, groups)
    for row in range(3):
        for values in itertools.product(*(range(s) for s in sizes)):
            other = [c.copy() for c in codes]
            for j, v in enumerate(values):
                other[j][row] = v
            moved = np.abs(mechanism.scores(candidates, grouped(other), model, 3.0, groups) - base)
            assert np.all(moved <= score_sensitivity([7.0]) + 1e-9)


def test_groups_are_runs_of_adjacent_cells_at_equal_shares_of_the_noisy_estimate():
    estimate = np.array([1.0, 1.0, 1.0, 1.0, 50.0, 1.0, 1.0, 20.0, 1.0, 23.0])
    group = coarse.quantile_groups(estimate, 4)
    assert np.all(np.diff(group) >= 0) and group[0] == 0 and set(np.diff(group)) <= {0, 1}
    assert group.max() <= 3 and len(set(group[[4]]) & set(group[:4])) == 0  # the heavy cell its own group
    assert list(coarse.quantile_groups(np.ones(3), 5)) == [0, 1, 2]  # fewer cells than groups: each its own
    matrix = coarse.group_matrix(group)
    assert matrix.sum(axis=1).tolist() == [1.0] * 10
    # The query and its adjoint: <Q x, r> = <x, Q^T r>, and the released estimator's query is the same.
    matrices = (matrix, coarse.group_matrix(np.array([0, 0, 1])))
    x, r = np.random.default_rng(1).random((10, 3)), np.random.default_rng(2).random((group.max() + 1, 2))
    assert float(np.sum(coarse.aggregate(x, matrices) * r)) == pytest.approx(
        float(np.sum(x * coarse.spread(r, matrices)))
    )
    load_jax()
    from mbi import Domain, Factor

    factor = Factor(Domain(["b", "a"], [3, 10]), x.T.copy())
    query = coarse.GroupQuery(("a", "b"), matrices)
    assert np.asarray(query(factor)) == pytest.approx(coarse.aggregate(x, matrices).ravel())
    assert query.op_norm_sq() == coarse.operator_norm_sq(matrices) == float(matrix.sum(axis=0).max() * 2)


def test_a_grouped_measurement_is_fitted_by_both_estimators():
    rng = np.random.default_rng(0)
    x = rng.normal(size=4000)
    a = np.clip(((x + 3) / 6 * 12).astype(int), 0, 11)
    b = np.clip(((x + 0.3 * rng.normal(size=4000) + 3) / 6 * 12).astype(int), 0, 11)
    sizes = [12, 12]
    pair = mechanism.counts([a, b], sizes, (0, 1)).reshape(12, 12)
    groups = tuple(coarse.group_matrix(coarse.quantile_groups(pair.sum(axis=k), 4)) for k in (1, 0))
    truth = coarse.aggregate(pair, groups)
    measured = [
        Measurement((0,), pair.sum(axis=1), 1.0),
        Measurement((1,), pair.sum(axis=0), 1.0),
        Measurement((0, 1), truth.ravel(), 1.0, groups),
    ]
    estimator = Estimator(sizes, 4000)
    independent = np.outer(pair.sum(axis=1), pair.sum(axis=0)) / 4000
    start = float(np.abs(coarse.aggregate(independent, groups) - truth).sum())
    rounds = estimator.round_fit(measured, 1000).marginals()
    assert float(np.abs(coarse.aggregate(rounds.marginal((0, 1)), groups) - truth).sum()) < 0.05 * start
    final = estimator.final_fit(measured, 200).marginals()
    assert float(np.abs(coarse.aggregate(final.marginal((0, 1)), groups) - truth).sum()) < 0.05 * start


# ------------------------------------------------- pair rounds: aim.numeric_pair_share (issue 41 item 3)


def test_a_numeric_pair_share_pays_for_c_minus_1_pair_rounds_and_the_shares_add_up_to_rho():
    # 15 columns, 6 of them continuous: five pair rounds spend 0.2 rho together, the 1-way marginals 0.3
    # rho, and the T rounds are planned on the other half.
    budget = AIMBudget(0.02, 15, 240, one_way_share=0.3, numeric_pair_share=0.2, continuous=6)
    assert budget.pair_rounds == 5 and budget.pair_rho == pytest.approx(0.2 * 0.02, rel=1e-12)
    assert 5 * round_rho(budget.pair_std, budget.pair_epsilon) == pytest.approx(0.2 * 0.02, rel=1e-12)
    assert 5 / budget.pair_std**2 == pytest.approx(0.9 * 0.2 * 0.02, rel=1e-12)  # the split of each pair round
    assert 15 / budget.one_way_std**2 == pytest.approx(0.3 * 0.02, rel=1e-12)
    assert 240 * round_rho(budget.initial_std, budget.initial_epsilon) == pytest.approx(0.5 * 0.02, rel=1e-12)
    # Share 0 (the default, the paper's) or fewer than two continuous columns: no pair round, nothing spent.
    for unpaired in (AIMBudget(0.02, 15, 240, 0.3, 0.0, 6), AIMBudget(0.02, 15, 240, 0.3, 0.2, 1)):
        assert unpaired.pair_rounds == 0 and unpaired.pair_rho == 0.0
        assert unpaired.rounds_rho == pytest.approx(0.7 * 0.02, rel=1e-12)
    assert AIMConfig().numeric_pair_share == 0.0
    with pytest.raises(ConfigError, match="numeric_pair_share"):
        AIMBudget(0.02, 15, 240, one_way_share=0.6, numeric_pair_share=0.4, continuous=6)


def _ledgered_paired_fit(config: AIMConfig):
    """`_paired_fit` with every Gaussian's std the fit drew, in order, and its rho ledger."""
    stds: list[float] = []

    def measuring(counts, std, rng):
        stds.append(std)
        return gaussian_counts(counts, std, rng)

    ledgers: list[RhoLedger] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mechanism, "gaussian_counts", measuring)
        result = _paired_fit(config, ledgers=ledgers)
    return result, stds, ledgers[0]


def test_at_epsilon_1_a_numeric_pair_share_measures_the_monotone_pair_and_its_rho_adds_up():
    # The generated table's upper and lower pressures rise together (rank correlation about 0.7): at
    # epsilon 1 the paper's rounds measure no pair of continuous columns; with the share, the first pair
    # round chooses that pair and measures it over groups of cells.
    paper, _, _ = _ledgered_paired_fit(AIMConfig())
    assert _continuous_pairs(paper) == [] and paper.info["pair_rounds"] == []
    config = AIMConfig(one_way_share=0.33, numeric_pair_share=0.2)
    result, stds, ledger = _ledgered_paired_fit(config)
    pair_rounds = result.info["pair_rounds"]
    assert pair_rounds[0]["clique"] == ["upper", "lower"] and pair_rounds[0]["grouped"]
    continuous = {c.name for c in PAIRED.columns if c.is_continuous}
    assert all(len(r["clique"]) == 2 and set(r["clique"]) <= continuous for r in pair_rounds)
    assert len({tuple(r["clique"]) for r in pair_rounds}) == len(pair_rounds)  # never the same pair twice
    # The ledger holds what ran: the 1-way marginals at their share, the pair rounds (select, measure) at
    # the budget's pair scales, spending the pair share exactly, then the rounds; all of it adds up to rho.
    rho = rho_for_epsilon(1.0, 1e-5)
    budget = AIMBudget(rho, 6, 96, 0.33, 0.2, continuous=4)
    assert budget.pair_rounds == 3 == len(pair_rounds)
    entries, d = ledger.entries, len(PAIRED.columns)
    assert [e["std"] for e in entries[:d]] == [budget.one_way_std] * d
    paired = entries[d : d + 2 * budget.pair_rounds]
    assert [e["kind"] for e in paired] == ["select", "measure"] * budget.pair_rounds
    names = PAIRED.column_names
    assert [e["clique"] for e in paired[::2]] == [[names.index(n) for n in r["clique"]] for r in pair_rounds]
    assert all(e["epsilon"] == budget.pair_epsilon and e["sensitivity"] == 2.0 for e in paired[::2])
    assert all(e["std"] == budget.pair_std for e in paired[1::2])
    assert math.fsum(e["rho"] for e in paired) == pytest.approx(0.2 * rho, rel=1e-12)
    assert stds[: d + budget.pair_rounds] == [budget.one_way_std] * d + [budget.pair_std] * budget.pair_rounds
    assert result.info["rounds"][0]["std"] == budget.initial_std
    assert math.fsum(e["rho"] for e in entries) == pytest.approx(rho, rel=1e-12)
    assert result.info["rho_spent"] == pytest.approx(rho, rel=1e-12)
    assert result.info["budget"]["pair_rounds"] == 3 and result.info["budget"]["numeric_pair_share"] == 0.2
