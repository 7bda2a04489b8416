/* Logistic-regression model selection's inner loops (dpsynth, models/evaluation/selection/): coordinate
 * descent on the l1 sub-problem of proximal Newton (l1_cd), and the passes over the data of each Newton
 * step (logistic_margins, logistic_gradient; logistic_hessian for narrow tables). Everything in float64
 * except the rows, which are float32 and exact.
 */
#include <math.h>
#include <stdint.h>

#include "kernels.h"

/* Coordinate descent for the l1 sub-problem of logistic model selection (models/evaluation/selection/
 * l1_subproblem.py l1_coordinate_descent):
 *     min_u  a0.(u - w) + 0.5 (u - w)' H (u - w) + ||u||_1
 * on a dense d x d problem (d = encoded width + 1), float64. `u` holds the start and receives the result;
 * `a` holds the gradient of the smooth part at `u` (g + H (u - w)) and is kept in step with it. Each sweep
 * visits the active coordinates in order (first sweep: all; then the nonzero ones and the violators of the
 * last check), soft-thresholds each and updates `a` with its row of H; after each sweep the minimum-norm
 * subgradient is checked over all coordinates. Stops when it is at most `tol` (returns 1) or after
 * `max_sweeps` sweeps (returns 0). The same formulas and order as the Python reference, in C: at a width
 * of 128 one sweep is 17,000 multiply-adds, which the Python loop spent about a millisecond on.
 * sweeps_done receives the number of sweeps; active is scratch of d int64. */
int l1_cd(int64_t d, const double *restrict H, double *restrict u, double *restrict a, double tol,
          int64_t max_sweeps, int64_t *restrict active, int64_t *restrict sweeps_done) {
    int64_t n_active = d;
    for (int64_t j = 0; j < d; j++) active[j] = j;
    int64_t sweeps = 0;
    int converged = 0;
    while (sweeps < max_sweeps) {
        sweeps++;
        for (int64_t t = 0; t < n_active; t++) {
            const int64_t j = active[t];
            const double h = H[j * d + j];
            const double uj = u[j];
            const double z = uj - a[j] / h, thr = 1.0 / h;
            const double next = z > thr ? z - thr : (z < -thr ? z + thr : 0.0);
            const double delta = next - uj;
            if (delta != 0.0) {
                u[j] = next;
                const double *restrict Hj = H + j * d;
                for (int64_t k = 0; k < d; k++) a[k] += delta * Hj[k];
            }
        }
        double worst = 0.0;
        n_active = 0;
        for (int64_t j = 0; j < d; j++) {
            const double uj = u[j], aj = a[j];
            const double v = uj > 0.0 ? fabs(aj + 1.0) : (uj < 0.0 ? fabs(aj - 1.0) : fabs(aj) - 1.0);
            if (v > worst) worst = v;
            if (uj != 0.0 || v > tol) active[n_active++] = j;
        }
        if (worst <= tol) { converged = 1; break; }
    }
    *sweeps_done = sweeps;
    return converged;
}

/* Products of logistic model selection with the rows s_i x_i kept in float32 (the encoded features are
 * float32, s_i = +-1, so nothing is rounded) and everything else in float64: the two passes over the data
 * in each Newton step read half the bytes of a float64 copy, and at 10,000 rows or more they are bound by
 * memory. Xs [d][n]: column-major rows, i.e. one contiguous column after another.
 *   margins:   m_i = sum_j Xs[j][i] w_j
 *   gradient:  g_j = -sum_i r_i Xs[j][i]      (the log-loss gradient, r = sigmoid(-m))
 * Blocks of ROW_BLOCK rows keep the block's margins (or r) in L1 while every column streams past, and the
 * column loops are plain vector loops at any width. Sums run in a fixed order. */
#define ROW_BLOCK 512

void logistic_margins(int64_t n, int64_t d, const float *restrict Xs, const double *restrict w,
                      double *restrict m) {
    for (int64_t i0 = 0; i0 < n; i0 += ROW_BLOCK) {
        const int64_t len = n - i0 < ROW_BLOCK ? n - i0 : ROW_BLOCK;
        double *restrict mb = m + i0;
        for (int64_t i = 0; i < len; i++) mb[i] = 0.0;
        int64_t j = 0;
        for (; j + 4 <= d; j += 4) {   /* four columns per pass over the block's margins */
            const float *restrict c0 = Xs + j * n + i0, *restrict c1 = c0 + n, *restrict c2 = c1 + n,
                        *restrict c3 = c2 + n;
            const double w0 = w[j], w1 = w[j + 1], w2 = w[j + 2], w3 = w[j + 3];
            #pragma omp simd
            for (int64_t i = 0; i < len; i++)
                mb[i] += ((double)c0[i] * w0 + (double)c1[i] * w1) + ((double)c2[i] * w2 + (double)c3[i] * w3);
        }
        for (; j < d; j++) {
            const float *restrict col = Xs + j * n + i0;
            const double wj = w[j];
            #pragma omp simd
            for (int64_t i = 0; i < len; i++) mb[i] += (double)col[i] * wj;
        }
    }
}

