"""Benchmark of the logistic-regression model selection (thesis Algorithm 3): naive liblinear loop vs fast path.

What is measured: for each run, the wall-clock seconds of one full
`dpsynth.models.evaluation.selection.select_model` call
(40 candidates: l1/l2 x 20 values of C from `regularisation_grid(seed)`; validation AUC of every candidate;
refit of the winner on train + validation; test AUC and AUPRC), once with ``method="naive"`` (one
scikit-learn liblinear fit per candidate, sequential, as in the thesis) and with ``method="fast"`` on the
same data and grid (the fast call is repeated `--fast-repeats` times, default 3, and its mean time is
used: a 0.1 s call is easily distorted by other processes on a shared machine, a 10 s one much less).
Both run on one thread. Reported per table shape: total seconds of each, their ratio, the largest
absolute difference of the test AUCs, and in how many runs both chose the same candidate.

liblinear stops at its default tolerance (1e-4), the fast path at the optimum (1e-10). Where their test
AUCs differ by more than 0.002, the benchmark refits the chosen candidate with liblinear at tolerance
1e-8 (untimed) and reports how far the fast path is from that exact solution (`max_auc_diff_exact`) and
which of the two liblinear solutions has the lower objective: the gap is then liblinear's own
optimisation error.

Tables, generated here with planted structure (no real rows):

* ``cardio``: the size of the real experiment, 56,000 training / 7,000 validation / 7,000 test rows,
  16 features in [-1, 1] (5 continuous, 5 binary, two one-hot blocks of 3 like Cardio's cholesterol and
  gluc, so the one-hot columns are collinear with the intercept) and a logistic target with a test AUC
  of about 0.8.
* a width W (``--width 128``): a census-like table W encoded columns wide (`bench/_layout.py`: a sixth
  continuous, half of them heavy-tailed at a bound; a 42-level group with Zipf shares and rare levels;
  binary columns and one-hot groups of 3 to 12), ``--rows`` rows split 80/10/10, and a logistic target
  on a sparse subset of columns and levels.

Even runs are "real-vs-real"; odd runs mimic a synthetic-data evaluation: training and validation rows
come from a noisier, biased copy of the generator (perturbed coefficients, jittered features, flipped
labels, shifted shares) and the test rows from the "real" one.

Usage: ``python -m bench.model_selection [--json] [--width cardio 128 256] [--rows 10000 100000] [--runs N]``
(default: cardio and 128 columns x 32,561 rows). The last line printed is JSON: {"ratio" (the smallest
over the tables), "max_auc_diff", "max_auc_diff_exact", "tables": [per shape: "naive_s", "fast_s",
"ratio", "max_auc_diff", ...]}.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from sklearn.metrics import roc_auc_score

from bench._layout import wide_layout
from dpsynth.models.evaluation.selection import (
    liblinear_model,
    liblinear_objective,
    regularisation_grid,
    select_model,
)

N_TRAIN, N_VAL, N_TEST = 56_000, 7_000, 7_000
WIDTH_CARDIO = 16
WIDE_ROWS = 32_561  # a census-style table's rows
AUC_TOLERANCE = 0.002  # the issue's bound on the test-AUC difference

# coefficients of the "real" logistic target on the 16 encoded columns
_BETA = np.array(
    [
        1.1,
        0.05,
        0.35,
        2.4,
        0.7,  # continuous: age, height, weight, ap_hi, ap_lo (encoded)
        0.02,
        -0.08,
        -0.1,
        -0.2,
        0.0,  # binary: gender, smoke, alco, active, (a weak one)
        -0.35,
        0.05,
        0.3,  # one-hot block 1 (cholesterol-like)
        0.05,
        -0.05,
        0.0,  # one-hot block 2 (gluc-like)
    ]
)
_INTERCEPT = 0.25


def _features(rng: np.random.Generator, n: int, *, jitter: float = 0.0, share_shift: float = 0.0) -> np.ndarray:
    cov = np.array(
        [
            [1.0, 0.0, 0.1, 0.25, 0.2],
            [0.0, 1.0, 0.38, 0.05, 0.05],
            [0.1, 0.38, 1.0, 0.4, 0.35],
            [0.25, 0.05, 0.4, 1.0, 0.7],
            [0.2, 0.05, 0.35, 0.7, 1.0],
        ]
    )
    cont = rng.multivariate_normal(np.zeros(5), cov, size=n)
    cont += jitter * rng.normal(size=cont.shape)
    # integer-valued measurements (height, weight, pressures) are discretised before scaling, as in Cardio
    cont[:, 1:] = np.round(cont[:, 1:] * 8) / 8
    cont = np.clip(cont / 3.0, -1.0, 1.0)
    p_bin = np.clip(np.array([0.35, 0.09, 0.05, 0.8, 0.5]) + share_shift, 0.01, 0.99)
    binary = (rng.random((n, 5)) < p_bin).astype(np.float64) * 2 - 1
    p1 = np.array([0.75, 0.14, 0.11]) + share_shift * np.array([-1, 0.5, 0.5])
    p2 = np.array([0.85, 0.07, 0.08]) + share_shift * np.array([-1, 0.5, 0.5])
    oh1 = np.eye(3)[rng.choice(3, size=n, p=p1 / p1.sum())] * 2 - 1
    oh2 = np.eye(3)[rng.choice(3, size=n, p=p2 / p2.sum())] * 2 - 1
    return np.concatenate([cont, binary, oh1, oh2], axis=1)


def _target(rng, X, beta, intercept, flip=0.0):
    p = 1.0 / (1.0 + np.exp(-(X @ beta + intercept)))
    y = (rng.random(X.shape[0]) < p).astype(np.int64)
    if flip:
        f = rng.random(y.size) < flip
        y[f] = 1 - y[f]
    return y


def _stratified_split(rng, y, sizes):
    """Indices of consecutive stratified parts of the given sizes."""
    parts = [[] for _ in sizes]
    total = sum(sizes)
    for cls in (0, 1):
        idx = rng.permutation(np.flatnonzero(y == cls))
        start = 0
        for k, size in enumerate(sizes):
            take = round(size * idx.size / total) if k < len(sizes) - 1 else idx.size - start
            parts[k].append(idx[start : start + take])
            start += take
    return [rng.permutation(np.concatenate(p)) for p in parts]


def make_data(seed: int, synthetic: bool):
    """(X_train, y_train, X_val, y_val, X_test, y_test) as float32 / int64 arrays."""
    rng = np.random.default_rng(seed)
    X = _features(rng, N_TRAIN + N_VAL + N_TEST)
    y = _target(rng, X, _BETA, _INTERCEPT)
    tr, va, te = _stratified_split(rng, y, (N_TRAIN, N_VAL, N_TEST))
    X_test, y_test = X[te], y[te]
    if not synthetic:
        X_train, y_train, X_val, y_val = X[tr], y[tr], X[va], y[va]
    else:
        # a mediocre generator: biased coefficients, jittered features, flipped labels, shifted shares
        beta = _BETA * rng.uniform(0.3, 1.4, size=_BETA.size) + rng.normal(scale=0.15, size=_BETA.size)
        Xs = _features(rng, N_TRAIN + N_VAL, jitter=0.4, share_shift=0.05)
        ys = _target(rng, Xs, beta, _INTERCEPT - 0.3, flip=0.12)
        tr, va = _stratified_split(rng, ys, (N_TRAIN, N_VAL))
        X_train, y_train, X_val, y_val = Xs[tr], ys[tr], Xs[va], ys[va]
    f32 = np.float32
    return X_train.astype(f32), y_train, X_val.astype(f32), y_val, X_test.astype(f32), y_test


def _wide_features(rng, n, n_cont, groups, shares, *, jitter=0.0):
    # continuous columns: correlated through two shared factors, half of them heavy-tailed at a bound
    factors = rng.standard_normal((n, 2))
    load = np.linspace(0.2, 0.7, n_cont)
    cont = factors[:, [0]] * load + factors[:, [1]] * load[::-1] * 0.5 + rng.standard_normal((n, n_cont))
    cont += jitter * rng.standard_normal(cont.shape)
    cont[:, ::2] = np.expm1(np.abs(cont[:, ::2])) / 6.0 - 1.0  # mass near -1, a long right tail
    cont = np.clip(np.round(cont * 16) / 16 / 3.0, -1.0, 1.0)
    blocks = [cont]
    for size, p in zip(groups, shares, strict=False):
        if size == 1:
            blocks.append(np.where(rng.random((n, 1)) < p[0], 1.0, -1.0))
        else:
            blocks.append(np.eye(size)[rng.choice(size, size=n, p=p)] * 2 - 1)
    return np.concatenate(blocks, axis=1)


def make_wide_data(seed: int, synthetic: bool, width: int, rows: int):
    """Like `make_data` for a census-like table `width` encoded columns wide and `rows` rows in all (split
    80/10/10), with planted structure: a logistic target on a sparse subset of columns and levels."""
    rng = np.random.default_rng(seed)
    n_cont, groups = wide_layout(width)
    shares = []
    for size in groups:
        if size == 1:
            shares.append(np.array([rng.uniform(0.05, 0.6)]))
        else:
            w = 1.0 / np.arange(1, size + 1) ** 1.3  # Zipf: the last levels are rare
            shares.append(w / w.sum())
    beta = rng.normal(scale=0.6, size=width) * (rng.random(width) < 0.4)
    beta[:n_cont] = rng.normal(scale=1.2, size=n_cont)
    n_train, n_val = int(0.8 * rows), int(0.1 * rows)
    n_test = rows - n_train - n_val
    X = _wide_features(rng, rows, n_cont, groups, shares)
    y = _target(rng, X, beta, -0.4)
    tr, va, te = _stratified_split(rng, y, (n_train, n_val, n_test))
    X_test, y_test = X[te], y[te]
    if not synthetic:
        X_train, y_train, X_val, y_val = X[tr], y[tr], X[va], y[va]
    else:
        beta_s = beta * rng.uniform(0.3, 1.4, size=width) + rng.normal(scale=0.15, size=width)
        shares_s = []
        for p in shares:
            q = np.clip(p * rng.uniform(0.5, 1.5, size=p.size), 1e-4, None)
            shares_s.append(q if p.size == 1 else q / q.sum())
        Xs = _wide_features(rng, n_train + n_val, n_cont, groups, shares_s, jitter=0.4)
        ys = _target(rng, Xs, beta_s, -0.7, flip=0.12)
        tr, va = _stratified_split(rng, ys, (n_train, n_val))
        X_train, y_train, X_val, y_val = Xs[tr], ys[tr], Xs[va], ys[va]
    f32 = np.float32
    return X_train.astype(f32), y_train, X_val.astype(f32), y_val, X_test.astype(f32), y_test


def _warm_up():
    """Load libraries and thread pools outside the timed region (small data)."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(600, 16)).astype(np.float32)
    y = (X[:, 0] + rng.normal(size=600) > 0).astype(np.int64)
    grid = regularisation_grid(0, n_values=2)
    for method in ("naive", "fast"):
        select_model(X[:400], y[:400], X[400:500], y[400:500], X[500:], y[500:], grid, method=method)


