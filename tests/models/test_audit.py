"""The privacy audit (models/audit.py): its statistics, and a reduced step audit on the trainer's own
query that catches the shared critic scored with the per-row accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.audit import StepAuditSetup, audit_scores, clopper_pearson, epsilon_from_rates, step_audit


def test_clopper_pearson_and_rate_bounds():
    lo, hi = clopper_pearson(0, 1000, 0.975)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 1000), rel=1e-6)
    lo, hi = clopper_pearson(500, 1000, 0.975)
    assert lo < 0.5 < hi and hi - lo < 0.07
    # No advantage, no bound; a clear advantage, a positive one; delta eats a small true positive rate.
    assert epsilon_from_rates(500, 1000, 500, 1000, 1e-5) == 0.0
    assert epsilon_from_rates(900, 1000, 100, 1000, 1e-5) > 1.5
    assert epsilon_from_rates(5, 1000, 0, 1000, 0.01) == 0.0


def test_audit_of_a_gaussian_with_known_epsilon_stays_below_it():
    """Scores of a Gaussian mechanism with mu = 1: its true epsilon at delta 1e-5 is about 4.4; a
    lower bound from 20,000 trials sits below it and above zero."""
    rng = np.random.default_rng(0)
    first, second = rng.normal(1.0, 1.0, 20000), rng.normal(0.0, 1.0, 20000)
    bound = audit_scores({"x": (first, second)}, 1e-5).epsilon_lower_bound
    assert 0.3 < bound < 4.4


def test_reduced_step_audit_refutes_the_old_accounting_and_not_the_current_one():
    setup = StepAuditSetup(discriminators=50, batch_size=32, delta=1e-3)
    audits = {a["mechanism"]: a for a in step_audit(setup, trials=6000, steps=1, seed=0)}
    per_row, old, thesis = (audits["per_row"], audits["per_step scored as T x B (the old accounting)"],
                            audits["per_step"])
    assert not per_row["claim_refuted"] and per_row["epsilon_lower_bound"] < per_row["epsilon_claimed"]
    assert old["claim_refuted"] and old["epsilon_lower_bound"] > old["epsilon_claimed"] == per_row["epsilon_claimed"]
    assert not thesis["claim_refuted"] and thesis["epsilon_claimed"] > 10 * per_row["epsilon_claimed"]
    assert math.isfinite(old["epsilon_lower_bound"])


def test_one_run_bound_grows_with_correct_guesses_and_vanishes_at_chance():
    from models.audit import one_run_epsilon_lower_bound, one_run_p_value

    assert one_run_epsilon_lower_bound(1000, 100, 50, 1e-5) == 0.0          # chance
    weak, strong = (one_run_epsilon_lower_bound(1000, 100, v, 1e-5) for v in (70, 95))
    assert 0 < weak < strong
    # The bound is where the p-value crosses 5%.
    assert one_run_p_value(1000, 100, 95, strong - 0.01, 1e-5) < 0.05 <= one_run_p_value(1000, 100, 95, strong + 0.01, 1e-5)
    # With pure DP the p-value is the binomial tail.
    assert one_run_p_value(10, 10, 10, 0.0, 0.0) == pytest.approx(0.5 ** 10)
