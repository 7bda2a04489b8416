/* WGAN-GP critic updates for critics without BatchNorm, fused into one call (dpsynth).
 *
 * Each critic is Linear(d, H) -> LeakyReLU(0.2) -> Linear(H, 1). For every critic k and every step s,
 * in order, this computes the gradients of
 *     mean D(fake) - mean D(real) + lambda * mean_i (||grad_x D(x_hat_i)|| - 1)^2,
 *     x_hat_i = alpha_i real_i + (1 - alpha_i) fake_i,
 * for w1, b1 and w2 (b2 takes no gradient: it cancels in the loss) with the same formulas as
 * models/networks.py CriticStack.loss_grads_rows, then applies torch.optim.Adam's update (its fused
 * kernel's formulas). One call replaces about 30 tensor operations per step, which at these sizes
 * cost more in dispatch than in arithmetic; the arithmetic runs on 16-float vectors along the hidden
 * units (GCC/Clang vector extensions), so H must be a multiple of 16.
 *
 * Layouts (float32, contiguous, row-major): w1 [K][d][H], b1 [K][H], w2 [K][H] and their Adam moments
 * alike; rows [K][S][2B][d] (per step B real rows, then B fake rows); alpha [K][S][B];
 * done_steps [K]: Adam steps already taken per critic (step s uses done_steps[k] + s + 1).
 * wasserstein (may be NULL): per critic, mean D(real) - mean D(fake) at its last step, before the update.
 * Returns 0, or 1 when scratch memory cannot be had, 2 when H is not a multiple of 16.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* unaligned 16-lane vectors that may alias float/int32 data (as the x86 intrinsics' own types) */
typedef float vf __attribute__((vector_size(64), aligned(4), may_alias));
typedef int32_t vi __attribute__((vector_size(64), aligned(4), may_alias));
#define LANES 16
#define SLOPE 0.2f

static inline vf splat(float x) { return (vf){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
static inline vf load(const float *p) { return *(const vf *)p; }
static inline void store(float *p, vf v) { *(vf *)p = v; }
/* where h > 0: a, else b (LeakyReLU's derivative picks) */
static inline vf pick(vf h, vf a, vf b) {
    vi m = h > splat(0.0f);
    return (vf)(((vi)a & m) | ((vi)b & ~m));
}
/* torch.lerp: start + w (end - start) for |w| < 0.5, else end - (end - start)(1 - w) */
static inline vf lerp_v(vf start, vf end, float w) {
    vf diff = end - start;
    return fabsf(w) < 0.5f ? start + splat(w) * diff : end - diff * splat(1.0f - w);
}
static inline float lerp_f(float start, float end, float w) {
    float diff = end - start;
    return fabsf(w) < 0.5f ? start + w * diff : end - diff * (1.0f - w);
}

/* torch's fused Adam on n values at step t (1-based): no weight decay, no amsgrad */
static void adam_update(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                        int64_t n, int64_t t, double lr, double beta1, double beta2, double eps) {
    const double bc1 = 1.0 - pow(beta1, (double)t);
    const double bc2 = 1.0 - pow(beta2, (double)t);
    const float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    const float w1 = (float)(1.0 - beta1), b2 = (float)beta2, w2 = (float)(1.0 - beta2), fe = (float)eps;
    /* exp_avg.lerp_(grad, 1 - beta1), with the branch of torch.lerp's formula taken once */
    const int small = fabsf(w1) < 0.5f;
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i], diff = gi - m[i];
        float mi = small ? m[i] + w1 * diff : gi - diff * (1.0f - w1);
        float vv = v[i] * b2 + gi * gi * w2;
        m[i] = mi;
        v[i] = vv;
        p[i] -= step_size * mi / (sqrtf(vv) / bc2_sqrt + fe);
    }
}

typedef struct {
    float *h, *sv, *hx, *u, *w1t, *q, *xe, *dw1, *db1, *dw2, *s_real, *s_fake, *a_real, *a_fake;
} Scratch;