def _exact_reference(data, fast) -> tuple[float, str]:
    """|test AUC difference| between the fast path and liblinear at tolerance 1e-8 for the fast path's
    choice refitted on train + validation, and which liblinear solution has the lower objective."""
    X_train, y_train, X_val, y_val, X_test, y_test = data
    X_full, y_full = np.concatenate([X_train, X_val]), np.concatenate([y_train, y_val])
    loose = liblinear_model(fast.penalty, fast.C, 0).fit(X_full, y_full)
    tight = liblinear_model(fast.penalty, fast.C, 0).set_params(tol=1e-8, max_iter=100_000).fit(X_full, y_full)
    scores = X_test.astype(np.float64) @ tight.coef_.ravel() + tight.intercept_[0]
    objective = {
        name: liblinear_objective(X_full, y_full, fast.penalty, fast.C, m.coef_.ravel(), m.intercept_[0])
        for name, m in (("tol 1e-4", loose), ("tol 1e-8", tight))
    }
    fast_objective = liblinear_objective(X_full, y_full, fast.penalty, fast.C, fast.coef, fast.intercept)
    lower = min(objective, key=objective.get)
    lower += f" ({objective['tol 1e-4']:.8g} vs {objective['tol 1e-8']:.8g}; fast path {fast_objective:.8g})"
    return abs(float(roc_auc_score(y_test, scores)) - fast.test_auc), lower