/* r_i = sigmoid(-m_i) from e_i = exp(-|m_i|) (numpy's vector exp made e), written to r, and with it the
 * gradient g_j = -sum_i r_i Xs[j][i]; four columns per pass, each its own chain of sums. */
void logistic_gradient(int64_t n, int64_t d, const float *restrict Xs, const double *restrict m,
                       const double *restrict e, double *restrict r, double *restrict g) {
    for (int64_t i = 0; i < n; i++) r[i] = (m[i] >= 0.0 ? e[i] : 1.0) / (1.0 + e[i]);
    for (int64_t j = 0; j < d; j++) g[j] = 0.0;
    for (int64_t i0 = 0; i0 < n; i0 += ROW_BLOCK) {
        const int64_t len = n - i0 < ROW_BLOCK ? n - i0 : ROW_BLOCK;
        const double *restrict rb = r + i0;
        int64_t j = 0;
        for (; j + 4 <= d; j += 4) {
            const float *restrict c0 = Xs + j * n + i0, *restrict c1 = c0 + n, *restrict c2 = c1 + n,
                        *restrict c3 = c2 + n;
            double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
            #pragma omp simd reduction(+:a0, a1, a2, a3)
            for (int64_t i = 0; i < len; i++) {
                a0 += rb[i] * (double)c0[i];
                a1 += rb[i] * (double)c1[i];
                a2 += rb[i] * (double)c2[i];
                a3 += rb[i] * (double)c3[i];
            }
            g[j] -= a0; g[j + 1] -= a1; g[j + 2] -= a2; g[j + 3] -= a3;
        }
        for (; j < d; j++) {
            const float *restrict col = Xs + j * n + i0;
            double acc = 0.0;
            #pragma omp simd reduction(+:acc)
            for (int64_t i = 0; i < len; i++) acc += rb[i] * (double)col[i];
            g[j] -= acc;
        }
    }
}

/* The unscaled Hessian of the log-loss, H = sum_i r_i (1 - r_i) x_i x_i^T (upper triangle, float64), for
 * narrow tables (d <= HESSIAN_MAX_D): numpy's route (weights, a weighted float32 copy, a BLAS product)
 * costs several passes more there. Per block of HESSIAN_BLOCK rows the columns are widened to float64
 * once, and the weighted ones once; then two weighted columns meet four plain ones at a time.
 * H [d][d] row-major, only j <= k written. Returns 2 when d is too large. */
#define HESSIAN_BLOCK 128
#define HESSIAN_MAX_D 64

int logistic_hessian(int64_t n, int64_t d, const float *restrict Xs, const double *restrict r,
                     double *restrict H) {
    if (d > HESSIAN_MAX_D) return 2;
    double x[HESSIAN_MAX_D][HESSIAN_BLOCK], v[HESSIAN_MAX_D][HESSIAN_BLOCK];
    for (int64_t j = 0; j < d * d; j++) H[j] = 0.0;
    for (int64_t i0 = 0; i0 < n; i0 += HESSIAN_BLOCK) {
        const int64_t len = n - i0 < HESSIAN_BLOCK ? n - i0 : HESSIAN_BLOCK;
        double wt[HESSIAN_BLOCK];
        for (int64_t i = 0; i < len; i++) wt[i] = r[i0 + i] * (1.0 - r[i0 + i]);
        for (int64_t j = 0; j < d; j++) {
            const float *restrict cj = Xs + j * n + i0;
            #pragma omp simd
            for (int64_t i = 0; i < len; i++) {
                x[j][i] = (double)cj[i];
                v[j][i] = wt[i] * x[j][i];
            }
        }
        for (int64_t j = 0; j < d; j++) {
            const double *restrict vj = v[j];
            int64_t k = j;
            for (; k + 4 <= d; k += 4) {
                const double *restrict x0 = x[k], *restrict x1 = x[k + 1], *restrict x2 = x[k + 2],
                             *restrict x3 = x[k + 3];
                double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
                #pragma omp simd reduction(+:a0, a1, a2, a3)
                for (int64_t i = 0; i < len; i++) {
                    a0 += vj[i] * x0[i];
                    a1 += vj[i] * x1[i];
                    a2 += vj[i] * x2[i];
                    a3 += vj[i] * x3[i];
                }
                H[j * d + k] += a0; H[j * d + k + 1] += a1; H[j * d + k + 2] += a2; H[j * d + k + 3] += a3;
            }
            for (; k < d; k++) {
                const double *restrict xk = x[k];
                double acc = 0.0;
                #pragma omp simd reduction(+:acc)
                for (int64_t i = 0; i < len; i++) acc += vj[i] * xk[i];
                H[j * d + k] += acc;
            }
        }
    }
    return 0;
}