/* The register tile of the largest products: for 8 rows r and 32 hidden units from V,
 *     a0[r] (units 0-15), a1[r] (units 16-31) = sum over k < n, in order, of S[k s_red + r s_row] V[k H + .]
 * Two vector loads and eight broadcasts feed 16 multiply-adds; the 16 accumulators stay in registers. */
static inline void tile_8x32(const float *S, int64_t s_red, int64_t s_row, const float *V, int64_t n, int64_t H,
                             vf a0[8], vf a1[8]) {
    for (int r = 0; r < 8; r++) a0[r] = a1[r] = splat(0.0f);
    for (int64_t k = 0; k < n; k++) {
        const vf v0 = load(V + k * H), v1 = load(V + k * H + LANES);
        for (int r = 0; r < 8; r++) {
            const vf x = splat(S[k * s_red + r * s_row]);
            a0[r] += x * v0;
            a1[r] += x * v1;
        }
    }
}

/* One row's first-layer output: h = acc + b1, S w2, and the running sums over real / fake rows. */
static inline void first_layer_out(vf acc, int64_t i, int64_t jb, int64_t B, int64_t H, const float *W2,
                                   const float *B1, Scratch *s) {
    const vf w2 = load(W2 + jb), w2s = w2 * splat(SLOPE), b1 = load(B1 + jb);
    vf hv = acc + b1;
    vf svv = pick(hv, w2, w2s);
    store(s->h + i * H + jb, hv);
    store(s->sv + i * H + jb, svv);
    float *ss = i < B ? s->s_real : s->s_fake, *as = i < B ? s->a_real : s->a_fake;
    store(ss + jb, load(ss + jb) + svv);
    store(as + jb, load(as + jb) + pick(hv, hv, hv * splat(SLOPE)));
}

/* dw1 for up to 4 input columns from c0 and the 16 hidden units from jb (q^T u + (e x)^T (S w2)). */
static inline void dw1_tile(int64_t c0, int64_t cols, int64_t jb, int64_t B, int64_t R, int64_t D, int64_t DP,
                            int64_t H, const float *q, const float *u, const float *xe, const float *sv,
                            float *dw1) {
    vf acc[4] = {0}, acc2[4] = {0};   /* the two sums apart, as the tensor code adds them */
    if (cols == 4) {   /* constant trip counts keep the accumulators in registers */
        for (int64_t i = 0; i < B; i++) {
            vf uv = load(u + i * H + jb);
            for (int r = 0; r < 4; r++) acc[r] += splat(q[i * DP + c0 + r]) * uv;
        }
        for (int64_t i = 0; i < R; i++) {
            vf svv = load(sv + i * H + jb);
            for (int r = 0; r < 4; r++) acc2[r] += splat(xe[i * D + c0 + r]) * svv;
        }
    } else {
        for (int64_t r = 0; r < cols; r++) {
            for (int64_t i = 0; i < B; i++) acc[r] += splat(q[i * DP + c0 + r]) * load(u + i * H + jb);
            for (int64_t i = 0; i < R; i++) acc2[r] += splat(xe[i * D + c0 + r]) * load(sv + i * H + jb);
        }
    }
    for (int64_t r = 0; r < cols; r++) store(dw1 + (c0 + r) * H + jb, acc[r] + acc2[r]);
}

/* db1 and dw2 of the 16 hidden units from jb, given the rows' sum for dw2; adds this block's part of the
 * Wasserstein estimate (a_diff . w2) to *w, lane by lane (callers go in block order). db1 and the Wasserstein
 * part of dw2 come from separate sums over fake and real rows, as autograd takes them, so that a
 * gradient that is exactly zero (same active units in both batches) stays zero. */
static inline void dw2_out(vf acc, int64_t jb, float inv_b, const float *W2, Scratch *s, float *w) {
    const vf ib = splat(inv_b);
    store(s->db1 + jb, (load(s->s_fake + jb) - load(s->s_real + jb)) * ib);
    const vf a_diff = (load(s->a_fake + jb) - load(s->a_real + jb)) * ib;
    store(s->dw2 + jb, acc + a_diff);
    const vf prod = a_diff * load(W2 + jb);
    for (int l = 0; l < LANES; l++) *w += prod[l];
}

