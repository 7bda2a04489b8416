"""A row whose gradient (or statistic) holds a NaN or an infinity must not break the sensitivity bound:
clipping cannot bound it (its norm is NaN or infinite), so it is zeroed before clipping everywhere a
gradient is clipped and before every bounded statistic. Each test feeds NaN and Inf rows through the
project's own clipping and noise code and checks the finite rows' result is untouched and the bad rows
add nothing."""

from __future__ import annotations

import math

import pytest
import torch

from dpsynth.models.generators.dpautogan.latent_gaussian import fit_gaussian_latent, private_moments
from dpsynth.models.generators.dpsgd import clipped_sum, noisy_mean
from dpsynth.models.generators.sanitizer import clip_rows, sanitize_rows, zero_nonfinite_rows

BAD = [float("nan"), float("inf"), float("-inf")]


def _rows_with_bad(n: int = 6, width: int = 5, seed: int = 0) -> tuple[torch.Tensor, list[int]]:
    rows = torch.randn(n, width, generator=torch.Generator().manual_seed(seed)) * 3
    bad = [1, 3, 4]
    for i, value in zip(bad, BAD, strict=False):
        rows[i, i % width] = value
    return rows, bad


def test_nonfinite_rows_are_zeroed_and_finite_rows_kept():
    rows, bad = _rows_with_bad()
    out = zero_nonfinite_rows(rows)
    good = [i for i in range(rows.shape[0]) if i not in bad]
    assert torch.equal(out[good], rows[good])
    assert torch.count_nonzero(out[bad]) == 0


def test_gswgan_sanitiser_bounds_nan_and_inf_rows():
    rows, bad = _rows_with_bad()
    clipped = clip_rows(rows, 1.0)
    assert torch.isfinite(clipped).all()
    assert (clipped.norm(dim=1) <= 1.0 + 1e-6).all()
    assert torch.count_nonzero(clipped[bad]) == 0
    noised = sanitize_rows(rows, 1.0, 1.07, torch.Generator().manual_seed(1))
    noise = sanitize_rows(torch.zeros_like(rows), 1.0, 1.07, torch.Generator().manual_seed(1))
    assert torch.isfinite(noised).all()
    assert torch.equal(noised[bad], noise[bad])  # a bad row is pure noise


def _per_example(bad_value: float) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    grads = {"w": torch.randn(4, 3, 2, generator=g) * 5, "b": torch.randn(4, 2, generator=g) * 5}
    grads["b"][2, 1] = bad_value  # example 2 is bad in one parameter only: all of it must go
    return grads


@pytest.mark.parametrize("bad_value", BAD)
def test_dpsgd_clipping_drops_an_example_with_a_nonfinite_gradient(bad_value):
    grads = _per_example(bad_value)
    summed = clipped_sum(grads, 1.0)
    without = clipped_sum({k: torch.cat([g[:2], g[3:]]) for k, g in grads.items()}, 1.0)
    for k in grads:
        assert torch.isfinite(summed[k]).all()
        torch.testing.assert_close(summed[k], without[k])
    parts = noisy_mean(clipped_sum(grads, 1.0), 1.0, 1.0, 4.0, torch.Generator().manual_seed(3))
    assert all(torch.isfinite(t).all() for t in parts.total.values())


def test_gaussian_fit_and_moment_query_stay_finite_and_ignore_bad_rows():
    latents = torch.rand(50, 3, generator=torch.Generator().manual_seed(4)) * 2 - 1
    poisoned = latents.clone()
    poisoned[7, 0] = float("nan")
    mean, scale = fit_gaussian_latent(poisoned, 1.0, torch.Generator().manual_seed(5))
    zeroed = latents.clone()
    zeroed[7] = 0.0
    mean_ref, scale_ref = fit_gaussian_latent(zeroed, 1.0, torch.Generator().manual_seed(5))
    assert torch.isfinite(mean).all() and torch.isfinite(scale).all()
    torch.testing.assert_close(mean, mean_ref)
    torch.testing.assert_close(scale, scale_ref)

    rows = latents.clone()
    rows[[3, 9], 1] = torch.tensor([float("nan"), float("inf")])
    moments = private_moments(rows, [False, False, False], 1.0, torch.Generator().manual_seed(6))
    assert torch.isfinite(moments).all()
    reference = rows.clone()
    reference[3] = 0.0
    reference[9, 1] = 1.0  # an infinity is clipped to the bound like any large value; NaN has no side
    expected = private_moments(reference, [False, False, False], 1.0, torch.Generator().manual_seed(6))
    torch.testing.assert_close(moments, expected)
    assert not math.isnan(float(moments.sum()))
