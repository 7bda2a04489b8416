"""AIM's rounds (McKenna, Mullins, Sheldon and Miklau 2022, Algorithm 2) on a table already coded into
cells; models/generators/aim/privacy.py says what each step costs.

1. Candidates: the workload's cliques and every subset of them (the downward closure), each weighted by
   the workload columns it covers: weight(c) = sum over workload cliques w of weight(w) x |c & w|, where
   weight(w) is 1 except for a pair of two continuous columns, which weighs `numeric_pair_weight` (public
   configuration: it lifts the pairs whose dependence Spearman measures against the target's cliques).
2. Every column's 1-way marginal, Gaussian at the budget's 1-way std (the starting std unless a share of
   rho is declared for them: privacy.py); a first estimate. From it (noisy outputs
   only), each pair of two continuous columns gets a few groups of adjacent cells per column
   (`numeric_pair_groups`, models/generators/aim/coarse.py) and becomes a second candidate over those
   groups, at the pair's weight: on its fine cells such a pair's own noise outweighs any error at
   epsilon 1, so without the groups no round measures the continuous columns' dependence.
   With a declared `numeric_pair_share` (privacy.py), pair rounds follow, one per edge of a tree over
   the continuous columns: each chooses by the exponential mechanism, among the pairs of two continuous
   columns not yet measured that keep the model within the size cap, the one whose model estimate over
   groups of cells (`pair_round_groups` per column, cut as above) is worst, and measures it over those
   groups (Gaussian), at scales fixed by the share; the model is re-estimated after each. At epsilon 1
   the rounds below go to the target's cliques, and no pair of continuous columns would otherwise be
   measured (docs/utility-study.md section 7).
3. Rounds: the candidates whose junction tree would stay within the size cap (which grows with the share
   of rho spent; a clique inside the model's is always allowed) are scored by weight x (L1 distance
   between their real counts and the model's - sqrt(2 / pi) std x cells: the error the measurement's own
   noise would leave; a grouped pair's over its groups), one is chosen by the exponential mechanism,
   measured by the Gaussian mechanism, and the model re-estimated from its predecessor. When the
   re-estimate moved the chosen marginal (or groups) by less than its noise's expected L1 size, the std
   halves and the selection's epsilon doubles.
4. When less than two rounds' rho is left, the last round takes exactly what is left; then the final
   estimate with the full iterations.

The measurements draw from one noise stream and the selections from another (`noise(purpose)`: the
run's `PrivacySecret.numpy`). Everything the rounds decide besides the real counts in the scores and
the measurements (the cap, the candidates, the model's marginals, annealing) reads noisy outputs and
public facts only.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dpsynth.models.generators.aim import coarse
from dpsynth.models.generators.aim.estimation import Estimator, JunctionTree, Measurement
from dpsynth.models.generators.aim.inference import Clique, TreeMarginals
from dpsynth.models.generators.aim.privacy import AIMBudget, RhoLedger, last_round, round_rho, score_sensitivity
from dpsynth.models.generators.graphical.mechanisms import exponential_mechanism, gaussian_counts

MEASUREMENT_NOISE, SELECTION_NOISE = "aim-measurement", "aim-selection"
# The expected L1 norm of a Gaussian's draw per cell, in stds: E|N(0, s^2)| = sqrt(2 / pi) s.
EXPECTED_ABS = math.sqrt(2.0 / math.pi)

Noise = Callable[[str], np.random.Generator]


def workload(columns: int, target: int, choice: str) -> list[Clique]:
    """Every pair of columns, and with "pairs-and-target-triples" every triple that holds `target`."""
    pairs: list[Clique] = list(itertools.combinations(range(columns), 2))
    if choice == "pairs":
        return pairs
    if choice != "pairs-and-target-triples":
        raise ValueError(f"unknown AIM workload {choice!r}")
    others = [j for j in range(columns) if j != target]
    return pairs + [tuple(sorted((a, b, target))) for a, b in itertools.combinations(others, 2)]


def workload_weights(
    cliques: Sequence[Clique], continuous: Collection[int], numeric_pair_weight: float
) -> dict[Clique, float]:
    """Each workload clique's weight: `numeric_pair_weight` for a pair of two `continuous` columns, else 1."""
    return {w: float(numeric_pair_weight) if len(w) == 2 and set(w) <= set(continuous) else 1.0 for w in cliques}


