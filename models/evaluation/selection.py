"""Logistic-regression model selection of the thesis' downstream experiment (Algorithm 3).

Features arrive already encoded to [-1, 1]; the target is binary {0, 1}. The protocol:

1. `regularisation_grid` draws 20 values of C at random, with a seed, from a logarithmic space strictly
   inside (0, 1); the candidates are penalty (l1, l2) x C, i.e. 40 models.
2. Every candidate is fitted on the training set and scored by ROC AUC on the validation set; the best one
   wins (ties go to the first candidate in candidate order).
3. The winner is refitted on train + validation and scored (ROC AUC and average precision) on the test set.

Two implementations of step 2-3 are offered by `select_model`:

* ``method="naive"``: the thesis' loop, one scikit-learn ``LogisticRegression(solver="liblinear")`` fit per
  candidate (``l1_ratio`` 0 or 1; scikit-learn 1.8+ deprecates ``penalty=``).
* ``method="fast"``: solves *the same objective* as liblinear with a small dense second-order solver that
  reuses work along the sorted C path. liblinear appends a constant feature (``intercept_scaling=1``) and
  regularises its weight like any other, so with w = (coef, intercept) and x_i extended by a trailing 1 it
  minimises::

      l2:  0.5 * ||w||_2^2 + C * sum_i log(1 + exp(-s_i w.x_i))          s_i = 2 y_i - 1
      l1:        ||w||_1   + C * sum_i log(1 + exp(-s_i w.x_i))

  The d x d Hessian takes one pass over the data and every inner step then works on d x d matrices only.
  l2: damped Newton, warm-started along increasing C with a first-order predictor (dw/dlogC = H^-1 w),
  reusing a stale Hessian (and its Cholesky factor) while that is cheaper than a new one. l1: proximal
  Newton (liblinear's own newGLMNET scheme) whose quadratic sub-problem is solved by coordinate descent on
  the explicit d x d Hessian instead of on the data, with steps on the face of a settled sign pattern (an
  exact solve on the support, stopped where a weight reaches zero), again warm-started along C with a
  predictor on the support. Both are solved to a relative optimality of `tol` (default 1e-10, far below
  liblinear's 1e-4), so they reach the exact optimum that liblinear approximates. Validation AUCs of all
  candidates are computed at once from ranks (Mann-Whitney statistic with average ranks, equal to
  ``roc_auc_score`` up to rounding). BLAS is held to one thread: the products are small, and a threaded
  matrix-vector product on a busy 2-core machine was measured 10-50x slower.

  Width. Where the C kernels build (models/native/kernels.py), the rows are kept in float32 (exact: the
  features are float32) and the passes over the data, the l1 coordinate descent and (up to 32 columns)
  the Hessian run in C with float64 sums; wider Hessians are float32 BLAS products. At 128 encoded columns
  the pure-Python coordinate descent was 97% of a run and made the fast path slower than liblinear; one-hot
  blocks collinear with the intercept leave near-flat directions that coordinate descent crosses only in
  tens of thousands of sweeps, which the face steps cross at once. Without a compiler, numpy and a Python
  coordinate descent (with an exact solve once the signs settle) do the same work more slowly: the
  reference the C loops are tested against.

  What "the same models" can mean: the l1 and l2 optima are unique in their predictions (the log-loss is
  strictly convex in the margins), so validation AUCs match liblinear's up to liblinear's own optimisation
  error (about 1e-6 of AUC on Cardio; on a 128-column table of 10,000 rows its tolerance once left a
  refitted model 0.006 of test AUC away from the optimum, which liblinear at tolerance 1e-8 reaches too:
  bench/model_selection.py reports such cases). When two candidates' validation AUCs differ by less
  than that, the two methods may pick different (equally good) candidates; the test AUCs then differ by
  about 1e-5. With one-hot blocks collinear with the intercept, the l1 coefficients themselves need not be
  unique (their predictions are).

Degenerate inputs (a collapsed generator that emits a single class in the training or validation set) do
not raise: the result has ``degenerate=True``, ``val_auc=nan``, ``test_auc=0.5`` (a constant score) and
``test_auprc`` equal to the positive rate of the test set (the average precision of a constant score).

numpy / scipy / scikit-learn and the project's C kernels: no Prefect, no MLflow.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from scipy.linalg.lapack import dpotrf, dpotrs
from scipy.stats import rankdata
from sklearn.metrics import average_precision_score, roc_auc_score
from threadpoolctl import ThreadpoolController

from dpsynth.models.native import kernels as native_kernels

__all__ = [
    "Candidate",
    "SelectionResult",
    "auc_columns",
    "fit_logistic",
    "fit_logistic_path",
    "liblinear_objective",
    "regularisation_grid",
    "select_model",
]

PENALTIES = ("l1", "l2")
_threadpools: ThreadpoolController | None = None
# l1: the sub-problem is solved to this fraction of the current outer optimality (keeps proximal Newton fast)
INNER_RTOL = 1e-3
# a stale Hessian is kept while one step shrinks the optimality measure by this factor or more (and, below
# that, while it stays cheaper than a new one: `_hessian_is_stale`)
REFRESH = 0.03
# up to this many columns (intercept included) the native Hessian is a C loop, beyond it a BLAS product
NARROW = 32
# l1: sweeps of the C coordinate descent between two face steps on a settled sign pattern
FACE_STEP_EVERY = 8

# The logarithmic space of the grid: 100 points 10^-4 ... 10^-0.04, i.e. strictly inside (0, 1).
GRID_LOG10_LOW = -4.0
GRID_LOG10_HIGH = 0.0
GRID_POINTS = 100


@dataclass(frozen=True)
class Candidate:
    """One model of the grid: a penalty ("l1" or "l2") and an inverse regularisation strength C."""

    penalty: str
    C: float

    def __post_init__(self):
        if self.penalty not in PENALTIES:
            raise ValueError(f"penalty must be one of {PENALTIES}, got {self.penalty!r}")
        if not (self.C > 0 and math.isfinite(self.C)):
            raise ValueError(f"C must be a positive finite number, got {self.C!r}")


@dataclass
class SelectionResult:
    """Outcome of one model-selection run.

    `val_aucs` holds the validation AUC of every candidate, in candidate order. `coef` and `intercept` are
    those of the chosen candidate refitted on train + validation (None when degenerate).
    """

    penalty: str | None
    C: float | None
    val_auc: float
    test_auc: float
    test_auprc: float
    seconds: float
    val_aucs: list[float] = field(default_factory=list)
    degenerate: bool = False
    method: str = "fast"
    index: int | None = None
    coef: np.ndarray | None = None
    intercept: float | None = None

    @property
    def candidate(self) -> Candidate | None:
        return None if self.penalty is None else Candidate(self.penalty, self.C)


def regularisation_grid(seed: int, n_values: int = 20, penalties: Sequence[str] = PENALTIES) -> list[Candidate]:
    """The thesis' grid: `n_values` values of C drawn at random from a logarithmic space in (0, 1).

    Choice made here: the logarithmic space is ``np.logspace(-4, 0, 100, endpoint=False)`` (1e-4 up to
    10^-0.04 ~ 0.91, every point strictly inside (0, 1)); `n_values` distinct points are drawn without
    replacement with ``np.random.default_rng(seed)`` and sorted increasingly. Candidates are ordered penalty
    first (in the order of `penalties`), then by increasing C; this is the order in which ties are broken.
    """
    space = np.logspace(GRID_LOG10_LOW, GRID_LOG10_HIGH, GRID_POINTS, endpoint=False)
    if not 1 <= n_values <= space.size:
        raise ValueError(f"n_values must be in [1, {space.size}], got {n_values}")
    penalties = tuple(penalties)
    for p in penalties:
        if p not in PENALTIES:
            raise ValueError(f"unknown penalty {p!r}; expected one of {PENALTIES}")
    rng = np.random.default_rng(seed)
    cs = np.sort(rng.choice(space, size=n_values, replace=False))
    return [Candidate(p, float(c)) for p in penalties for c in cs]


# --------------------------------------------------------------------------------------------------------
# The solver: liblinear's objective, solved to high precision.
# --------------------------------------------------------------------------------------------------------


class _Problem:
    """Data of one fit, stored as the rows s_i x_i (x_i extended by a constant 1, s_i = 2 y_i - 1).

    Margins are then one product (m = Xs w), the log-loss gradient another; s_i^2 = 1 leaves the Hessian
    unchanged. native (default: where the C kernels build): the rows are kept in float32 (exact: the
    features arrive as float32 and s_i = +-1) and the two products run in C with float64 sums, reading half
    the bytes; the Hessian is then a float32 product. Otherwise float64. Fortran order either way: the C
    loops stream columns, and numpy's products are single BLAS calls.
    """

    def __init__(self, X: np.ndarray, y: np.ndarray, native: bool | None = None):
        X = np.asarray(X)
        n, d = X.shape
        self.native = native_kernels.available() if native is None else native
        if self.native and X.dtype != np.float32:
            # float32 rows are exact only for float32 features
            self.native = bool(np.all(X.astype(np.float32) == X))
        s = np.where(np.asarray(y).ravel() > 0, 1.0, -1.0)
        dtype = np.float32 if self.native else np.float64
        Xs = np.empty((n, d + 1), dtype=dtype, order="F")
        Xs[:, :d] = X
        Xs[:, :d] *= s[:, None].astype(dtype)
        Xs[:, d] = s
        self.Xs = Xs
        self.n, self.d1 = n, d + 1
        self._g0: float | None = None

    def margins(self, w: np.ndarray) -> np.ndarray:
        if self.native:
            return native_kernels.logistic_margins(self.Xs, np.ascontiguousarray(w, dtype=np.float64))
        return self.Xs @ w

    @staticmethod
    def loss_of_margins(m: np.ndarray) -> tuple[float, np.ndarray]:
        """sum log(1 + exp(-m)), stable for both signs; also returns exp(-|m|) for `grad_of_margins`."""
        e = np.exp(-np.abs(m))
        return float(np.sum(np.log1p(e)) + np.sum(np.maximum(-m, 0.0))), e

    def grad_of_margins(self, m: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Gradient of the log-loss sum and r = sigmoid(-m), given e = exp(-|m|)."""
        if self.native:
            return native_kernels.logistic_gradient(self.Xs, m, e)
        r = np.where(m >= 0, e, 1.0) / (1.0 + e)
        return -(r @ self.Xs), r

    def hessian(self, r: np.ndarray) -> np.ndarray:
        """Unscaled Hessian of the log-loss sum: X^T diag(r (1 - r)) X (B^T B: one symmetric BLAS product).

        It only steers the steps (optimality is always measured with the float64 gradient). The float64
        product is the reference; the native path's float32 product halves its cost (up to `NARROW`
        columns a C loop with float64 sums is cheaper still), and `hessian_ridge`
        keeps the l1 sub-problem positive definite against its rounding along the null directions of
        one-hot blocks collinear with the intercept.
        """
        if self.native and self.d1 <= NARROW:
            return native_kernels.logistic_hessian(self.Xs, r)
        B = self.Xs * np.sqrt(r * (1.0 - r)).astype(self.Xs.dtype)[:, None]
        return (B.T @ B).astype(np.float64)

    @property
    def hessian_ridge(self) -> float:
        """Relative ridge the l1 step adds to the Hessian's diagonal (a few float32 roundings, or a tiny
        one that only keeps an all-zero column's curvature positive)."""
        return 1e-6 if self.native else 1e-12