/* One step's gradients for one critic into s->dw1, s->db1, s->dw2; returns the Wasserstein estimate. */
static float critic_grads(const float *W1, const float *B1, const float *W2, const float *X, const float *A,
                          int64_t B, int64_t D, int64_t H, float c, Scratch *s) {
    const int64_t R = 2 * B, DP = (D + LANES - 1) / LANES * LANES;
    const float inv_b = 1.0f / (float)B;
    float *h = s->h, *sv = s->sv, *hx = s->hx, *u = s->u, *q = s->q, *xe = s->xe, *dw1 = s->dw1;

    /* first layer on the real and fake rows; with it S w2 (d D / d h) per row and, separately over the
       real and the fake rows, the sums of S w2 and of LeakyReLU(h). Register tiles of 8 rows x 32 hidden
       units (16 accumulators: two W1 loads and eight broadcasts feed 16 multiply-adds); the rest in tiles
       of 4 rows x 16. Every sum runs over the input columns in order, and the per-row sums over the rows
       in order, whatever the tile. */
    memset(s->s_real, 0, sizeof(float) * 4 * (size_t)H);   /* s_real, s_fake, a_real, a_fake: adjacent */
    for (int64_t i0 = 0; i0 < R; i0 += 8) {
        const int64_t rows8 = R - i0 < 8 ? R - i0 : 8;
        int64_t jb = 0;
        if (rows8 == 8) {
            for (; jb + 2 * LANES <= H; jb += 2 * LANES) {
                vf a0[8], a1[8];
                tile_8x32(X + i0 * D, 1, D, W1 + jb, D, H, a0, a1);
                for (int r = 0; r < 8; r++) first_layer_out(a0[r], i0 + r, jb, B, H, W2, B1, s);
                for (int r = 0; r < 8; r++) first_layer_out(a1[r], i0 + r, jb + LANES, B, H, W2, B1, s);
            }
        }
        for (; jb < H; jb += LANES) {
            for (int64_t g0 = i0; g0 < i0 + rows8; g0 += 4) {
                const int64_t rows = i0 + rows8 - g0 < 4 ? i0 + rows8 - g0 : 4;
                vf acc[4] = {0};
                if (rows == 4) {   /* constant trip counts keep the accumulators in registers */
                    for (int64_t cc = 0; cc < D; cc++) {
                        vf w = load(W1 + cc * H + jb);
                        for (int r = 0; r < 4; r++) acc[r] += splat(X[(g0 + r) * D + cc]) * w;
                    }
                } else {
                    for (int64_t r = 0; r < rows; r++)
                        for (int64_t cc = 0; cc < D; cc++) acc[r] += splat(X[(g0 + r) * D + cc]) * load(W1 + cc * H + jb);
                }
                for (int64_t r = 0; r < rows; r++) first_layer_out(acc[r], g0 + r, jb, B, H, W2, B1, s);
            }
        }
    }
    /* the first layer is affine: at x_hat it interpolates its values at real and fake (hx); u = S w2 there */
    for (int64_t i = 0; i < B; i++) {
        for (int64_t jb = 0; jb < H; jb += LANES) {
            vf v = lerp_v(load(h + (B + i) * H + jb), load(h + i * H + jb), A[i]);
            const vf w2 = load(W2 + jb);
            store(hx + i * H + jb, v);
            store(u + i * H + jb, pick(v, w2, w2 * splat(SLOPE)));
        }
    }
    /* g = u W1^T (grad of D at x_hat), via W1^T padded to DP columns; d GP / d g = c (g - g / ||g||) */
    for (int64_t j = 0; j < H; j++) {
        for (int64_t cc = 0; cc < D; cc++) s->w1t[j * DP + cc] = W1[cc * H + j];
        for (int64_t cc = D; cc < DP; cc++) s->w1t[j * DP + cc] = 0.0f;
    }
    for (int64_t i0 = 0; i0 < B; i0 += 4) {
        const int64_t rows = B - i0 < 4 ? B - i0 : 4;
        int64_t db = 0;
        if (rows == 4) {
            /* tiles of 4 rows x 32 columns: four W1^T loads and eight broadcasts feed 16 multiply-adds; the
               same two chains (even and odd j) per row and column as the 4 x 16 tiles below */
            for (; db + 2 * LANES <= DP; db += 2 * LANES) {
                vf a[4][2] = {{0}}, b[4][2] = {{0}};
                for (int64_t j = 0; j < H; j += 2) {
                    const float *wj = s->w1t + j * DP + db, *wk = s->w1t + (j + 1) * DP + db;
                    const vf wa0 = load(wj), wb0 = load(wk), wa1 = load(wj + LANES), wb1 = load(wk + LANES);
                    for (int r = 0; r < 4; r++) {
                        const vf xa = splat(u[(i0 + r) * H + j]), xb = splat(u[(i0 + r) * H + j + 1]);
                        a[r][0] += xa * wa0;
                        a[r][1] += xb * wb0;
                        b[r][0] += xa * wa1;
                        b[r][1] += xb * wb1;
                    }
                }
                for (int r = 0; r < 4; r++) {
                    store(q + (i0 + r) * DP + db, a[r][0] + a[r][1]);
                    store(q + (i0 + r) * DP + db + LANES, b[r][0] + b[r][1]);
                }
            }
        }
        for (; db < DP; db += LANES) {
            /* independent accumulators (4 rows x 2 halves of j) so that the sums do not wait on each other */
            vf acc[4][2] = {{0}};
            if (rows == 4) {
                for (int64_t j = 0; j < H; j += 2) {
                    vf wa = load(s->w1t + j * DP + db), wb = load(s->w1t + (j + 1) * DP + db);
                    for (int r = 0; r < 4; r++) {
                        acc[r][0] += splat(u[(i0 + r) * H + j]) * wa;
                        acc[r][1] += splat(u[(i0 + r) * H + j + 1]) * wb;
                    }
                }
            } else {
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t j = 0; j < H; j++) acc[r][0] += splat(u[(i0 + r) * H + j]) * load(s->w1t + j * DP + db);
            }
            for (int64_t r = 0; r < rows; r++) store(q + (i0 + r) * DP + db, acc[r][0] + acc[r][1]);
        }
        for (int64_t i = i0; i < i0 + rows; i++) {
            float *qi = q + i * DP;
            float sq = 0.0f;
            for (int64_t cc = 0; cc < D; cc++) sq += qi[cc] * qi[cc];
            float norm = sqrtf(sq);
            if (norm < 1e-30f) norm = 1e-30f;
            for (int64_t cc = 0; cc < D; cc++) qi[cc] = qi[cc] * c + (-c) * (qi[cc] / norm);
        }
    }
    /* loss weights of the rows: -1/B real, +1/B fake */
    for (int64_t i = 0; i < R; i++) {
        const float e = i < B ? -inv_b : inv_b;
        for (int64_t cc = 0; cc < D; cc++) xe[i * D + cc] = X[i * D + cc] * e;
    }
    /* dw1 = q^T u + (e x)^T (S w2): register tiles of 8 input columns x 32 hidden units, the first sum
       parked in dw1 while the second is formed, then added (the same two sums and the same final
       addition as the 4 x 16 tiles that take the rest) */
    int64_t c0 = 0;
    for (; c0 + 8 <= D; c0 += 8) {
        int64_t jb = 0;
        for (; jb + 2 * LANES <= H; jb += 2 * LANES) {
            vf a0[8], a1[8];
            tile_8x32(q + c0, DP, 1, u + jb, B, H, a0, a1);
            for (int r = 0; r < 8; r++) {
                store(dw1 + (c0 + r) * H + jb, a0[r]);
                store(dw1 + (c0 + r) * H + jb + LANES, a1[r]);
            }
            tile_8x32(xe + c0, D, 1, sv + jb, R, H, a0, a1);
            for (int r = 0; r < 8; r++) {
                store(dw1 + (c0 + r) * H + jb, load(dw1 + (c0 + r) * H + jb) + a0[r]);
                store(dw1 + (c0 + r) * H + jb + LANES, load(dw1 + (c0 + r) * H + jb + LANES) + a1[r]);
            }
        }
        for (; jb < H; jb += LANES) {
            dw1_tile(c0, 4, jb, B, R, D, DP, H, q, u, xe, sv, dw1);
            dw1_tile(c0 + 4, 4, jb, B, R, D, DP, H, q, u, xe, sv, dw1);
        }
    }
    for (; c0 < D; c0 += 4) {
        const int64_t cols = D - c0 < 4 ? D - c0 : 4;
        for (int64_t jb = 0; jb < H; jb += LANES) dw1_tile(c0, cols, jb, B, R, D, DP, H, q, u, xe, sv, dw1);
    }
    /* db1 and the Wasserstein part of dw2 from separate sums over fake and real rows, as autograd takes
       them, so that a gradient that is exactly zero (same active units in both batches) stays zero */
    float w = 0.0f;
    int64_t jb = 0;
    /* dw2 = sum_i LeakyReLU'(hx_i) (q W1)_i + a_diff: tiles of 4 rows x 32 hidden units, the rest 4 x 16;
       per unit the rows' terms are added in row order either way */
    for (; jb + 2 * LANES <= H && B % 4 == 0; jb += 2 * LANES) {
        vf acc0 = splat(0.0f), acc1 = splat(0.0f);
        for (int64_t i = 0; i < B; i += 4) {
            vf q0[4] = {0}, q1[4] = {0};
            for (int64_t cc = 0; cc < D; cc++) {
                const vf w0 = load(W1 + cc * H + jb), w1 = load(W1 + cc * H + jb + LANES);
                for (int r = 0; r < 4; r++) {
                    const vf x = splat(q[(i + r) * DP + cc]);
                    q0[r] += x * w0;
                    q1[r] += x * w1;
                }
            }
            for (int r = 0; r < 4; r++) {
                acc0 += pick(load(hx + (i + r) * H + jb), q0[r], q0[r] * splat(SLOPE));
                acc1 += pick(load(hx + (i + r) * H + jb + LANES), q1[r], q1[r] * splat(SLOPE));
            }
        }
        dw2_out(acc0, jb, inv_b, W2, s, &w);
        dw2_out(acc1, jb + LANES, inv_b, W2, s, &w);
    }
    for (; jb < H; jb += LANES) {
        vf acc = splat(0.0f);
        int64_t i = 0;
        for (; i + 4 <= B; i += 4) {
            vf qv[4] = {0};
            for (int64_t cc = 0; cc < D; cc++) {
                vf wv = load(W1 + cc * H + jb);
                for (int r = 0; r < 4; r++) qv[r] += splat(q[(i + r) * DP + cc]) * wv;
            }
            for (int r = 0; r < 4; r++) acc += pick(load(hx + (i + r) * H + jb), qv[r], qv[r] * splat(SLOPE));
        }
        for (; i < B; i++) {
            vf qv = splat(0.0f);
            for (int64_t cc = 0; cc < D; cc++) qv += splat(q[i * DP + cc]) * load(W1 + cc * H + jb);
            acc += pick(load(hx + i * H + jb), qv, qv * splat(SLOPE));
        }
        dw2_out(acc, jb, inv_b, W2, s, &w);
    }
    return -w;
}

