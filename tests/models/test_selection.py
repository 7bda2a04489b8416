"""Logistic-regression model selection (thesis Algorithm 3): grid, fast solver vs liblinear, refit, edge cases."""

import math
import warnings

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from dpsynth.models.evaluation.selection import (
    Candidate,
    SelectionResult,
    auc_columns,
    fit_logistic,
    fit_logistic_path,
    liblinear_objective,
    regularisation_grid,
    select_model,
)
from dpsynth.models.evaluation.selection.l1_subproblem import l1_coordinate_descent
from dpsynth.models.native import kernels as native_kernels


def _data(seed, n, noise=0.0):
    """Cardio-like encoded features in [-1, 1]: 5 continuous, 5 binary, two one-hot blocks of 3 (16 columns)."""
    rng = np.random.default_rng(seed)
    cont = np.clip(rng.normal(size=(n, 5)) / 3, -1, 1)
    binary = np.where(rng.random((n, 5)) < [0.35, 0.1, 0.05, 0.8, 0.5], 1.0, -1.0)
    oh1 = np.eye(3)[rng.choice(3, size=n, p=[0.75, 0.14, 0.11])] * 2 - 1
    oh2 = np.eye(3)[rng.choice(3, size=n, p=[0.85, 0.07, 0.08])] * 2 - 1
    X = np.concatenate([cont, binary, oh1, oh2], axis=1)
    beta = np.array([1.2, 0.1, 0.4, 2.5, 0.8, 0.0, -0.1, -0.1, -0.2, 0.0, -0.3, 0.1, 0.3, 0.1, -0.1, 0.0])
    logit = X @ beta + 0.2 + noise * rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return X.astype(np.float32), y


def _splits(seed=0, n=3000, noise=0.0):
    X, y = _data(seed, n + 1000, noise)
    return X[:n], y[:n], X[n : n + 500], y[n : n + 500], X[n + 500 :], y[n + 500 :]


# ---- grid ------------------------------------------------------------------------------------------------


def test_grid_has_40_candidates_with_C_inside_0_1():
    grid = regularisation_grid(7)
    assert len(grid) == 40
    assert all(isinstance(c, Candidate) for c in grid)
    assert [c.penalty for c in grid] == ["l1"] * 20 + ["l2"] * 20
    cs = [c.C for c in grid[:20]]
    assert [c.C for c in grid[20:]] == cs  # the same 20 values for both penalties
    assert len(set(cs)) == 20 and cs == sorted(cs)
    assert all(0.0 < c < 1.0 for c in cs)


def test_grid_is_deterministic_per_seed_and_differs_across_seeds():
    assert regularisation_grid(3) == regularisation_grid(3)
    assert regularisation_grid(3) != regularisation_grid(4)


def test_grid_values_come_from_a_log_space():
    cs = np.array([c.C for c in regularisation_grid(0, n_values=100, penalties=("l2",))])
    steps = np.diff(np.log10(cs))
    assert np.allclose(steps, steps[0])  # all 100 points: an evenly spaced logarithmic grid
    assert cs[0] == pytest.approx(1e-4) and cs[-1] < 1.0


def test_candidate_is_frozen_and_validated():
    c = Candidate("l2", 0.5)
    with pytest.raises(AttributeError):
        c.C = 0.1
    with pytest.raises(ValueError):
        Candidate("elasticnet", 0.5)
    with pytest.raises(ValueError):
        Candidate("l1", 0.0)


# ---- solver ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("penalty", ["l1", "l2"])
def test_solver_reaches_liblinear_objective_or_lower(penalty):
    """Same objective as liblinear (intercept regularised): our optimum is at least as good, and close."""
    X, y, Xv, yv, _, _ = _splits(1)
    Cs = [3e-4, 0.01, 0.3]
    W = fit_logistic_path(X, y, penalty, Cs)
    for C, w in zip(Cs, W, strict=False):
        ll = LogisticRegression(solver="liblinear", C=C, l1_ratio=1.0 if penalty == "l1" else 0.0, random_state=0).fit(
            X, y
        )
        ours = liblinear_objective(X, y, penalty, C, w[:-1], w[-1])
        theirs = liblinear_objective(X, y, penalty, C, ll.coef_, ll.intercept_[0])
        assert ours <= theirs + 1e-9 * abs(theirs)
        assert ours == pytest.approx(theirs, rel=1e-4)
        auc_ours = roc_auc_score(yv, Xv @ w[:-1] + w[-1])
        auc_theirs = roc_auc_score(yv, ll.decision_function(Xv))
        assert abs(auc_ours - auc_theirs) < 1e-3