def _polish(H, a, u, support, tol):
    """Exact minimiser of the l1 sub-problem if the signs of u on `support` are the optimal ones.

    On a fixed sign pattern s the sub-problem is smooth: solve H_SS du_S = -(a_S + s_S). Accept the result
    only if no sign flips and every coordinate satisfies its optimality condition within `tol`; otherwise
    return None and coordinate descent goes on. A (near-)singular H_SS (collinear columns) fails the solve or
    the sign check and is thus left to coordinate descent.
    """
    Hn = np.asarray(H)
    an = np.asarray(a)
    un = np.asarray(u)
    S = np.asarray(support)
    sg = np.sign(un[S])
    rhs = -(an[S] + sg)
    try:
        du = np.linalg.solve(Hn[np.ix_(S, S)], rhs)
    except np.linalg.LinAlgError:
        return None
    if not np.all(np.isfinite(du)):
        return None
    u_new = un.copy()
    u_new[S] += du
    if np.any(np.sign(u_new[S]) != sg):
        return None
    a_new = an + Hn[:, S] @ du
    if _l1_optimality(a_new, u_new) > tol:
        return None
    return u_new, a_new


def _l1_cd(H: np.ndarray, g: np.ndarray, w: np.ndarray, tol: float, max_sweeps: int, stats: dict,
           native: bool | None = None) -> np.ndarray:
    """Coordinate descent for  min_u g.(u - w) + 0.5 (u - w)' H (u - w) + ||u||_1  on a d x d problem, from
    u = w. Stops when the minimum-norm subgradient of the sub-problem is below `tol` (infinity norm).

    native: the C loop (models/native/kernels.c `l1_cd`) or the Python one; None takes the C loop where it
    builds. Both sweep in the same order; once the sign pattern settles, the C loop takes face steps
    (`_face_step`) every `FACE_STEP_EVERY` sweeps, the Python loop tries the exact solve (`_polish`) after
    every sweep.
    """
    if native is None:
        native = native_kernels.available()
    if native:
        return _l1_cd_native(H, g, w, tol, max_sweeps, stats)
    u = _l1_cd_python(H.tolist(), g.tolist(), w.tolist(), w.tolist(), tol, max_sweeps, stats)
    return np.array(u)


