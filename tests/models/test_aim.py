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
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.errors import BudgetExceededError, ConfigError
from dpsynth.models.generators import get
from dpsynth.models.generators.aim import mechanism
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
from dpsynth.models.generators.mst.adapter import generator_file
from dpsynth.models.generators.mst.privacy import epsilon_of, exponential_mechanism, gaussian_counts, rho_for_epsilon
from dpsynth.models.marginals.measure import epsilon_of_rho, rho_of, selection_rho
from dpsynth.models.privacy.lifetime import ReleaseCost
from dpsynth.models.privacy.secret import PrivacySecret
from tests.conftest import TEST_SECRET_HEX
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
        ledger: list[RhoLedger] = []
        original = mechanism.RhoLedger

        def keep(rho):
            ledger.append(original(rho))
            return ledger[-1]

        patch.setattr(mechanism, "RhoLedger", keep)
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