def test_path_order_does_not_matter_and_matches_single_fits():
    X, y, *_ = _splits(2)
    Cs = [0.5, 0.001, 0.05]
    W = fit_logistic_path(X, y, "l2", Cs)
    for C, w in zip(Cs, W, strict=False):
        coef, intercept = fit_logistic(X, y, "l2", C)
        np.testing.assert_allclose(coef, w[:-1], atol=1e-7)
        assert intercept == pytest.approx(w[-1], abs=1e-7)


def test_l1_with_tiny_C_gives_all_zero_weights():
    X, y, *_ = _splits(3)
    coef, intercept = fit_logistic(X, y, "l1", 1e-6)
    assert not np.any(coef) and intercept == 0.0


def test_auc_columns_equals_roc_auc_score_with_ties():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, size=400)
    S = np.round(rng.normal(size=(400, 5)) + y[:, None] * 0.5, 1)  # many ties
    S[:, 4] = 1.0  # constant: AUC 0.5
    got = auc_columns(y, S)
    want = [roc_auc_score(y, S[:, j]) for j in range(S.shape[1])]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    with pytest.raises(ValueError):
        auc_columns(np.zeros(10), S[:10])


# ---- selection -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("noise", [0.0, 1.5])
def test_fast_and_naive_choose_the_same_model(noise):
    data = _splits(4, noise=noise)
    grid = regularisation_grid(11)
    naive = select_model(*data, grid, method="naive")
    fast = select_model(*data, grid, method="fast")
    assert isinstance(fast, SelectionResult) and not fast.degenerate
    assert (fast.penalty, fast.C, fast.index) == (naive.penalty, naive.C, naive.index)
    assert abs(fast.test_auc - naive.test_auc) <= 0.002
    assert abs(fast.test_auprc - naive.test_auprc) <= 0.002
    assert len(fast.val_aucs) == len(naive.val_aucs) == 40
    assert max(abs(a - b) for a, b in zip(fast.val_aucs, naive.val_aucs, strict=False)) < 1e-3
    assert fast.val_auc == max(fast.val_aucs)
    assert fast.candidate == grid[fast.index]


def test_refit_uses_train_plus_validation():
    X, y, Xv, yv, Xt, yt = _splits(5)
    only = [Candidate("l2", 0.2)]
    X_full, y_full = np.concatenate([X, Xv]), np.concatenate([y, yv])

    fast = select_model(X, y, Xv, yv, Xt, yt, only, method="fast")
    coef, intercept = fit_logistic(X_full, y_full, "l2", 0.2)
    np.testing.assert_allclose(fast.coef, coef, atol=1e-7)
    assert fast.intercept == pytest.approx(intercept, abs=1e-7)
    train_only, _ = fit_logistic(X, y, "l2", 0.2)
    assert np.max(np.abs(fast.coef - train_only)) > 1e-3
    assert fast.test_auc == pytest.approx(roc_auc_score(yt, Xt.astype(float) @ coef + intercept), abs=1e-12)

    naive = select_model(X, y, Xv, yv, Xt, yt, only, method="naive")
    direct = LogisticRegression(solver="liblinear", C=0.2, l1_ratio=0.0, random_state=0).fit(X_full, y_full)
    np.testing.assert_array_equal(naive.coef, direct.coef_.ravel())
    assert naive.intercept == direct.intercept_[0]


def test_ties_go_to_the_first_candidate():
    data = _splits(6)
    # all-zero l1 models score every row alike: AUC 0.5 for each, the first must win
    cands = [Candidate("l1", 1e-7), Candidate("l1", 2e-7), Candidate("l1", 3e-7)]
    for method in ("fast", "naive"):
        res = select_model(*data, cands, method=method)
        assert res.val_aucs == [0.5, 0.5, 0.5]
        assert res.index == 0 and res.C == 1e-7


@pytest.mark.parametrize("method", ["fast", "naive"])
@pytest.mark.parametrize("which", ["train", "val"])
def test_single_class_synthetic_data_is_degenerate_not_an_error(method, which):
    X, y, Xv, yv, Xt, yt = _splits(7)
    if which == "train":
        y = np.zeros_like(y)
    else:
        yv = np.ones_like(yv)
    res = select_model(X, y, Xv, yv, Xt, yt, regularisation_grid(0), method=method)
    assert res.degenerate
    assert res.test_auc == 0.5 and math.isnan(res.val_auc)
    assert res.penalty is None and res.C is None
    assert res.test_auprc == pytest.approx(yt.mean())
    assert len(res.val_aucs) == 40


def test_fast_selection_is_deterministic():
    data = _splits(8, noise=0.5)
    grid = regularisation_grid(5)
    a = select_model(*data, grid)
    b = select_model(*data, grid)
    assert (a.penalty, a.C, a.test_auc, a.test_auprc) == (b.penalty, b.C, b.test_auc, b.test_auprc)
    assert a.val_aucs == b.val_aucs
    np.testing.assert_array_equal(a.coef, b.coef)