def _face_step(H: np.ndarray, a: np.ndarray, u: np.ndarray, support: np.ndarray):
    """Move toward the minimiser of the l1 sub-problem on the face of u's sign pattern (there it is a
    smooth quadratic: H_SS du = -(a_S + s_S)), stopping where the first coordinate reaches zero (it is set
    to exactly zero and leaves the support). Returns (u, a, reached), reached: the face's minimiser
    itself; None if H_SS cannot be solved or the step would not decrease the sub-problem (rounding in an
    ill-conditioned solve), in which case coordinate descent goes on alone.

    Along the near-flat directions of one-hot blocks collinear with the intercept, coordinate descent
    creeps (tens of thousands of sweeps at 256 columns); these steps cross them at once.
    """
    sg = np.sign(u[support])
    H_SS = H[np.ix_(support, support)]
    try:
        du = np.linalg.solve(H_SS, -(a[support] + sg))
    except np.linalg.LinAlgError:
        return None
    if not np.all(np.isfinite(du)):
        return None
    u_s = u[support]
    crossing = np.sign(u_s + du) != sg
    t, hit = 1.0, -1
    if np.any(crossing):
        ratios = np.where(crossing, -u_s / np.where(crossing, du, 1.0), np.inf)
        hit = int(np.argmin(ratios))
        t = float(ratios[hit])
    step = t * du
    if hit >= 0:
        step[hit] = -u_s[hit]
    # on the face the l1 term is linear (sg), so the sub-problem changes by exactly this; an
    # ill-conditioned H_SS can make the solve inaccurate enough that it does not decrease: refuse
    change = float((a[support] + sg) @ step + 0.5 * step @ (H_SS @ step))
    if not change < 0.0:
        return None
    u_new = u.copy()
    u_new[support] = u_s + step
    if hit >= 0:
        u_new[support[hit]] = 0.0
    a_new = a + H[:, support] @ step
    return u_new, a_new, hit < 0


