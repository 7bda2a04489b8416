"""The quadratic sub-problem of proximal Newton for the l1 penalty,

    min_u  g.(u - w) + 0.5 (u - w)' H (u - w) + ||u||_1,

on the explicit d x d Hessian instead of on the data: coordinate descent (the C loop of
models/native/logistic_selection.c, or the Python reference), with steps on the face of a settled sign
pattern that cross the near-flat directions coordinate descent creeps along.
"""

from __future__ import annotations

import numpy as np

from dpsynth.models.native import kernels as native_kernels

# l1: sweeps of the C coordinate descent between two face steps on a settled sign pattern
FACE_STEP_EVERY = 8


def l1_optimality(g: np.ndarray, w: np.ndarray) -> float:
    """Infinity norm of the minimum-norm subgradient of ||w||_1 + (smooth part with gradient g)."""
    v = np.where(w > 0, g + 1.0, np.where(w < 0, g - 1.0, np.maximum(np.abs(g) - 1.0, 0.0)))
    return float(np.max(np.abs(v)))


def _polish(
    H: list[list[float]], a: list[float], u: list[float], support: list[int], tol: float
) -> tuple[np.ndarray, np.ndarray] | None:
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
    if l1_optimality(a_new, u_new) > tol:
        return None
    return u_new, a_new


def l1_coordinate_descent(
    H: np.ndarray, g: np.ndarray, w: np.ndarray, tol: float, max_sweeps: int, stats: dict, native: bool | None = None
) -> np.ndarray:
    """Coordinate descent for  min_u g.(u - w) + 0.5 (u - w)' H (u - w) + ||u||_1  on a d x d problem, from
    u = w. Stops when the minimum-norm subgradient of the sub-problem is below `tol` (infinity norm).

    native: the C loop (models/native/logistic_selection.c `l1_cd`) or the Python one; None takes the C
    loop where it builds. Both sweep in the same order; once the sign pattern settles, the C loop takes face steps
    (`_face_step`) every `FACE_STEP_EVERY` sweeps, the Python loop tries the exact solve (`_polish`) after
    every sweep.
    """
    if native is None:
        native = native_kernels.available()
    if native:
        return _coordinate_descent_native(H, g, w, tol, max_sweeps, stats)
    u = _coordinate_descent_python(H.tolist(), g.tolist(), w.tolist(), w.tolist(), tol, max_sweeps, stats)
    return np.array(u)


def _face_step(
    H: np.ndarray, a: np.ndarray, u: np.ndarray, support: np.ndarray
) -> tuple[np.ndarray, np.ndarray, bool] | None:
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


def _coordinate_descent_native(
    H: np.ndarray, g: np.ndarray, w: np.ndarray, tol: float, max_sweeps: int, stats: dict
) -> np.ndarray:
    """C coordinate descent in chunks of `FACE_STEP_EVERY` sweeps; between chunks, once the support has
    settled, a step on the face of the current sign pattern (`_face_step`)."""
    H = np.ascontiguousarray(H, dtype=np.float64)
    u = np.array(w, dtype=np.float64)
    a = np.array(g, dtype=np.float64)  # u = w: the gradient of the smooth part is g
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
                if reached and l1_optimality(a, u) <= tol:
                    break
                support = np.flatnonzero(u)
        prev_support = support
    stats["sweeps"] = stats.get("sweeps", 0) + sweeps
    return u


def _coordinate_descent_python(
    H: list[list[float]], g: list[float], w: list[float], u: list[float], tol: float, max_sweeps: int, stats: dict
) -> list[float]:
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
