"""The data of one logistic fit and the passes over it that the solver needs: margins, log-loss,
gradient and Hessian, in numpy or (where they build) the C kernels of models/native/."""

from __future__ import annotations

import numpy as np

from dpsynth.models.native import kernels as native_kernels

# up to this many columns (intercept included) the native Hessian is a C loop, beyond it a BLAS product
NARROW = 32


class LogisticProblem:
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

    def reference_scale(self, C: float) -> float:
        """Reference size of the gradient: the largest |gradient of C L| at w = 0 (the optimality scale).
        Computed once per problem (threads that share the problem need it made before they start)."""
        if self._g0 is None:
            self._g0 = float(np.max(np.abs(0.5 * np.sum(self.Xs, axis=0, dtype=np.float64))))
        return C * self._g0