def candidate_weights(cliques: Sequence[Clique], weights: Mapping[Clique, float] | None = None) -> dict[Clique, float]:
    """The downward closure of `cliques` (every non-empty subset), each weighted by the workload columns it
    covers, every workload clique counting with its weight in `weights` (1 if absent): the paper's
    `compile_workload`."""
    weight = {w: 1.0 if weights is None else float(weights.get(w, 1.0)) for w in cliques}
    closure = {sub for c in cliques for r in range(1, len(c) + 1) for sub in itertools.combinations(c, r)}
    return {
        c: math.fsum(weight[w] * len(set(c) & set(w)) for w in cliques)
        for c in sorted(closure, key=lambda c: (len(c), c))
    }


def counts(codes: Sequence[np.ndarray], sizes: Sequence[int], clique: Clique) -> np.ndarray:
    """The real counts over `clique`'s cells, flat and row-major."""
    shape = tuple(sizes[j] for j in clique)
    flat = np.ravel_multi_index(tuple(codes[j] for j in clique), shape)
    return np.bincount(flat, minlength=int(np.prod(shape))).astype(np.float64)


def scores(
    candidates: dict[Clique, float],
    answers: Mapping[Clique, np.ndarray],
    model: TreeMarginals,
    std: float,
    groups: Mapping[Clique, tuple[np.ndarray, ...]] | None = None,
) -> np.ndarray:
    """Each candidate's score: weight x (L1 error of the model's marginal - sqrt(2 / pi) std x cells); with
    `groups`, `answers` and the model's marginal are over each candidate's groups of cells."""

    def estimate(c: Clique) -> np.ndarray:
        return model.marginal(c).ravel() if groups is None else coarse.aggregate(model.marginal(c), groups[c]).ravel()

    return np.array(
        [
            weight * (float(np.abs(answers[c] - estimate(c)).sum()) - EXPECTED_ABS * std * answers[c].size)
            for c, weight in candidates.items()
        ]
    )


def pair_groups(
    candidates: Iterable[Clique], continuous: Collection[int], sizes: Sequence[int], model: TreeMarginals, groups: int
) -> dict[Clique, tuple[np.ndarray, ...]]:
    """Each candidate pair of two `continuous` columns that has more cells than `groups` x `groups`: one
    group matrix per column, cut at equal shares of the model's 1-way estimate (coarse.py)."""
    if groups < 2:
        return {}
    pairs = [c for c in candidates if len(c) == 2 and set(c) <= set(continuous)]
    matrices = {
        j: coarse.group_matrix(coarse.quantile_groups(model.marginal((j,)), groups))
        for j in {j for c in pairs for j in c}
    }
    return {c: (matrices[c[0]], matrices[c[1]]) for c in pairs if sizes[c[0]] * sizes[c[1]] > groups * groups}


@dataclass(frozen=True)
class AIMRun:
    tree: JunctionTree  # the final estimate's junction tree and clique counts
    ledger: RhoLedger  # every mechanism run, with its rho
    rounds: list[dict]  # per round: the clique chosen, its std and epsilon, whether it annealed
    pair_rounds: list[dict]  # per pair round (numeric_pair_share): the pair chosen, its std and epsilon
    loss: float  # the final estimate's loss on the noisy measurements (internal)
    seconds: dict