def _one_table(args, width: int | None, rows: int | None) -> dict:
    """naive and fast selection on `args.runs` tables of one shape; width None: the Cardio-like table."""
    naive_s = fast_s = 0.0
    max_diff = max_exact = 0.0
    same = 0
    label = "cardio" if width is None else f"{width} columns x {rows} rows"
    for run in range(args.runs):
        seed = args.seed + run
        synthetic = run % 2 == 1
        data = make_data(seed, synthetic) if width is None else make_wide_data(seed, synthetic, width, rows)
        grid = regularisation_grid(seed)
        naive = select_model(*data, grid, method="naive", n_jobs=1)
        fasts = [select_model(*data, grid, method="fast", n_jobs=args.n_jobs) for _ in range(max(1, args.fast_repeats))]
        fast = fasts[0]
        assert all(f.index == fast.index and f.test_auc == fast.test_auc for f in fasts), "not deterministic"
        fast_seconds = float(np.mean([f.seconds for f in fasts]))
        naive_s += naive.seconds
        fast_s += fast_seconds
        diff = abs(naive.test_auc - fast.test_auc)
        max_diff = max(max_diff, diff)
        same += naive.index == fast.index
        exact_diff = diff
        if diff > AUC_TOLERANCE:
            exact_diff, lower = _exact_reference(data, fast)
            objective_note = f"; liblinear at tol 1e-8: |dAUC| {exact_diff:.2e}, lower objective: {lower}"
            if not args.json:
                print(f"  {label}, run {run}: test AUCs differ by {diff:.2e}{objective_note}", flush=True)
        max_exact = max(max_exact, exact_diff)
        if not args.json:
            val_gap = max(abs(a - b) for a, b in zip(naive.val_aucs, fast.val_aucs, strict=False))
            print(
                f"{label}, run {run} ({'synthetic-like' if synthetic else 'real-vs-real'}, seed {seed}): "
                f"naive {naive.seconds:.2f}s -> {naive.penalty} C={naive.C:.4g} val {naive.val_auc:.5f} "
                f"test {naive.test_auc:.5f} | fast {fast_seconds:.3f}s -> {fast.penalty} C={fast.C:.4g} "
                f"val {fast.val_auc:.5f} test {fast.test_auc:.5f} | |dAUC| {diff:.2e}, "
                f"max |d val AUC| {val_gap:.1e}",
                flush=True,
            )
    return {
        "table": label,
        "width": WIDTH_CARDIO if width is None else width,
        "rows": N_TRAIN + N_VAL + N_TEST if rows is None else rows,
        "naive_s": round(naive_s, 3),
        "fast_s": round(fast_s, 3),
        "ratio": round(naive_s / fast_s, 1) if fast_s > 0 else None,
        "max_auc_diff": float(f"{max_diff:.3g}"),
        "max_auc_diff_exact": float(f"{max_exact:.3g}"),
        "same_choice": f"{same}/{args.runs}",
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON summary line")
    ap.add_argument("--runs", type=int, default=2, help="runs per shape (even: real-vs-real, odd: synthetic-like)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--width",
        nargs="+",
        default=["cardio", "128"],
        help="encoded widths of census-like tables, or 'cardio' for the Cardio-like table (default: cardio 128)",
    )
    ap.add_argument(
        "--rows",
        type=int,
        nargs="+",
        default=None,
        help=f"rows of each census-like table, split 80/10/10 (default {WIDE_ROWS})",
    )
    ap.add_argument("--n-jobs", type=int, default=1, help="n_jobs of the fast path (naive stays sequential)")
    ap.add_argument("--fast-repeats", type=int, default=3, help="fast calls per run; their mean time is used")
    args = ap.parse_args(argv)

    shapes = []
    for token in args.width:
        if token == "cardio":
            shapes.append((None, None))
        elif token.isdigit() and int(token) >= 3:
            shapes += [(int(token), r) for r in (args.rows or [WIDE_ROWS])]
        else:
            ap.error(f"--width takes encoded widths of at least 3 or 'cardio', not {token!r}")
    _warm_up()
    tables = [_one_table(args, w, r) for w, r in shapes]
    summary = {
        "ratio": min(t["ratio"] for t in tables),
        "max_auc_diff": max(t["max_auc_diff"] for t in tables),
        "max_auc_diff_exact": max(t["max_auc_diff_exact"] for t in tables),
        "tables": tables,
    }
    if not args.json:
        for t in tables:
            print(
                f"  {t['table']}: naive {t['naive_s']}s, fast {t['fast_s']}s, ratio {t['ratio']}, "
                f"max |dAUC| {t['max_auc_diff']}, same choice {t['same_choice']}"
            )
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
