"""An end-to-end audit of MST's whole release mechanism (`bench/audit.py --mode release`): MST at a
whole-release epsilon on a small worst-case table, many runs with one canary row and many with its
replacement, a distinguishing test on what each run releases, and a Gaussian-DP audit of the test's
trade-off curve (models/privacy/gdp_audit.py).

What is audited: everything MST's private steps release into its model (`fit.measure`: the noisy 1-way
marginals, the tree its selection rounds chose, the chosen pairs' noisy 2-way marginals). The released
model is private-pgm's estimate from these alone (`fit.estimate`), post-processing, which cannot make a
distinguishing test any stronger; skipping it makes a run milliseconds instead of seconds.

The worst-case table (`worst_case_table`): three binary columns a, b, c with even shares, a and b
correlated, a and c anti-correlated, b and c anti-correlated, all by the same amount, so every pair's
selection score is the same and the selection is as open as it can be. The canary is (0, 0, 0) on the
first input and (0, 1, 1) on the neighbour (a replacement: the same number of rows). It moves b's and
c's 1-way marginals and every pair's 2-way marginal by the whole sensitivity sqrt(2), and each selection
score by the whole sensitivity 2: up for (a, b), down for (a, c), neither for (b, c) (the cells of the two
rows are both above or both below what the 1-way estimate predicts there).

The test's score of a run: the Gaussian log-likelihood ratio of its noisy marginals (each measurement's
projection on the canary's difference over its noise variance, the expected counts of both inputs being
public to the auditor), plus the log-ratio of how often the two inputs chose its tree, counted on the
calibration half (the GDP audit's threshold is chosen there too; its bound uses the other half only).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpsynth.models.data.binning import cell_codes
from dpsynth.models.data.schema import Column, DatasetSchema
from dpsynth.models.generators.graphical.mechanisms import epsilon_of, rho_for_epsilon
from dpsynth.models.generators.mst.fit import Measured, joint_counts, measure
from dpsynth.models.privacy.audit import gaussian_epsilon
from dpsynth.models.privacy.gdp_audit import gdp_audit, gdp_mu_of
from dpsynth.models.privacy.secret import PrivacySecret

COLUMNS = ("a", "b", "c")
CANARY = {True: (0, 0, 0), False: (0, 1, 1)}


@dataclass(frozen=True)
class ReleaseAuditSetup:
    epsilon: float = 1.0  # the whole release's (MST's rho is the largest that fits it)
    delta: float = 1e-5
    rows: int = 2000  # the table's, canary included
    correlation: float = 0.2  # of each pair of columns (+-1 coded), in size
    runs: int = 100_000  # per input
    confidence: float = 0.95


def audit_schema() -> DatasetSchema:
    return DatasetSchema.from_dict(
        {
            "name": "mst-release-audit",
            "target": "c",
            "columns": {name: {"type": "binary", "levels": [0, 1]} for name in COLUMNS},
        }
    )


def worst_case_table(rows: int, correlation: float) -> pd.DataFrame:
    """`rows` rows of (a, b, c) in {0, 1}^3 whose cell shares are (1 + r (XY - XZ - YZ)) / 8 with X = 1 -
    2a (and so on), r = `correlation`: even shares, pair correlations r, -r, -r (non-negative for r <= 1).
    Counts rounded to whole rows, the rounding's remainder in the largest cell."""
    cells = [(a, b, c) for a in (0, 1) for b in (0, 1) for c in (0, 1)]
    signs = [(1 - 2 * a, 1 - 2 * b, 1 - 2 * c) for a, b, c in cells]
    shares = np.array([(1 + correlation * (x * y - x * z - y * z)) / 8 for x, y, z in signs])
    counts = np.floor(shares * rows).astype(int)
    counts[int(np.argmax(shares))] += rows - int(counts.sum())
    values = np.repeat(np.array(cells), counts, axis=0)
    return pd.DataFrame(values, columns=list(COLUMNS))


def neighbours(setup: ReleaseAuditSetup) -> dict[bool, pd.DataFrame]:
    """The two inputs: the worst-case table's first `rows` - 1 rows (in a fixed shuffle) and the canary
    (first input) or its replacement (the neighbour)."""
    base = worst_case_table(setup.rows - 1, setup.correlation)
    return {
        first: pd.concat([base, pd.DataFrame([CANARY[first]], columns=list(COLUMNS))], ignore_index=True)
        for first in (True, False)
    }


