"""The fast path of model selection: liblinear's objective solved to its optimum along the sorted C path.

liblinear appends a constant feature (``intercept_scaling=1``) and regularises its weight like any other,
so with w = (coef, intercept) and x_i extended by a trailing 1 it minimises::

    l2:  0.5 * ||w||_2^2 + C * sum_i log(1 + exp(-s_i w.x_i))          s_i = 2 y_i - 1
    l1:        ||w||_1   + C * sum_i log(1 + exp(-s_i w.x_i))

This module solves that same objective with a small dense second-order solver that reuses work along the
sorted C path. The d x d Hessian takes one pass over the data and every inner step then works on d x d
matrices only. l2: damped Newton, warm-started along increasing C with a first-order predictor
(dw/dlogC = H^-1 w), reusing a stale Hessian (and its Cholesky factor) while that is cheaper than a new
one. l1: proximal Newton (liblinear's own newGLMNET scheme) whose quadratic sub-problem is solved on the
explicit d x d Hessian (l1_subproblem.py), again warm-started along C with a predictor on the support.
Both are solved to a relative optimality of `tol` (default 1e-10, far below liblinear's 1e-4), so they
reach the exact optimum that liblinear approximates. BLAS is held to one thread: the products are small,
and a threaded matrix-vector product on a busy 2-core machine was measured 10-50x slower.

Width. Where the C kernels build (models/native/kernels.py), the rows are kept in float32 (exact: the
features are float32) and the passes over the data, the l1 coordinate descent and (up to 32 columns) the
Hessian run in C with float64 sums; wider Hessians are float32 BLAS products. At 128 encoded columns the
pure-Python coordinate descent was 97% of a run and made the fast path slower than liblinear; one-hot
blocks collinear with the intercept leave near-flat directions that coordinate descent crosses only in
tens of thousands of sweeps, which the face steps cross at once. Without a compiler, numpy and a Python
coordinate descent (with an exact solve once the signs settle) do the same work more slowly: the
reference the C loops are tested against.

What "the same models" can mean: the l1 and l2 optima are unique in their predictions (the log-loss is
strictly convex in the margins), so validation AUCs match liblinear's up to liblinear's own optimisation
error (about 1e-6 of AUC on Cardio; on a 128-column table of 10,000 rows its tolerance once left a
refitted model 0.006 of test AUC away from the optimum, which liblinear at tolerance 1e-8 reaches too:
bench/model_selection.py reports such cases). When two candidates' validation AUCs differ by less than
that, the two methods may pick different (equally good) candidates; the test AUCs then differ by about
1e-5. With one-hot blocks collinear with the intercept, the l1 coefficients themselves need not be unique
(their predictions are).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from contextlib import AbstractContextManager

import numpy as np
from scipy.linalg.lapack import dpotrf, dpotrs
from threadpoolctl import ThreadpoolController

from dpsynth.models.evaluation.selection.grid import PENALTIES
from dpsynth.models.evaluation.selection.l1_subproblem import l1_coordinate_descent, l1_optimality
from dpsynth.models.evaluation.selection.logistic_problem import LogisticProblem

_threadpools: ThreadpoolController | None = None
# l1: the sub-problem is solved to this fraction of the current outer optimality (keeps proximal Newton fast)
INNER_RTOL = 1e-3
# a stale Hessian is kept while one step shrinks the optimality measure by this factor or more (and, below
# that, while it stays cheaper than a new one: `_hessian_is_stale`)
REFRESH = 0.03


def _warn_not_converged(stats: dict, C: float) -> None:
    stats["not_converged"] = stats.get("not_converged", 0) + 1
    warnings.warn(
        f"logistic solver did not reach its tolerance within max_iter (C={C:g})", RuntimeWarning, stacklevel=3
    )


def _hessian_is_stale(prob: LogisticProblem, now: float, before: float | None, target: float, fresh: bool) -> bool:
    """Whether to recompute the Hessian: the last step (with a stale one) shrank the optimality measure
    by less than `REFRESH`, and the steps still needed at that rate cost more than a new Hessian and two
    steps. Costs in multiply-adds: a Hessian n d^2 / 4 (a float32 symmetric product), a step 3 n d (three
    passes over the data) + d^3 / 3 (the d x d solve); at 256 columns a Hessian is worth 10-20 steps, at
    16 about one."""
    if before is None or fresh:
        return False
    rate = now / before
    if rate <= REFRESH:
        return False
    if rate >= 1.0:
        return True
    n, d = prob.n, prob.d1
    hessian_in_steps = (n * d * d / 4) / (3 * n * d + d**3 / 3)
    steps_at_this_rate = math.log(max(target, 1e-300) / now) / math.log(rate)
    return steps_at_this_rate > 2 + hessian_in_steps


def _cholesky(A: np.ndarray) -> np.ndarray:
    """Upper Cholesky factor of a symmetric positive definite A (LAPACK directly: scipy's checking
    wrappers cost more than the factorisation at Cardio's width)."""
    factor, info = dpotrf(A, lower=0, clean=0)
    if info != 0:
        raise np.linalg.LinAlgError(f"Cholesky factorisation failed (LAPACK info {info})")
    return factor


def _cho_solve(factor: np.ndarray, b: np.ndarray) -> np.ndarray:
    x, info = dpotrs(factor, b, lower=0)
    if info != 0:
        raise np.linalg.LinAlgError(f"Cholesky solve failed (LAPACK info {info})")
    return x


def _solve_l2(
    prob: LogisticProblem, C: float, w: np.ndarray, S: np.ndarray | None, tol: float, max_iter: int, stats: dict
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Damped Newton for 0.5||w||^2 + C L(w) from w; S is a (possibly stale) unscaled Hessian of L.
    Returns w, S and the Cholesky factor of I + C S (kept while S is: stale steps cost d^2, not d^3)."""
    eye = np.eye(prob.d1)
    factor = None
    m = prob.margins(w)
    loss, e = prob.loss_of_margins(m)
    F = 0.5 * float(w @ w) + C * loss
    target = tol * max(prob.reference_scale(C), 1e-300)
    fresh = False
    prev_gn = None
    for _ in range(max_iter):
        gL, r = prob.grad_of_margins(m, e)
        g = w + C * gL
        gn = float(np.max(np.abs(g)))
        if gn <= target:
            break
        if S is None or _hessian_is_stale(prob, gn, prev_gn, target, fresh):
            S = prob.hessian(r)
            stats["hessians"] = stats.get("hessians", 0) + 1
            fresh = True
            factor = None
        else:
            fresh = False
        if factor is None:
            factor = _cholesky(eye + C * S)
        d = -_cho_solve(factor, g)
        gd = float(g @ d)
        dm = prob.margins(d)
        t = 1.0
        while True:
            m_new = m + t * dm if t != 1.0 else m + dm
            w_new = w + t * d
            loss_new, e_new = prob.loss_of_margins(m_new)
            F_new = 0.5 * float(w_new @ w_new) + C * loss_new
            # below the rounding of F the Armijo test is meaningless: accept the (quadratically convergent)
            # Newton step
            if F_new <= F + 1e-4 * t * gd or -gd <= 1e-12 * abs(F) or t < 1e-8:
                break
            t *= 0.5
        stats["iterations"] = stats.get("iterations", 0) + 1
        if t < 1.0 and not fresh:
            S = factor = None  # stale curvature misled the step: refresh
        w, m, F, e = w_new, m_new, F_new, e_new
        prev_gn = gn
        if float(np.max(np.abs(t * d))) <= 1e-15 * (1.0 + float(np.max(np.abs(w)))):
            break
    else:
        _warn_not_converged(stats, C)
    return w, S, factor


def _solve_l1(
    prob: LogisticProblem, C: float, w: np.ndarray, S: np.ndarray | None, tol: float, max_iter: int, stats: dict
) -> tuple[np.ndarray, np.ndarray | None]:
    """Proximal Newton (newGLMNET) for ||w||_1 + C L(w) from w; S is a (possibly stale) Hessian of L."""
    d1 = prob.d1
    m = prob.margins(w)
    loss, e = prob.loss_of_margins(m)
    l1w = float(np.sum(np.abs(w)))
    F = l1w + C * loss
    # the subgradient at 0 is max(|g0| - 1, 0); keep a unit floor for the scale
    target = tol * max(prob.reference_scale(C), 1.0)
    fresh = False
    prev_opt = None
    for _ in range(max_iter):
        gL, r = prob.grad_of_margins(m, e)
        g = C * gL
        opt = l1_optimality(g, w)
        if opt <= target:
            break
        if S is None or _hessian_is_stale(prob, opt, prev_opt, target, fresh):
            S = prob.hessian(r)
            stats["hessians"] = stats.get("hessians", 0) + 1
            fresh = True
        else:
            fresh = False
        H = C * S
        # a ridge keeps every diagonal positive (an all-zero column) and H positive definite
        H[np.diag_indices(d1)] += prob.hessian_ridge * max(float(np.max(np.diag(H))), 1e-12)
        inner_tol = max(INNER_RTOL * opt, 0.1 * target)
        u = l1_coordinate_descent(H, g, w, inner_tol, 1000, stats)
        d = u - w
        l1u = float(np.sum(np.abs(u)))
        delta = float(g @ d) + l1u - l1w
        if delta >= 0:
            if not fresh:
                S = None
                continue
            break
        dm = prob.margins(d)
        t = 1.0
        while True:
            w_new = u if t == 1.0 else w + t * d
            m_new = m + t * dm
            l1_new = l1u if t == 1.0 else float(np.sum(np.abs(w_new)))
            loss_new, e_new = prob.loss_of_margins(m_new)
            F_new = l1_new + C * loss_new
            if F_new <= F + 0.01 * t * delta or -delta <= 1e-12 * abs(F) or t < 1e-8:
                break
            t *= 0.5
        stats["iterations"] = stats.get("iterations", 0) + 1
        if t < 1.0 and not fresh:
            S = None
        w, m, F, e, l1w = w_new, m_new, F_new, e_new, l1_new
        prev_opt = opt
        if float(np.max(np.abs(t * d))) <= 1e-15 * (1.0 + float(np.max(np.abs(w)))):
            break
    else:
        _warn_not_converged(stats, C)
    return w, S


def _l1_predictor(w: np.ndarray, S: np.ndarray, C: float, step: float) -> np.ndarray:
    """First-order predictor of the l1 path on the current support, `step` = log(C_next / C).

    On the support the optimum satisfies sign(w_S) + C grad L_S = 0, so d w_S / d log C =
    S_SS^-1 sign(w_S) / C (S the Hessian of L). A coordinate the step would carry through zero stops at
    zero (it leaves the support). S_SS gets a small ridge, and a step larger than the weights themselves
    (a near-singular S_SS: collinear one-hot blocks) is not taken.
    """
    support = np.flatnonzero(w)
    if support.size == 0:
        return w
    S_SS = S[np.ix_(support, support)].copy()
    S_SS[np.diag_indices(support.size)] += 1e-6 * max(float(np.max(np.diag(S_SS))), 1e-12)
    try:
        dw = np.linalg.solve(S_SS, np.sign(w[support]) / C)
    except np.linalg.LinAlgError:
        return w
    move = step * dw
    # along the (near-)null directions of collinear one-hot blocks the solve is meaningless: a predictor
    # that moves further than the weights' own size is no guess at all
    if not np.all(np.isfinite(move)) or float(np.max(np.abs(move))) > 1.0 + float(np.max(np.abs(w))):
        return w
    out = w.copy()
    moved = w[support] + move
    moved[np.sign(moved) != np.sign(w[support])] = 0.0
    out[support] = moved
    return out


def solve_path(
    prob: LogisticProblem,
    penalty: str,
    Cs: Sequence[float],
    tol: float,
    max_iter: int,
    w0: np.ndarray | None,
    stats: dict,
) -> np.ndarray:
    """`fit_logistic_path` on a prepared problem, under the caller's BLAS limit: the solutions [len(Cs), d1]
    in the order of `Cs`, solved along increasing C, each warm-started from the last by a predictor."""
    cs = np.asarray(Cs, dtype=np.float64)
    order = np.argsort(cs, kind="stable")
    W = np.empty((cs.size, prob.d1))
    w = np.zeros(prob.d1) if w0 is None else np.array(w0, dtype=np.float64)
    S = factor = None
    prev_C = None
    for i in order:
        C = float(cs[i])
        if penalty == "l2":
            if prev_C is not None and S is not None and C != prev_C:
                # first-order predictor along the path, linear in log C (the path flattens as C grows):
                # d w / d log C = C (I + C S)^-1 w / C = (I + C S)^-1 w at the optimum
                if factor is None:
                    factor = _cholesky(np.eye(prob.d1) + prev_C * S)
                w = w + math.log(C / prev_C) * _cho_solve(factor, w)
            w, S, factor = _solve_l2(prob, C, w, S, tol, max_iter, stats)
        else:
            if prev_C is not None and S is not None and C != prev_C:
                w = _l1_predictor(w, S, prev_C, math.log(C / prev_C))
            w, S = _solve_l1(prob, C, w, S, tol, max_iter, stats)
        W[i] = w
        prev_C = C
    return W


def one_blas_thread() -> AbstractContextManager[object]:
    """Hold BLAS to one thread. The controller is made once: making it scans every loaded library, about
    17 ms, which was a tenth of a whole selection run on a small table."""
    global _threadpools
    if _threadpools is None:
        _threadpools = ThreadpoolController()
    return _threadpools.limit(limits=1, user_api="blas")


def fit_logistic_path(
    X: np.ndarray,
    y: np.ndarray,
    penalty: str,
    Cs: Sequence[float],
    *,
    tol: float = 1e-10,
    max_iter: int = 200,
    w0: np.ndarray | None = None,
    stats: dict | None = None,
) -> np.ndarray:
    """Solutions of liblinear's objective for every C in `Cs` (any order; solved along increasing C).

    Returns an array of shape (len(Cs), n_features + 1): the coefficients, then the intercept weight.
    `w0` warm-starts the smallest C; `stats`, if given, receives counts of Newton steps and Hessians.
    """
    if penalty not in PENALTIES:
        raise ValueError(f"penalty must be one of {PENALTIES}, got {penalty!r}")
    stats = {} if stats is None else stats
    # one BLAS thread: the products are small and a threaded gemv on a busy machine is far slower
    with one_blas_thread():
        return solve_path(LogisticProblem(X, y), penalty, Cs, tol, max_iter, w0, stats)


def fit_logistic(
    X: np.ndarray, y: np.ndarray, penalty: str, C: float, *, tol: float = 1e-10, w0: np.ndarray | None = None
) -> tuple[np.ndarray, float]:
    """One fit of liblinear's objective; returns (coef, intercept) like LogisticRegression would."""
    w = fit_logistic_path(X, y, penalty, [C], tol=tol, w0=w0)[0]
    return w[:-1].copy(), float(w[-1])


def liblinear_objective(
    X: np.ndarray, y: np.ndarray, penalty: str, C: float, coef: np.ndarray, intercept: float
) -> float:
    """The objective liblinear minimises (intercept weight regularised, intercept_scaling = 1)."""
    prob = LogisticProblem(X, y)
    w = np.append(np.ravel(coef), intercept)
    reg = 0.5 * float(w @ w) if penalty == "l2" else float(np.sum(np.abs(w)))
    return reg + C * prob.loss_of_margins(prob.margins(w))[0]
