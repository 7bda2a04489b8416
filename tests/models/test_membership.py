"""Membership inference measures (models/evaluation/membership.py): near chance for an independent sample of the
same distribution, near certain for a generator that copies its training rows."""

from __future__ import annotations

import numpy as np

from dpsynth.models.evaluation.membership import auc_interval, membership_report


def _rows(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.normal(0.0, 0.4, size=(n, 8)), -1, 1)


def test_an_independent_sample_leaks_nothing_measurable():
    members, non_members, reference = _rows(1500, 1), _rows(1500, 2), _rows(1500, 3)
    synthetic = _rows(3000, 4)
    report = membership_report(synthetic, members, non_members, reference, rows=1500)
    dcr = report["dcr"]
    assert dcr["low"] <= 0.5 <= dcr["high"]
    for key in ("nearest_synthetic_auc", "density_ratio_auc"):
        auc = report[key]
        assert auc["low"] <= 0.5 <= auc["high"] and auc["high"] - auc["low"] < 0.1, (key, auc)


def test_copies_of_training_rows_are_caught():
    members, non_members, reference = _rows(1500, 1), _rows(1500, 2), _rows(1500, 3)
    rng = np.random.default_rng(5)
    synthetic = np.repeat(members, 2, axis=0) + rng.normal(0, 0.01, size=(3000, 8))  # each one copied
    report = membership_report(synthetic, members, non_members, reference, rows=1500)
    assert report["dcr"]["low"] > 0.95
    assert report["nearest_synthetic_auc"]["low"] > 0.95 and report["density_ratio_auc"]["low"] > 0.8


def test_auc_interval_covers_the_auc():
    result = auc_interval(np.array([0.9, 0.8, 0.7, 0.2]), np.array([0.1, 0.3, 0.6]))
    assert result.low <= result.auc <= result.high and result.auc == 10 / 12