def _l1_cd_native(H, g, w, tol, max_sweeps, stats):
    """C coordinate descent in chunks of `FACE_STEP_EVERY` sweeps; between chunks, once the support has
    settled, a step on the face of the current sign pattern (`_face_step`)."""
    H = np.ascontiguousarray(H, dtype=np.float64)
    u = np.array(w, dtype=np.float64)
    a = np.array(g, dtype=np.float64)   # u = w: the gradient of the smooth part is g
    sweeps = 0
    prev_support = None
    face_steps = True
    while sweeps < max_sweeps:
        converged, done = native_kernels.l1_cd(H, u, a, tol, min(FACE_STEP_EVERY, max_sweeps - sweeps))
        sweeps += done
        if converged:
            break
        support = np.flatnonzero(u)
        if support.size and prev_support is not None and np.array_equal(support, prev_support):
            stepped = _face_step(H, a, u, support) if face_steps else None
            if stepped is None:
                face_steps = False
            else:
                u, a, reached = stepped
                stats["face_steps"] = stats.get("face_steps", 0) + 1
                if reached and _l1_optimality(a, u) <= tol:
                    break
                support = np.flatnonzero(u)
        prev_support = support
    stats["sweeps"] = stats.get("sweeps", 0) + sweeps
    return u


def _l1_cd_python(H: list[list[float]], g: list[float], w: list[float], u: list[float], tol: float,
                  max_sweeps: int, stats: dict) -> list[float]:
    """The reference loop in pure Python floats (fast enough at Cardio's width of 17)."""
    d1 = len(g)
    du = [u[k] - w[k] for k in range(d1)]
    # a = g + H (u - w): gradient of the smooth part at u
    a = [g[j] + sum(H[j][k] * du[k] for k in range(d1)) for j in range(d1)]
    diag = [H[j][j] for j in range(d1)]
    rng_all = range(d1)
    active = list(rng_all)
    prev_support = None
    sweeps = 0
    while sweeps < max_sweeps:
        sweeps += 1
        for j in active:
            h = diag[j]
            uj = u[j]
            z = uj - a[j] / h
            thr = 1.0 / h
            if z > thr:
                new = z - thr
            elif z < -thr:
                new = z + thr
            else:
                new = 0.0
            delta = new - uj
            if delta != 0.0:
                u[j] = new
                Hj = H[j]
                for k in rng_all:
                    a[k] += delta * Hj[k]
        # optimality of the sub-problem over all coordinates
        worst = 0.0
        viol = []
        for j in rng_all:
            uj, aj = u[j], a[j]
            if uj > 0.0:
                v = abs(aj + 1.0)
            elif uj < 0.0:
                v = abs(aj - 1.0)
            else:
                v = abs(aj) - 1.0
            if v > tol:
                viol.append(j)
            worst = max(worst, v)
        if worst <= tol:
            break
        support = [j for j in rng_all if u[j] != 0.0]
        if support and support == prev_support:
            # the sign pattern looks settled: jump to the exact minimiser on it (one small linear solve)
            polished = _polish(H, a, u, support, tol)
            if polished is not None:
                u, a = polished[0].tolist(), polished[1].tolist()
                break
        prev_support = support
        # next sweep: nonzero coordinates and violators only
        active = [j for j in rng_all if u[j] != 0.0 or j in viol]
    stats["sweeps"] = stats.get("sweeps", 0) + sweeps
    return u