int critic_updates(int64_t n_critics, int64_t steps, int64_t batch, int64_t width, int64_t hidden,
                   const int64_t *index, float *w1, float *b1, float *w2,
                   float *m_w1, float *v_w1, float *m_b1, float *v_b1, float *m_w2, float *v_w2,
                   const float *rows, const float *alpha, const int64_t *done_steps,
                   double lr, double beta1, double beta2, double eps, double gp_lambda,
                   float *wasserstein) {
    const int64_t B = batch, D = width, H = hidden, R = 2 * batch;
    const int64_t DP = (D + LANES - 1) / LANES * LANES;
    if (H % LANES != 0) return 2;
    size_t sizes[14] = {R * H, R * H, B * H, B * H, H * DP, B * DP, R * D, D * H, H, H, H, H, H, H};
    size_t total = 0;
    for (int i = 0; i < 14; i++) total += sizes[i];
    float *buf = (float *)calloc(total, sizeof(float));
    if (buf == NULL) return 1;
    float **slots[14];
    Scratch s;
    slots[0] = &s.h; slots[1] = &s.sv; slots[2] = &s.hx; slots[3] = &s.u; slots[4] = &s.w1t; slots[5] = &s.q;
    slots[6] = &s.xe; slots[7] = &s.dw1; slots[8] = &s.db1; slots[9] = &s.dw2; slots[10] = &s.s_real;
    slots[11] = &s.s_fake; slots[12] = &s.a_real; slots[13] = &s.a_fake;
    float *at = buf;
    for (int i = 0; i < 14; i++) { *slots[i] = at; at += sizes[i]; }
    const float c = (float)(2.0 * gp_lambda / (double)B);

    for (int64_t k = 0; k < n_critics; k++) {
        /* Critic k of this call is critic index[k] of the stack (its parameters and Adam moments); its
         * rows, alpha and step count are the k-th of this call's. NULL index: the first n_critics. */
        const int64_t at_k = index != NULL ? index[k] : k;
        float *W1 = w1 + at_k * D * H, *B1 = b1 + at_k * H, *W2 = w2 + at_k * H;
        for (int64_t st = 0; st < steps; st++) {
            const float *X = rows + (k * steps + st) * R * D;
            const float *A = alpha + (k * steps + st) * B;
            float w = critic_grads(W1, B1, W2, X, A, B, D, H, c, &s);
            if (wasserstein != NULL && st == steps - 1) wasserstein[k] = w;
            const int64_t t = done_steps[k] + st + 1;
            adam_update(W1, s.dw1, m_w1 + at_k * D * H, v_w1 + at_k * D * H, D * H, t, lr, beta1, beta2, eps);
            adam_update(B1, s.db1, m_b1 + at_k * H, v_b1 + at_k * H, H, t, lr, beta1, beta2, eps);
            adam_update(W2, s.dw2, m_w2 + at_k * H, v_w2 + at_k * H, H, t, lr, beta1, beta2, eps);
        }
    }
    free(buf);
    return 0;
}