def test_threads_give_the_same_result():
    data = _splits(9)
    grid = regularisation_grid(1)
    a = select_model(*data, grid, n_jobs=1)
    b = select_model(*data, grid, n_jobs=2)
    assert a.val_aucs == b.val_aucs and a.test_auc == b.test_auc


def test_no_warnings_on_ordinary_data():
    data = _splits(10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        select_model(*data, regularisation_grid(2))


def test_bad_inputs_are_rejected():
    X, y, Xv, yv, Xt, yt = _splits(11)
    grid = regularisation_grid(0)
    with pytest.raises(ValueError):
        select_model(X, y, Xv, yv, Xt, yt, grid, method="other")
    with pytest.raises(ValueError):
        select_model(X, y + 1, Xv, yv, Xt, yt, grid)
    Xn = X.copy()
    Xn[0, 0] = np.nan
    with pytest.raises(ValueError):
        select_model(Xn, y, Xv, yv, Xt, yt, grid)


def test_a_test_split_with_one_class_scores_nan_and_chooses_as_before():
    """Whether the real test split holds both classes is a fact of the rows: no error, NaN scores, and the
    same candidate and classifier as with any test split (docs/privacy.md, section 12)."""
    X, y, Xv, yv, Xt, yt = _splits(11)
    grid = regularisation_grid(0)
    usual = select_model(X, y, Xv, yv, Xt, yt, grid)
    single = select_model(X, y, Xv, yv, Xt, np.zeros_like(yt), grid)
    assert np.isnan(single.test_auc) and np.isnan(single.test_auprc)
    assert (single.penalty, single.C, single.val_aucs) == (usual.penalty, usual.C, usual.val_aucs)
    assert np.array_equal(single.coef, usual.coef)
    collapsed = select_model(X, np.zeros_like(y), Xv, yv, Xt, np.zeros_like(yt), grid)
    assert collapsed.degenerate and np.isnan(collapsed.test_auc) and np.isnan(collapsed.test_auprc)


# ---- wide tables and the C loops -------------------------------------------------------------------------


def _wide_splits(seed=0, n=2500):
    """A census-like table 64 encoded columns wide: 8 continuous (half heavy-tailed at -1), a 24-level group
    with rare levels, 12 binary columns and four groups of 5; one-hot blocks collinear with the intercept."""
    rng = np.random.default_rng(seed)
    m = n + 1000
    cont = np.clip(rng.normal(size=(m, 8)) / 3, -1, 1)
    cont[:, ::2] = np.clip(np.expm1(np.abs(cont[:, ::2]) * 3) / 6 - 1, -1, 1)
    shares = 1 / np.arange(1, 25) ** 1.5
    blocks = [
        cont,
        np.eye(24)[rng.choice(24, size=m, p=shares / shares.sum())] * 2 - 1,
        np.where(rng.random((m, 12)) < 0.3, 1.0, -1.0),
    ]
    blocks += [np.eye(5)[rng.choice(5, size=m)] * 2 - 1 for _ in range(4)]
    X = np.concatenate(blocks, axis=1)
    beta = rng.normal(scale=0.7, size=X.shape[1]) * (rng.random(X.shape[1]) < 0.5)
    y = (rng.random(m) < 1 / (1 + np.exp(-(X @ beta - 0.3)))).astype(np.int64)
    X = X.astype(np.float32)
    return X[:n], y[:n], X[n : n + 500], y[n : n + 500], X[n + 500 :], y[n + 500 :]


needs_native = pytest.mark.skipif(not native_kernels.available(), reason="no C compiler here")


@pytest.mark.parametrize("penalty", ["l1", "l2"])
def test_wide_one_hot_table_reaches_the_exact_optimum(penalty):
    """At 64 columns with rare levels and collinear blocks the solver still reaches liblinear's objective
    solved tightly (tolerance 1e-8), and the validation AUCs agree."""
    X, y, Xv, yv, _, _ = _wide_splits(1)
    Cs = [1e-3, 0.03, 0.8]
    W = fit_logistic_path(X, y, penalty, Cs)
    for C, w in zip(Cs, W, strict=False):
        ll = LogisticRegression(
            solver="liblinear",
            C=C,
            l1_ratio=1.0 if penalty == "l1" else 0.0,
            tol=1e-8,
            max_iter=100_000,
            random_state=0,
        ).fit(X, y)
        ours = liblinear_objective(X, y, penalty, C, w[:-1], w[-1])
        theirs = liblinear_objective(X, y, penalty, C, ll.coef_, ll.intercept_[0])
        assert ours <= theirs + 1e-9 * abs(theirs)
        assert ours == pytest.approx(theirs, rel=1e-7)
        assert abs(roc_auc_score(yv, Xv @ w[:-1] + w[-1]) - roc_auc_score(yv, ll.decision_function(Xv))) < 1e-4


def test_wide_table_fast_and_naive_choose_the_same_model():
    data = _wide_splits(2)
    grid = regularisation_grid(5)
    naive = select_model(*data, grid, method="naive")
    fast = select_model(*data, grid, method="fast")
    assert fast.index == naive.index
    assert abs(fast.test_auc - naive.test_auc) <= 0.002


@needs_native
@pytest.mark.parametrize("penalty", ["l1", "l2"])
def test_c_loops_and_python_loops_give_the_same_path(penalty, monkeypatch):
    """The C loops (float32 rows, float64 sums, C coordinate descent) solve the same problems as the
    Python/float64 reference, to the solver's tolerance."""
    X, y, *_ = _wide_splits(3)
    Cs = [3e-4, 0.01, 0.2, 0.9]
    native_stats: dict = {}
    W_native = fit_logistic_path(X, y, penalty, Cs, stats=native_stats)
    monkeypatch.setattr(native_kernels, "available", lambda: False)
    python_stats: dict = {}
    W_python = fit_logistic_path(X, y, penalty, Cs, stats=python_stats)
    for C, a, b in zip(Cs, W_native, W_python, strict=False):
        fa = liblinear_objective(X, y, penalty, C, a[:-1], a[-1])
        fb = liblinear_objective(X, y, penalty, C, b[:-1], b[-1])
        assert fa == pytest.approx(fb, rel=1e-9)
        np.testing.assert_allclose(X @ a[:-1] + a[-1], X @ b[:-1] + b[-1], atol=1e-5)


@needs_native
def test_c_products_equal_numpy_float64():
    rng = np.random.default_rng(0)
    Xs = np.asfortranarray(rng.uniform(-1, 1, size=(1031, 37)).astype(np.float32))  # a partial row block
    w = rng.normal(size=37)
    np.testing.assert_allclose(
        native_kernels.logistic_margins(Xs, w), Xs.astype(np.float64) @ w, rtol=1e-12, atol=1e-12
    )
    m = rng.normal(size=1031) * 5
    e = np.exp(-np.abs(m))
    g, r = native_kernels.logistic_gradient(Xs, m, e)
    np.testing.assert_allclose(r, 1 / (1 + np.exp(m)), rtol=1e-14, atol=0)
    np.testing.assert_allclose(g, -(r @ Xs.astype(np.float64)), rtol=1e-12, atol=1e-11)
    with pytest.raises(ValueError, match="Fortran"):
        native_kernels.logistic_margins(np.ascontiguousarray(Xs), w)


@needs_native
def test_c_coordinate_descent_equals_the_python_loop():
    """The l1 sub-problem on an ill-conditioned H (two nearly collinear columns): both loops reach the
    optimum."""
    rng = np.random.default_rng(1)
    A = rng.normal(size=(200, 12))
    A[:, 11] = -A[:, 10] + 0.05 * rng.normal(size=200)
    H = A.T @ A / 50
    g, w = rng.normal(size=12) * 3, rng.normal(size=12) * 0.1
    tol = 1e-9
    got = l1_coordinate_descent(H, g, w, tol, 10_000, {}, native=True)
    want = l1_coordinate_descent(H, g, w, tol, 10_000, {}, native=False)

    def objective(u):
        return float(g @ (u - w) + 0.5 * (u - w) @ H @ (u - w) + np.abs(u).sum())

    assert objective(got) == pytest.approx(objective(want), rel=1e-9, abs=1e-9)
    a = g + H @ (got - w)
    viol = np.where(got > 0, np.abs(a + 1), np.where(got < 0, np.abs(a - 1), np.maximum(np.abs(a) - 1, 0)))
    assert viol.max() <= 1e-8


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("width", [16, 64])
def test_paths_converge_on_collinear_one_hot_blocks(seed, width):
    """One-hot blocks collinear with the intercept make the Hessian singular along a direction; the path's
    predictors and the sub-problem steps must not run off along it (the solver warns if it fails). The
    benchmark's census-like tables: at 16 columns, seed 2 once sent the l1 predictor to 1e31."""
    from bench.model_selection import make_wide_data

    X, y, *_ = make_wide_data(seed, seed % 2 == 1, width, 10_000)
    grid = regularisation_grid(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for penalty in ("l1", "l2"):
            stats: dict = {}
            fit_logistic_path(X, y, penalty, [c.C for c in grid if c.penalty == penalty], stats=stats)
            assert stats["iterations"] < 200