def _warn_not_converged(stats: dict, C: float) -> None:
    stats["not_converged"] = stats.get("not_converged", 0) + 1
    warnings.warn(f"logistic solver did not reach its tolerance within max_iter (C={C:g})", RuntimeWarning,
                  stacklevel=3)


def _hessian_is_stale(prob: _Problem, now: float, before: float | None, target: float, fresh: bool) -> bool:
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


def _ref_scale(prob: _Problem, C: float) -> float:
    """Reference size of the gradient: the largest |gradient of C L| at w = 0 (the optimality scale)."""
    if prob._g0 is None:
        prob._g0 = float(np.max(np.abs(0.5 * np.sum(prob.Xs, axis=0, dtype=np.float64))))
    return C * prob._g0


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


def _solve_l2(prob: _Problem, C: float, w: np.ndarray, S: np.ndarray | None, tol: float, max_iter: int,
              stats: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Damped Newton for 0.5||w||^2 + C L(w) from w; S is a (possibly stale) unscaled Hessian of L.
    Returns w, S and the Cholesky factor of I + C S (kept while S is: stale steps cost d^2, not d^3)."""
    eye = np.eye(prob.d1)
    factor = None
    m = prob.margins(w)
    loss, e = prob.loss_of_margins(m)
    F = 0.5 * float(w @ w) + C * loss
    target = tol * max(_ref_scale(prob, C), 1e-300)
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


def _l1_optimality(g: np.ndarray, w: np.ndarray) -> float:
    """Infinity norm of the minimum-norm subgradient of ||w||_1 + (smooth part with gradient g)."""
    v = np.where(w > 0, g + 1.0, np.where(w < 0, g - 1.0, np.maximum(np.abs(g) - 1.0, 0.0)))
    return float(np.max(np.abs(v)))


def _solve_l1(prob: _Problem, C: float, w: np.ndarray, S: np.ndarray | None, tol: float, max_iter: int,
              stats: dict) -> tuple[np.ndarray, np.ndarray]:
    """Proximal Newton (newGLMNET) for ||w||_1 + C L(w) from w; S is a (possibly stale) Hessian of L."""
    d1 = prob.d1
    m = prob.margins(w)
    loss, e = prob.loss_of_margins(m)
    l1w = float(np.sum(np.abs(w)))
    F = l1w + C * loss
    # the subgradient at 0 is max(|g0| - 1, 0); keep a unit floor for the scale
    target = tol * max(_ref_scale(prob, C), 1.0)
    fresh = False
    prev_opt = None
    for _ in range(max_iter):
        gL, r = prob.grad_of_margins(m, e)
        g = C * gL
        opt = _l1_optimality(g, w)
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
        u = _l1_cd(H, g, w, inner_tol, 1000, stats)
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


def _path(prob: _Problem, penalty: str, Cs: Sequence[float], tol: float, max_iter: int,
          w0: np.ndarray | None, stats: dict) -> np.ndarray:
    Cs = np.asarray(Cs, dtype=np.float64)
    order = np.argsort(Cs, kind="stable")
    W = np.empty((Cs.size, prob.d1))
    w = np.zeros(prob.d1) if w0 is None else np.array(w0, dtype=np.float64)
    S = factor = None
    prev_C = None
    for i in order:
        C = float(Cs[i])
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


def _one_blas_thread():
    """Hold BLAS to one thread. The controller is made once: making it scans every loaded library, about
    17 ms, which was a tenth of a whole selection run on a small table."""
    global _threadpools
    if _threadpools is None:
        _threadpools = ThreadpoolController()
    return _threadpools.limit(limits=1, user_api="blas")


def fit_logistic_path(X: np.ndarray, y: np.ndarray, penalty: str, Cs: Sequence[float], *, tol: float = 1e-10,
                      max_iter: int = 200, w0: np.ndarray | None = None,
                      stats: dict | None = None) -> np.ndarray:
    """Solutions of liblinear's objective for every C in `Cs` (any order; solved along increasing C).

    Returns an array of shape (len(Cs), n_features + 1): the coefficients, then the intercept weight.
    `w0` warm-starts the smallest C; `stats`, if given, receives counts of Newton steps and Hessians.
    """
    if penalty not in PENALTIES:
        raise ValueError(f"penalty must be one of {PENALTIES}, got {penalty!r}")
    stats = {} if stats is None else stats
    # one BLAS thread: the products are small and a threaded gemv on a busy machine is far slower
    with _one_blas_thread():
        return _path(_Problem(X, y), penalty, Cs, tol, max_iter, w0, stats)


def fit_logistic(X: np.ndarray, y: np.ndarray, penalty: str, C: float, *, tol: float = 1e-10,
                 w0: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """One fit of liblinear's objective; returns (coef, intercept) like LogisticRegression would."""
    w = fit_logistic_path(X, y, penalty, [C], tol=tol, w0=w0)[0]
    return w[:-1].copy(), float(w[-1])


def liblinear_objective(X: np.ndarray, y: np.ndarray, penalty: str, C: float, coef: np.ndarray,
                        intercept: float) -> float:
    """The objective liblinear minimises (intercept weight regularised, intercept_scaling = 1)."""
    prob = _Problem(X, y)
    w = np.append(np.ravel(coef), intercept)
    reg = 0.5 * float(w @ w) if penalty == "l2" else float(np.sum(np.abs(w)))
    return reg + C * prob.loss_of_margins(prob.margins(w))[0]


def auc_columns(y: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """ROC AUC of every column of `scores` against binary y (Mann-Whitney U with average ranks for ties).

    Equal to ``roc_auc_score(y, scores[:, j])`` up to rounding; raises if y holds a single class.
    """
    y = np.asarray(y) > 0
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim == 1:
        scores = scores[:, None]
    n1 = int(y.sum())
    n0 = y.size - n1
    if n1 == 0 or n0 == 0:
        raise ValueError("AUC is undefined when y holds a single class")
    ranks = rankdata(scores, axis=0)
    return (ranks[y].sum(axis=0) - n1 * (n1 + 1) / 2.0) / (n1 * n0)


# --------------------------------------------------------------------------------------------------------
# Model selection
# --------------------------------------------------------------------------------------------------------


def _as_xy(X, y, name):
    X = np.asarray(X)
    y = np.asarray(y).ravel()
    if X.ndim != 2:
        raise ValueError(f"{name}: X must be 2-D, got shape {X.shape}")
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"{name}: X has {X.shape[0]} rows but y has {y.shape[0]}")
    if not np.all(np.isfinite(X)):
        raise ValueError(f"{name}: X holds non-finite values")
    labels = np.unique(y)
    if not np.all(np.isin(labels, (0, 1))):
        raise ValueError(f"{name}: y must be binary in {{0, 1}}, got labels {labels[:5]}")
    return X, y.astype(np.int64)


def _best_index(aucs: Sequence[float]) -> int:
    """Index of the highest AUC; ties (and nan) resolved to the first in candidate order."""
    best, best_auc = 0, -np.inf
    for i, a in enumerate(aucs):
        if a > best_auc:  # strict: the first of equal AUCs wins; nan never wins
            best, best_auc = i, a
    return best


def _liblinear(penalty: str, C: float, random_state: int | None):
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(solver="liblinear", C=C, l1_ratio=1.0 if penalty == "l1" else 0.0,
                              random_state=random_state)


def _naive_val_auc(X_train, y_train, X_val, y_val, cand: Candidate, random_state) -> float:
    model = _liblinear(cand.penalty, cand.C, random_state).fit(X_train, y_train)
    return float(roc_auc_score(y_val, model.decision_function(X_val)))


def _degenerate(X_test, y_test, candidates, method, t0) -> SelectionResult:
    return SelectionResult(
        penalty=None, C=None, val_auc=float("nan"), test_auc=0.5,
        test_auprc=float(np.mean(y_test)), seconds=time.perf_counter() - t0,
        val_aucs=[float("nan")] * len(candidates), degenerate=True, method=method,
    )


def _fast_selection(X_train, y_train, X_val, y_val, X_full, y_full, candidates, n_jobs, tol):
    prob = _Problem(X_train, y_train)
    pens = sorted({c.penalty for c in candidates}, key=PENALTIES.index)
    by_pen = {p: [i for i, c in enumerate(candidates) if c.penalty == p] for p in pens}
    stats: dict = {}

    def path(p):
        return p, _path(prob, p, [candidates[i].C for i in by_pen[p]], tol, 200, None, {})

    if n_jobs is not None and n_jobs != 1 and len(pens) > 1:
        _ref_scale(prob, 1.0)  # compute the shared cache before the threads start
        with ThreadPoolExecutor(max_workers=len(pens)) as ex:
            paths = dict(ex.map(path, pens))
    else:
        paths = dict(map(path, pens))
    W = np.empty((len(candidates), prob.d1))
    for p in pens:
        W[by_pen[p]] = paths[p]
    scores = X_val.astype(np.float64) @ W[:, :-1].T + W[:, -1]
    val_aucs = auc_columns(y_val, scores).tolist()
    best = _best_index(val_aucs)
    chosen = candidates[best]
    # refit on train + validation, warm-started from the training solution
    w = _path(_Problem(X_full, y_full), chosen.penalty, [chosen.C], tol, 200, W[best], stats)[0]
    return best, val_aucs, w[:-1].copy(), float(w[-1])


def select_model(X_train, y_train, X_val, y_val, X_test, y_test, candidates: Sequence[Candidate], *,
                 method: str = "fast", n_jobs: int | None = 1, random_state: int | None = 0,
                 tol: float = 1e-10) -> SelectionResult:
    """Algorithm 3: choose the candidate with the best validation AUC, refit on train + val, score on test.

    method: "fast" (path-wise dense solver of liblinear's objective) or "naive" (one liblinear fit per
    candidate, the thesis' loop). n_jobs: "naive" fits candidates in that many joblib workers; "fast" solves
    the l1 and l2 paths in two threads when n_jobs != 1. random_state: liblinear's seed (naive only; its l1
    coordinate descent visits coordinates in random order). tol: relative optimality of the fast solver.
    """
    t0 = time.perf_counter()
    if method not in ("fast", "naive"):
        raise ValueError(f"method must be 'fast' or 'naive', got {method!r}")
    candidates = list(candidates)
    if not candidates:
        raise ValueError("no candidates")
    X_train, y_train = _as_xy(X_train, y_train, "train")
    X_val, y_val = _as_xy(X_val, y_val, "validation")
    X_test, y_test = _as_xy(X_test, y_test, "test")
    if not (X_train.shape[1] == X_val.shape[1] == X_test.shape[1]):
        raise ValueError("train, validation and test sets must have the same number of columns")
    if np.unique(y_test).size < 2:
        raise ValueError("the test set holds a single class: its AUC is undefined")
    if np.unique(y_train).size < 2 or np.unique(y_val).size < 2:
        return _degenerate(X_test, y_test, candidates, method, t0)

    X_full = np.concatenate([X_train, X_val])
    y_full = np.concatenate([y_train, y_val])

    if method == "naive":
        if n_jobs is None or n_jobs == 1:
            val_aucs = [_naive_val_auc(X_train, y_train, X_val, y_val, c, random_state) for c in candidates]
        else:
            from joblib import Parallel, delayed

            val_aucs = Parallel(n_jobs=n_jobs)(
                delayed(_naive_val_auc)(X_train, y_train, X_val, y_val, c, random_state) for c in candidates)
        best = _best_index(val_aucs)
        chosen = candidates[best]
        model = _liblinear(chosen.penalty, chosen.C, random_state).fit(X_full, y_full)
        coef, intercept = model.coef_.ravel().copy(), float(model.intercept_[0])
    else:
        with _one_blas_thread():
            best, val_aucs, coef, intercept = _fast_selection(
                X_train, y_train, X_val, y_val, X_full, y_full, candidates, n_jobs, tol)
        chosen = candidates[best]

    test_scores = X_test.astype(np.float64) @ coef + intercept
    return SelectionResult(
        penalty=chosen.penalty, C=chosen.C, val_auc=float(val_aucs[best]),
        test_auc=float(auc_columns(y_test, test_scores)[0]),   # roc_auc_score's value, without its checks
        test_auprc=float(average_precision_score(y_test, test_scores)),
        seconds=time.perf_counter() - t0, val_aucs=[float(a) for a in val_aucs], degenerate=False,
        method=method, index=best, coef=coef, intercept=intercept,
    )