/* One step's gradients of one critic (no update), for the tests: dw1 [d][H], db1 [H], dw2 [H] receive
 * the gradients; returns the Wasserstein estimate through *wasserstein. Codes as critic_updates. */
int critic_step_grads(int64_t batch, int64_t width, int64_t hidden, const float *w1, const float *b1,
                      const float *w2, const float *rows, const float *alpha, double gp_lambda,
                      float *dw1, float *db1, float *dw2, float *wasserstein) {
    const int64_t B = batch, D = width, H = hidden, R = 2 * batch;
    const int64_t DP = (D + LANES - 1) / LANES * LANES;
    if (H % LANES != 0) return 2;
    float *buf = (float *)calloc((size_t)(2 * R * H + 2 * B * H + H * DP + B * DP + R * D + 4 * H), sizeof(float));
    if (buf == NULL) return 1;
    Scratch s;
    s.h = buf; s.sv = s.h + R * H; s.hx = s.sv + R * H; s.u = s.hx + B * H; s.w1t = s.u + B * H;
    s.q = s.w1t + H * DP; s.xe = s.q + B * DP; s.s_real = s.xe + R * D; s.s_fake = s.s_real + H;
    s.a_real = s.s_fake + H; s.a_fake = s.a_real + H;
    s.dw1 = dw1; s.db1 = db1; s.dw2 = dw2;
    *wasserstein = critic_grads(w1, b1, w2, rows, alpha, B, D, H, (float)(2.0 * gp_lambda / (double)B), &s);
    free(buf);
    return 0;
}