def run(
    answers: Mapping[Clique, np.ndarray],
    total: int,
    sizes: Sequence[int],
    budget: AIMBudget,
    work: Sequence[Clique],
    weights: Mapping[Clique, float],
    noise: Noise,
    max_model_mb: float,
    round_iterations: int,
    iterations: int,
    continuous: Collection[int] = (),
    numeric_pair_groups: int = 0,
    pair_round_groups: int = 0,
) -> AIMRun:
    """AIM at `budget` on `total` rows whose exact counts over every candidate (`candidate_weights` of the
    workload; each column coded in [0, size)) are `answers` (`counts`, or counted out of core), its
    workload `work` weighted by `weights` (`workload_weights`); each pair of two `continuous` columns is
    also a candidate over `numeric_pair_groups` groups of cells per column (`pair_groups`; below 2: none);
    the budget's pair rounds measure pairs of them over `pair_round_groups` groups per column.
    Every noise draw happens here, after the counts are complete."""
    started = time.perf_counter()
    candidates = candidate_weights(work, weights)
    ledger = RhoLedger(budget.rho)
    measurement_rng, selection_rng = noise(MEASUREMENT_NOISE), noise(SELECTION_NOISE)
    estimator = Estimator(sizes, total)
    std, epsilon = budget.initial_std, budget.initial_epsilon

    measurements: list[Measurement] = []
    one_way_std = budget.one_way_std
    for j in range(len(sizes)):
        measurements.append(
            Measurement((j,), gaussian_counts(answers[(j,)], one_way_std, measurement_rng), one_way_std)
        )
        ledger.measure((j,), one_way_std)
    model = estimator.round_fit(measurements, round_iterations).marginals()
    # Cut from the noisy 1-way estimate (post-processing), then fixed for every round.
    groups = pair_groups(candidates, continuous, sizes, model, numeric_pair_groups)
    grouped = {c: coarse.aggregate(answers[c].reshape(sizes[c[0]], sizes[c[1]]), g).ravel() for c, g in groups.items()}
    pair_history: list[dict] = []
    if budget.pair_rounds:
        pair_cells = pair_groups(candidates, continuous, sizes, model, pair_round_groups)
        for _ in range(budget.pair_rounds):
            picked = pair_round(
                answers, sizes, candidates, continuous, pair_cells, measurements, model, budget, ledger,
                selection_rng, measurement_rng, max_model_mb, estimator.model_megabytes,
            )  # fmt: skip
            if picked is None:  # every pair measured or past the cap: the rounds get what is left
                break
            pair_history.append(picked)
            model = estimator.round_fit(measurements, round_iterations).marginals()

    history: list[dict] = []
    spent_selecting = spent_estimating = 0.0
    last = False
    while not last:
        if ledger.remaining < 2.0 * round_rho(std, epsilon):
            std, epsilon = last_round(ledger.remaining)
            last = True
        round_started = time.perf_counter()
        cap = max_model_mb * (ledger.spent + round_rho(std, epsilon)) / budget.rho
        allowed = within_cap(candidates, [m.clique for m in measurements], cap, estimator.model_megabytes)
        # The pool: every allowed candidate over its cells, then every allowed pair over its groups.
        allowed_grouped = {c: w for c, w in allowed.items() if c in groups}
        pool = [(c, None) for c in allowed] + [(c, groups[c]) for c in allowed_grouped]
        sensitivity = score_sensitivity([*allowed.values(), *allowed_grouped.values()])
        scored = np.concatenate(
            [scores(allowed, answers, model, std), scores(allowed_grouped, grouped, model, std, groups)]
        )
        chosen, chosen_groups = pool[exponential_mechanism(scored, epsilon, selection_rng, sensitivity)]
        ledger.select(chosen, epsilon, sensitivity)
        answer = answers[chosen] if chosen_groups is None else grouped[chosen]
        measured = Measurement(chosen, gaussian_counts(answer, std, measurement_rng), std, chosen_groups)
        before = measured.query(model.marginal(chosen))
        measurements.append(measured)
        ledger.measure(chosen, std)
        selected = time.perf_counter()
        model = estimator.round_fit(measurements, round_iterations).marginals()
        moved = float(np.abs(measured.query(model.marginal(chosen)) - before).sum())
        annealed = moved <= EXPECTED_ABS * std * answer.size
        history.append(
            {"clique": list(chosen), "grouped": chosen_groups is not None, "std": std, "epsilon": epsilon}
            | {"annealed": annealed}
        )
        spent_selecting += selected - round_started
        spent_estimating += time.perf_counter() - selected
        if annealed:
            std, epsilon = std / 2.0, epsilon * 2.0
    rounds_done = time.perf_counter()
    tree = estimator.final_fit(measurements, iterations)
    seconds = {
        "rounds": rounds_done - started,
        "selections": spent_selecting,
        "round_estimates": spent_estimating,
        "final_estimate": time.perf_counter() - rounds_done,
    }
    return AIMRun(tree, ledger, history, pair_history, estimator.loss, seconds)


