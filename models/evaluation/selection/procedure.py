"""Model selection end to end (thesis Algorithm 3, steps 2-3): validation AUC of every candidate, the best
one refitted on train + validation and scored on the test set, by liblinear ("naive") or by the fast path
(logistic_path.py). The fast path scores all candidates' validation AUCs at once from ranks
(`auc_columns`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import rankdata
from sklearn.metrics import average_precision_score, roc_auc_score

from dpsynth.models.evaluation.selection.grid import PENALTIES, Candidate
from dpsynth.models.evaluation.selection.logistic_path import one_blas_thread, solve_path
from dpsynth.models.evaluation.selection.logistic_problem import LogisticProblem

if TYPE_CHECKING:
    from sklearn.linear_model import LogisticRegression


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
        return None if self.penalty is None or self.C is None else Candidate(self.penalty, self.C)

    def decision_scores(self, X: np.ndarray) -> np.ndarray:
        """The chosen classifier's scores of the rows of X; a degenerate result scores every row alike (0)."""
        if self.coef is None or self.intercept is None:
            return np.zeros(len(X))
        return X.astype(np.float64) @ self.coef + self.intercept


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


def _as_xy(X: ArrayLike, y: ArrayLike, name: str) -> tuple[np.ndarray, np.ndarray]:
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


def liblinear_model(penalty: str, C: float, random_state: int | None) -> LogisticRegression:
    """The thesis' model of one candidate, unfitted: scikit-learn's LogisticRegression with liblinear
    (``l1_ratio`` 0 or 1; scikit-learn 1.8+ deprecates ``penalty=``)."""
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(
        solver="liblinear", C=C, l1_ratio=1.0 if penalty == "l1" else 0.0, random_state=random_state
    )


def _naive_val_auc(
    X_train: np.ndarray,
    y_train: np.ndarray,
    X_val: np.ndarray,
    y_val: np.ndarray,
    cand: Candidate,
    random_state: int | None,
) -> float:
    model = liblinear_model(cand.penalty, cand.C, random_state).fit(X_train, y_train)
    return float(roc_auc_score(y_val, model.decision_function(X_val)))


def test_scores(y_test: np.ndarray, scores: np.ndarray) -> tuple[float, float]:
    """(ROC AUC, average precision) of `scores` on the test set; both NaN when it holds a single class.

    NaN, not an error: whether a test split holds both classes depends on the rows (and on the split the
    run's secret drew), and a run must not stop on that (docs/privacy.md, section 12)."""
    if np.unique(y_test).size < 2:
        return float("nan"), float("nan")
    # roc_auc_score's value, without its checks
    return float(auc_columns(y_test, scores)[0]), float(average_precision_score(y_test, scores))


def _degenerate(
    X_test: np.ndarray, y_test: np.ndarray, candidates: Sequence[Candidate], method: str, t0: float
) -> SelectionResult:
    single = np.unique(y_test).size < 2
    return SelectionResult(
        penalty=None,
        C=None,
        val_auc=float("nan"),
        test_auc=float("nan") if single else 0.5,
        test_auprc=float("nan") if single else float(np.mean(y_test)),
        seconds=time.perf_counter() - t0,
        val_aucs=[float("nan")] * len(candidates),
        degenerate=True,
        method=method,
    )


def _fast_selection(
    X_train: np.ndarray,
    y_train: np.ndarray,
    X_val: np.ndarray,
    y_val: np.ndarray,
    X_full: np.ndarray,
    y_full: np.ndarray,
    candidates: Sequence[Candidate],
    n_jobs: int | None,
    tol: float,
) -> tuple[int, list[float], np.ndarray, float]:
    prob = LogisticProblem(X_train, y_train)
    pens = sorted({c.penalty for c in candidates}, key=PENALTIES.index)
    by_pen = {p: [i for i, c in enumerate(candidates) if c.penalty == p] for p in pens}
    stats: dict = {}

    def path(p: str) -> tuple[str, np.ndarray]:
        return p, solve_path(prob, p, [candidates[i].C for i in by_pen[p]], tol, 200, None, {})

    if n_jobs is not None and n_jobs != 1 and len(pens) > 1:
        prob.reference_scale(1.0)  # compute the shared cache before the threads start
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
    w = solve_path(LogisticProblem(X_full, y_full), chosen.penalty, [chosen.C], tol, 200, W[best], stats)[0]
    return best, val_aucs, w[:-1].copy(), float(w[-1])


def select_model(
    X_train: ArrayLike,
    y_train: ArrayLike,
    X_val: ArrayLike,
    y_val: ArrayLike,
    X_test: ArrayLike,
    y_test: ArrayLike,
    candidates: Sequence[Candidate],
    *,
    method: str = "fast",
    n_jobs: int | None = 1,
    random_state: int | None = 0,
    tol: float = 1e-10,
) -> SelectionResult:
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
                delayed(_naive_val_auc)(X_train, y_train, X_val, y_val, c, random_state) for c in candidates
            )
        best = _best_index(val_aucs)
        chosen = candidates[best]
        model = liblinear_model(chosen.penalty, chosen.C, random_state).fit(X_full, y_full)
        coef, intercept = model.coef_.ravel().copy(), float(model.intercept_[0])
    else:
        with one_blas_thread():
            best, val_aucs, coef, intercept = _fast_selection(
                X_train, y_train, X_val, y_val, X_full, y_full, candidates, n_jobs, tol
            )
        chosen = candidates[best]

    test_auc, test_auprc = test_scores(y_test, X_test.astype(np.float64) @ coef + intercept)
    return SelectionResult(
        penalty=chosen.penalty,
        C=chosen.C,
        val_auc=float(val_aucs[best]),
        test_auc=test_auc,
        test_auprc=test_auprc,
        seconds=time.perf_counter() - t0,
        val_aucs=[float(a) for a in val_aucs],
        degenerate=False,
        method=method,
        index=best,
        coef=coef,
        intercept=intercept,
    )