/* ---------------------------------------------------------------------------------------------------
 * BatchNorm (training mode) + ReLU of the pretraining generators' bfloat16 products.
 *
 * y [K][C][B][W] (bfloat16 bits): C chunks of B rows per network, each chunk normalised over its B
 * rows with its own statistics (float32), then gamma, beta [K][W] and ReLU:
 *   out [K][C][B][W] (bfloat16, rounded to nearest even)   = ReLU(beta + (y - mean) rstd gamma);
 * for the last chunk, which the backward pass reads, also in float32:
 *   last [K][B][W] = the same ReLU output, xhat [K][B][W] = (y - mean) rstd, scale [K][W] = rstd gamma.
 * The formulas of models/networks.py GeneratorStack.forward_train (mean = sum / B, var = sum of squares
 * of the centred values times 1/B, rstd = 1 / sqrt(var + eps)) in one pass over cache-resident data
 * instead of six passes of mixed-precision tensor operations.
 * --------------------------------------------------------------------------------------------------- */
static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (f != f) return 0x7FC0;   /* NaN, as torch rounds it */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

int batchnorm_relu_bf16(int64_t n_networks, int64_t chunks, int64_t batch, int64_t width,
                        const uint16_t *y, const float *gamma, const float *beta, double eps,
                        uint16_t *out, float *last, float *xhat, float *scale_last) {
    const int64_t B = batch, W = width;
    float *buf = (float *)malloc(sizeof(float) * (size_t)(3 * W));
    if (buf == NULL) return 1;
    float *mean = buf, *acc = buf + W, *scale = buf + 2 * W;
    const float inv_b = 1.0f / (float)B, fe = (float)eps;
    for (int64_t k = 0; k < n_networks; k++) {
        const float *g = gamma + k * W, *bt = beta + k * W;
        for (int64_t c = 0; c < chunks; c++) {
            const uint16_t *yc = y + ((k * chunks + c) * B) * W;
            uint16_t *oc = out + ((k * chunks + c) * B) * W;
            #pragma omp simd
            for (int64_t j = 0; j < W; j++) acc[j] = 0.0f;
            for (int64_t i = 0; i < B; i++) {
                #pragma omp simd
                for (int64_t j = 0; j < W; j++) acc[j] += bf16_to_f32(yc[i * W + j]);
            }
            #pragma omp simd
            for (int64_t j = 0; j < W; j++) { mean[j] = acc[j] / (float)B; acc[j] = 0.0f; }
            for (int64_t i = 0; i < B; i++) {
                #pragma omp simd
                for (int64_t j = 0; j < W; j++) {
                    const float d = bf16_to_f32(yc[i * W + j]) - mean[j];
                    acc[j] += d * d;
                }
            }
            #pragma omp simd
            for (int64_t j = 0; j < W; j++) {
                acc[j] = 1.0f / sqrtf(acc[j] * inv_b + fe);   /* rstd */
                scale[j] = acc[j] * g[j];
            }
            const int is_last = c == chunks - 1;
            for (int64_t i = 0; i < B; i++) {
                #pragma omp simd
                for (int64_t j = 0; j < W; j++) {
                    const float d = bf16_to_f32(yc[i * W + j]) - mean[j];
                    float v = bt[j] + d * scale[j];
                    v = v > 0.0f ? v : 0.0f;
                    oc[i * W + j] = f32_to_bf16(v);
                }
                if (is_last) {
                    float *lr = last + (k * B + i) * W, *xr = xhat + (k * B + i) * W;
                    #pragma omp simd
                    for (int64_t j = 0; j < W; j++) {
                        const float d = bf16_to_f32(yc[i * W + j]) - mean[j];
                        const float v = bt[j] + d * scale[j];
                        lr[j] = v > 0.0f ? v : 0.0f;
                        xr[j] = d * acc[j];
                    }
                }
            }
            if (is_last) memcpy(scale_last + k * W, scale, sizeof(float) * (size_t)W);
        }
    }
    free(buf);
    return 0;
}

/* Coordinate descent for the l1 sub-problem of logistic model selection (models/selection.py _l1_cd):
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