def pair_round(
    answers: Mapping[Clique, np.ndarray],
    sizes: Sequence[int],
    candidates: Mapping[Clique, float],
    continuous: Collection[int],
    cells: Mapping[Clique, tuple[np.ndarray, ...]],
    measurements: list[Measurement],
    model: TreeMarginals,
    budget: AIMBudget,
    ledger: RhoLedger,
    selection_rng: np.random.Generator,
    measurement_rng: np.random.Generator,
    max_model_mb: float,
    megabytes: Callable[[Sequence[Clique]], float],
) -> dict | None:
    """One pair round (privacy.py): among the pairs of two `continuous` columns not yet measured whose
    junction tree stays within the cap, each over its groups of `cells` (its fine cells if it has none),
    the exponential mechanism at the budget's `pair_epsilon` chooses the worst estimated (every pair
    weighs 1); the Gaussian measures it at `pair_std` and `measurements` gains it. None, spending
    nothing, when no pair is left."""
    measured = {m.clique for m in measurements}
    pairs: dict[Clique, float] = {
        c: 1.0 for c in candidates if len(c) == 2 and set(c) <= set(continuous) and c not in measured
    }
    cap = max_model_mb * (ledger.spent + budget.pair_rho / budget.pair_rounds) / budget.rho
    allowed = within_cap(pairs, sorted(measured), cap, megabytes)
    if not allowed:
        return None
    std, epsilon = budget.pair_std, budget.pair_epsilon
    fine = {c: w for c, w in allowed.items() if c not in cells}
    grouped_pairs = {c: w for c, w in allowed.items() if c in cells}
    grouped = {
        c: coarse.aggregate(answers[c].reshape(sizes[c[0]], sizes[c[1]]), cells[c]).ravel() for c in grouped_pairs
    }
    pool = [*fine, *grouped_pairs]
    scored = np.concatenate([scores(fine, answers, model, std), scores(grouped_pairs, grouped, model, std, cells)])
    sensitivity = score_sensitivity(allowed.values())
    chosen = pool[exponential_mechanism(scored, epsilon, selection_rng, sensitivity)]
    ledger.select(chosen, epsilon, sensitivity)
    chosen_cells = cells.get(chosen)
    answer = answers[chosen] if chosen_cells is None else grouped[chosen]
    measurements.append(Measurement(chosen, gaussian_counts(answer, std, measurement_rng), std, chosen_cells))
    ledger.measure(chosen, std)
    return {"clique": list(chosen), "grouped": chosen_cells is not None, "std": std, "epsilon": epsilon}


def within_cap(
    candidates: dict[Clique, float],
    model_cliques: Sequence[Clique],
    cap_mb: float,
    megabytes: Callable[[Sequence[Clique]], float],
) -> dict[Clique, float]:
    """The candidates a round may choose: those inside a clique the model has (free), and those whose
    junction tree with the model's cliques stays within `cap_mb` (the paper's `filter_candidates`)."""
    present = sorted(set(model_cliques))
    free = {sub for c in present for r in range(1, len(c) + 1) for sub in itertools.combinations(c, r)}
    return {c: w for c, w in candidates.items() if c in free or megabytes([*present, c]) <= cap_mb}