class RunScorer:
    """The Gaussian log-likelihood ratio of a run's noisy marginals between the two inputs (known cell codes
    of both), on the reduced codes the run's own 1-way measurements chose."""

    def __init__(self, columns: Sequence[Column], inputs: dict[bool, pd.DataFrame]):
        self.codes = {
            first: [cell_codes(col, frame[col.name].to_numpy(), 1) for col in columns]
            for first, frame in inputs.items()
        }

    def _llr(self, y: np.ndarray, mean_first: np.ndarray, mean_second: np.ndarray, std: float) -> float:
        diff = mean_first - mean_second
        return float((y - (mean_first + mean_second) / 2.0) @ diff) / std**2

    def llr(self, run: Measured) -> float:
        total = 0.0
        reduced = {
            first: [m.mapping[c] for m, c in zip(run.one_way, codes, strict=True)]
            for first, codes in self.codes.items()
        }
        for j, m in enumerate(run.one_way):
            means = {
                first: m.w * np.bincount(reduced[first][j], minlength=len(m.y))[: len(m.y)] for first in (True, False)
            }
            total += self._llr(m.y, means[True], means[False], run.budget.one_way_std)
        sizes = run.sizes
        for (a, b), y in run.two_way:
            means = {
                first: joint_counts(reduced[first][a], reduced[first][b], sizes[a], sizes[b]) for first in (True, False)
            }
            total += self._llr(y, means[True], means[False], run.budget.two_way_std)
        return total


def _run_secret(seed: int, run: int, first: bool) -> PrivacySecret:
    return PrivacySecret.from_hex(f"{seed:016x}{0x6D7374:016x}{run:016x}{int(first):016x}")


def _runs(setup: ReleaseAuditSetup, first: bool, seed: int) -> tuple[np.ndarray, list[tuple]]:
    """`setup.runs` runs of MST's private steps on one input (each run its own secret): each run's Gaussian
    log-likelihood ratio and the tree it chose."""
    columns = audit_schema().columns
    inputs = neighbours(setup)
    rho = rho_for_epsilon(setup.epsilon, setup.delta)
    scorer = RunScorer(columns, inputs)
    values, chosen = np.empty(setup.runs), []
    for run in range(setup.runs):
        out = measure(inputs[first], columns, rho, _run_secret(seed, run, first).numpy, bins=1)
        values[run] = scorer.llr(out)
        chosen.append(tuple(out.tree))
    return values, chosen


def release_audit(setup: ReleaseAuditSetup = ReleaseAuditSetup(), seed: int = 0, workers: int = 1) -> dict:
    """`setup.runs` runs of MST's private steps on each input, scored and audited as the module notes say;
    the two inputs' runs in two processes when `workers` is 2."""
    started = time.perf_counter()
    rho = rho_for_epsilon(setup.epsilon, setup.delta)
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=2) as pool:
            futures = {first: pool.submit(_runs, setup, first, seed) for first in (True, False)}
            results = {first: f.result() for first, f in futures.items()}
    else:
        results = {first: _runs(setup, first, seed) for first in (True, False)}
    llr = {first: r[0] for first, r in results.items()}
    trees = {first: r[1] for first, r in results.items()}
    # The trees' log-ratio, from the calibration halves only (add-half smoothing for a tree one never chose).
    half = setup.runs // 2
    seen = {first: Counter(trees[first][:half]) for first in (True, False)}
    every = set(seen[True]) | set(seen[False])
    tree_ratio = {
        t: float(
            np.log((seen[True][t] + 0.5) / (half + 0.5 * len(every)))
            - np.log((seen[False][t] + 0.5) / (half + 0.5 * len(every)))
        )
        for t in every
    }
    scores = {first: llr[first] + np.array([tree_ratio.get(t, 0.0) for t in trees[first]]) for first in (True, False)}
    audit = gdp_audit(scores[True], scores[False], setup.delta, setup.confidence)
    gaussian_only = gdp_audit(llr[True], llr[False], setup.delta, setup.confidence)
    claimed = epsilon_of(rho, setup.delta)
    mu_of_rho = float(np.sqrt(2.0 * rho))
    return {
        "mechanism": "mst (fit.measure: 1-way marginals, tree selection, 2-way marginals)",
        "epsilon_claimed": round(claimed, 4),
        "rho": rho,
        "delta": setup.delta,
        "mu_lower_bound": round(audit.mu_lower_bound, 4),
        "epsilon_lower_bound": round(audit.epsilon_lower_bound, 4),
        "bound_over_claim": round(audit.epsilon_lower_bound / claimed, 3),
        "mu_of_rho": round(mu_of_rho, 4),
        "mu_of_claim": round(gdp_mu_of(claimed, setup.delta), 4),
        "epsilon_of_mu_of_rho": round(gaussian_epsilon(mu_of_rho, setup.delta), 4),
        "epsilon_lower_bound_no_assumption": round(audit.epsilon_lower_bound_no_assumption, 4),
        "gaussian_parts_only": {
            "mu_lower_bound": round(gaussian_only.mu_lower_bound, 4),
            "epsilon_lower_bound": round(gaussian_only.epsilon_lower_bound, 4),
        },
        "threshold": audit.threshold,
        "fpr": audit.false_positive_rate,
        "fnr": audit.false_negative_rate,
        "test_runs": audit.test_trials,
        "runs": setup.runs,
        "rows": setup.rows,
        "correlation": setup.correlation,
        "confidence": setup.confidence,
        "trees_seen": {str(t): [seen[True][t], seen[False][t]] for t in sorted(every)},
        "seconds": round(time.perf_counter() - started, 1),
    }
