/* GS-WGAN's critics on CPU (dpsynth): r WGAN-GP updates with Adam of K critics without BatchNorm, fused
 * into one call (critic_updates; critic_step_grads, one step's gradients, for the tests), and training's
 * query of each generated row's gradient through its drawn critic (critic_input_grads).
 *
 * Each critic is Linear(d, H) -> LeakyReLU(0.2) -> Linear(H, 1). For every critic k and every step s,
 * in order, critic_updates computes the gradients of
 *     mean D(fake) - mean D(real) + lambda * mean_i (||grad_x D(x_hat_i)|| - 1)^2,
 *     x_hat_i = alpha_i real_i + (1 - alpha_i) fake_i,
 * for w1, b1 and w2 (b2 takes no gradient: it cancels in the loss) with the formulas of
 * models/generators/networks.py CriticStack.loss_grads_rows (w2's gradient-penalty part regrouped to reuse a product
 * of w1's, see critic_grads), then applies torch.optim.Adam's update (its fused kernel's formulas). One
 * call replaces about 30 tensor operations per step, which at these sizes cost more in dispatch than in
 * arithmetic; the arithmetic runs on 16-float vectors along the hidden units (GCC/Clang vector
 * extensions), so H must be a multiple of 16.
 *
 * Layouts (float32, contiguous, row-major): w1 [K][d][H], b1 [K][H], w2 [K][H] and their Adam moments
 * alike; each step's B real and B fake rows are read where they lie (see critic_updates); alpha [K][S][B];
 * done_steps [K]: Adam steps already taken per critic (step s uses done_steps[k] + s + 1).
 * wasserstein (may be NULL): per critic, mean D(real) - mean D(fake) at its last step, before the update.
 * Returns 0, or 1 when scratch memory cannot be had, 2 when H is not a multiple of 16.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "kernels.h"

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

/* torch's fused Adam on n values at step t (1-based): no weight decay, no amsgrad. The moments are
 * torch's to the bit; the step m / (sqrt(v) / sqrt(bc2) + eps) is formed with a reciprocal square root and
 * a reciprocal, each refined by one Newton step (a few ulp of the step, bounded against torch's in the
 * tests), because the exact square root and division cost a quarter of an update at 128 columns. */
static void adam_update(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                        int64_t n, int64_t t, double lr, double beta1, double beta2, double eps) {
    const double bc1 = 1.0 - pow(beta1, (double)t);
    const double bc2 = 1.0 - pow(beta2, (double)t);
    const float step_size = (float)(lr / bc1), inv_bc2_sqrt = (float)(1.0 / sqrt(bc2));
    const float w1 = (float)(1.0 - beta1), b2 = (float)beta2, w2 = (float)(1.0 - beta2), fe = (float)eps;
    /* exp_avg.lerp_(grad, 1 - beta1), with the branch of torch.lerp's formula taken once */
    const int small = fabsf(w1) < 0.5f;
    int64_t i = 0;
#ifdef __AVX512F__
    for (; i + LANES <= n; i += LANES) {
        const __m512 gi = _mm512_loadu_ps(g + i), mo = _mm512_loadu_ps(m + i);
        const __m512 diff = _mm512_sub_ps(gi, mo);
        const __m512 mi = small ? _mm512_add_ps(mo, _mm512_mul_ps(_mm512_set1_ps(w1), diff))
                                : _mm512_sub_ps(gi, _mm512_mul_ps(diff, _mm512_set1_ps(1.0f - w1)));
        /* v b2 + (g g) w2, rounded as the scalar expression is (no fused multiply-add) */
        const __m512 vv = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), _mm512_set1_ps(b2)),
                                        _mm512_mul_ps(_mm512_mul_ps(gi, gi), _mm512_set1_ps(w2)));
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vv);
        /* sqrt(v) = v / sqrt(v); below the smallest normal float it is far below eps and taken as 0 */
        __m512 rs = _mm512_rsqrt14_ps(vv);
        rs = _mm512_mul_ps(rs, _mm512_fnmadd_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), vv), _mm512_mul_ps(rs, rs),
                                                 _mm512_set1_ps(1.5f)));
        const __mmask16 normal = _mm512_cmp_ps_mask(vv, _mm512_set1_ps(1.17549435e-38f), _CMP_GE_OQ);
        const __m512 root = _mm512_maskz_mul_ps(normal, vv, rs);
        const __m512 denom = _mm512_add_ps(_mm512_mul_ps(root, _mm512_set1_ps(inv_bc2_sqrt)), _mm512_set1_ps(fe));
        __m512 rc = _mm512_rcp14_ps(denom);
        rc = _mm512_mul_ps(rc, _mm512_fnmadd_ps(denom, rc, _mm512_set1_ps(2.0f)));
        const __m512 pi = _mm512_loadu_ps(p + i);
        _mm512_storeu_ps(p + i, _mm512_sub_ps(pi, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(step_size), mi), rc)));
    }
#endif
    for (; i < n; i++) {
        float gi = g[i], diff = gi - m[i];
        float mi = small ? m[i] + w1 * diff : gi - diff * (1.0f - w1);
        float vv = v[i] * b2 + gi * gi * w2;
        m[i] = mi;
        v[i] = vv;
        p[i] -= step_size * mi / (sqrtf(vv) * inv_bc2_sqrt + fe);
    }
}

typedef struct {
    float *h, *sv, *u, *shx, *ut, *q, *xe, *m2, *dw1, *db1, *dw2, *s_real, *s_fake, *a_real, *a_fake;
    const float **x;   /* the step's 2B row pointers: B real, then B fake */
} Scratch;

/* The register tile of the largest products: for 8 rows r and 32 hidden units from V,
 *     a0[r] (units 0-15), a1[r] (units 16-31) = sum over k < n, in order, of S[k s_red + r s_row] V[k H + .]
 * Two vector loads and eight broadcasts feed 16 multiply-adds; the 16 accumulators stay in registers. */
static inline void tile_8x32(const float *S, int64_t s_red, int64_t s_row, const float *V, int64_t n, int64_t H,
                             vf a0[8], vf a1[8]) {
    for (int r = 0; r < 8; r++) a0[r] = a1[r] = splat(0.0f);
    for (int64_t k = 0; k < n; k++) {
        const vf v0 = load(V + k * H), v1 = load(V + k * H + LANES);   /* H: V's row stride */
        for (int r = 0; r < 8; r++) {
            const vf x = splat(S[k * s_red + r * s_row]);
            a0[r] += x * v0;
            a1[r] += x * v1;
        }
    }
}

/* The same tile with its 8 rows given by pointers (the rows are read where they lie: a gathered batch of
 * real rows and the shared fake rows need no copy into one block). */
static inline void tile_8x32_rows(const float *const *X, const float *V, int64_t n, int64_t H, vf a0[8], vf a1[8]) {
    const float *x0 = X[0], *x1 = X[1], *x2 = X[2], *x3 = X[3], *x4 = X[4], *x5 = X[5], *x6 = X[6], *x7 = X[7];
    for (int r = 0; r < 8; r++) a0[r] = a1[r] = splat(0.0f);
    for (int64_t k = 0; k < n; k++) {
        const vf v0 = load(V + k * H), v1 = load(V + k * H + LANES);
        const float xs[8] = {x0[k], x1[k], x2[k], x3[k], x4[k], x5[k], x6[k], x7[k]};
        for (int r = 0; r < 8; r++) {
            const vf x = splat(xs[r]);
            a0[r] += x * v0;
            a1[r] += x * v1;
        }
    }
}

/* First-layer outputs of the n rows from i0 for the 16 hidden units from jb (acc: their products): h =
 * acc + b1, S w2, and the running sums over the real / the fake rows of S w2 and of LeakyReLU(h), added
 * in row order in registers (one load and store of a sum per run of rows on one side, not a store and a
 * reload per row). */
static inline void first_layer_rows(const vf *acc, int64_t i0, int64_t n, int64_t jb, int64_t B, int64_t H,
                                    const float *W2, const float *B1, Scratch *s) {
    const vf w2 = load(W2 + jb), w2s = w2 * splat(SLOPE), b1 = load(B1 + jb);
    int64_t i = i0;
    while (i < i0 + n) {
        const int64_t end = i < B && i0 + n > B ? B : i0 + n;
        float *ss = i < B ? s->s_real : s->s_fake, *as = i < B ? s->a_real : s->a_fake;
        vf sum_s = load(ss + jb), sum_a = load(as + jb);
        for (; i < end; i++) {
            const vf hv = acc[i - i0] + b1, svv = pick(hv, w2, w2s);
            store(s->h + i * H + jb, hv);
            store(s->sv + i * H + jb, svv);
            sum_s += svv;
            sum_a += pick(hv, hv, hv * splat(SLOPE));
        }
        store(ss + jb, sum_s);
        store(as + jb, sum_a);
    }
}

/* dw1 for up to 4 input columns from c0 and the 16 hidden units from jb ((q^T S') w2 + (e x)^T (S w2)),
 * adding W1 (q^T S') of these columns to m2 (dw2's gradient-penalty part). */
static inline void dw1_tile(int64_t c0, int64_t cols, int64_t jb, int64_t B, int64_t R, int64_t D, int64_t BP,
                            int64_t H, const float *qt, const float *shx, const float *xe, const float *sv,
                            const float *W1, const float *W2, float *m2, float *dw1) {
    vf acc[4] = {0}, acc2[4] = {0};   /* the two sums apart, as the tensor code adds them */
    if (cols == 4) {   /* constant trip counts keep the accumulators in registers */
        for (int64_t i = 0; i < B; i++) {
            vf uv = load(shx + i * H + jb);
            for (int r = 0; r < 4; r++) acc[r] += splat(qt[(c0 + r) * BP + i]) * uv;
        }
        for (int64_t i = 0; i < R; i++) {
            vf svv = load(sv + i * H + jb);
            for (int r = 0; r < 4; r++) acc2[r] += splat(xe[i * D + c0 + r]) * svv;
        }
    } else {
        for (int64_t r = 0; r < cols; r++) {
            for (int64_t i = 0; i < B; i++) acc[r] += splat(qt[(c0 + r) * BP + i]) * load(shx + i * H + jb);
            for (int64_t i = 0; i < R; i++) acc2[r] += splat(xe[i * D + c0 + r]) * load(sv + i * H + jb);
        }
    }
    const vf w2 = load(W2 + jb);
    vf m = load(m2 + jb);
    for (int64_t r = 0; r < cols; r++) {
        m += load(W1 + (c0 + r) * H + jb) * acc[r];
        store(dw1 + (c0 + r) * H + jb, acc[r] * w2 + acc2[r]);
    }
    store(m2 + jb, m);
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

#ifdef __AVX512F__
/* 16 x 16 transpose in registers: rows in[c] (16 floats) -> out[j] = column j */
static inline void transpose16(const __m512 in[16], __m512 out[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {   /* pairs of rows: interleave single floats */
        t[i] = _mm512_unpacklo_ps(in[i], in[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(in[i], in[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {   /* quads: interleave pairs */
        u[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        u[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        u[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        u[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    /* u[4g + m] holds, in each 128-bit lane L, column 4L + m of rows 4g..4g+3; gather the lanes */
    for (int m = 0; m < 4; m++) {
        const __m512 a = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x88);        /* lanes 0,2 of g0 | of g1 */
        const __m512 b = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x88);
        const __m512 c = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xDD);        /* lanes 1,3 */
        const __m512 d = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xDD);
        out[m] = _mm512_shuffle_f32x4(a, b, 0x88);        /* lane 0 of every group: column m */
        out[8 + m] = _mm512_shuffle_f32x4(a, b, 0xDD);    /* lane 2: column 8 + m */
        out[4 + m] = _mm512_shuffle_f32x4(c, d, 0x88);    /* lane 1: column 4 + m */
        out[12 + m] = _mm512_shuffle_f32x4(c, d, 0xDD);   /* lane 3: column 12 + m */
    }
}
#endif

/* u [B][H] -> u^T [H][BP] (rows B..BP of u taken as zero), in 16 x 16 blocks. */
static void transpose_u(const float *u, int64_t B, int64_t BP, int64_t H, float *ut) {
    for (int64_t i0 = 0; i0 < BP; i0 += LANES) {
        const int64_t rows = B - i0 < LANES ? B - i0 : LANES;
        for (int64_t j0 = 0; j0 < H; j0 += LANES) {
#ifdef __AVX512F__
            __m512 in[16], out[16];
            for (int64_t i = 0; i < rows; i++) in[i] = _mm512_loadu_ps(u + (i0 + i) * H + j0);
            for (int64_t i = rows; i < LANES; i++) in[i] = _mm512_setzero_ps();
            transpose16(in, out);
            for (int64_t j = 0; j < LANES; j++) _mm512_storeu_ps(ut + (j0 + j) * BP + i0, out[j]);
#else
            for (int64_t j = 0; j < LANES; j++) {
                for (int64_t i = 0; i < rows; i++) ut[(j0 + j) * BP + i0 + i] = u[(i0 + i) * H + j0 + j];
                for (int64_t i = rows; i < LANES; i++) ut[(j0 + j) * BP + i0 + i] = 0.0f;
            }
#endif
        }
    }
}

/* One step's gradients for one critic into s->dw1, s->db1, s->dw2; returns the Wasserstein estimate.
 * X: the 2B rows (B real, then B fake), by pointer. */
static float critic_grads(const float *W1, const float *B1, const float *W2, const float *const *X, const float *A,
                          int64_t B, int64_t D, int64_t H, float c, Scratch *s) {
    const int64_t R = 2 * B, BP = (B + LANES - 1) / LANES * LANES;
    const float inv_b = 1.0f / (float)B;
    float *h = s->h, *sv = s->sv, *u = s->u, *shx = s->shx, *q = s->q, *xe = s->xe, *dw1 = s->dw1;
    float *m2 = s->m2;

    /* first layer on the real and fake rows; with it S w2 (d D / d h) per row and, separately over the
       real and the fake rows, the sums of S w2 and of LeakyReLU(h). Register tiles of 8 rows x 32 hidden
       units (16 accumulators: two W1 loads and eight broadcasts feed 16 multiply-adds), the hidden units
       outermost so that a 32-unit column block of W1 stays in the first-level cache over all rows; the rest
       in tiles of 4 rows x 16. Every sum runs over the input columns in order, and the per-row sums over the
       rows in order, whatever the tile. */
    memset(s->s_real, 0, sizeof(float) * 4 * (size_t)H);   /* s_real, s_fake, a_real, a_fake: adjacent */
    memset(m2, 0, sizeof(float) * (size_t)H);
    const int64_t R8 = R / 8 * 8;
    int64_t jb = 0;
    for (; jb + 2 * LANES <= H; jb += 2 * LANES) {
        for (int64_t i0 = 0; i0 < R8; i0 += 8) {
            vf a0[8], a1[8];
            tile_8x32_rows(X + i0, W1 + jb, D, H, a0, a1);
            first_layer_rows(a0, i0, 8, jb, B, H, W2, B1, s);
            first_layer_rows(a1, i0, 8, jb + LANES, B, H, W2, B1, s);
        }
        for (int64_t half = 0; half < 2 * LANES && R8 < R; half += LANES) {
            for (int64_t i = R8; i < R; i++) {
                vf acc = splat(0.0f);
                for (int64_t cc = 0; cc < D; cc++) acc += splat(X[i][cc]) * load(W1 + cc * H + jb + half);
                first_layer_rows(&acc, i, 1, jb + half, B, H, W2, B1, s);
            }
        }
    }
    for (; jb < H; jb += LANES) {
        for (int64_t g0 = 0; g0 < R; g0 += 4) {
            const int64_t rows = R - g0 < 4 ? R - g0 : 4;
            vf acc[4] = {0};
            if (rows == 4) {   /* constant trip counts keep the accumulators in registers */
                const float *x0 = X[g0], *x1 = X[g0 + 1], *x2 = X[g0 + 2], *x3 = X[g0 + 3];
                for (int64_t cc = 0; cc < D; cc++) {
                    vf w = load(W1 + cc * H + jb);
                    acc[0] += splat(x0[cc]) * w;
                    acc[1] += splat(x1[cc]) * w;
                    acc[2] += splat(x2[cc]) * w;
                    acc[3] += splat(x3[cc]) * w;
                }
            } else {
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t cc = 0; cc < D; cc++) acc[r] += splat(X[g0 + r][cc]) * load(W1 + cc * H + jb);
            }
            first_layer_rows(acc, g0, rows, jb, B, H, W2, B1, s);
        }
    }
    /* the first layer is affine: at x_hat it interpolates its values at real and fake; there S' is
       LeakyReLU's derivative (shx) and u = S' w2 */
    for (int64_t i = 0; i < B; i++) {
        for (int64_t jb = 0; jb < H; jb += LANES) {
            vf v = lerp_v(load(h + (B + i) * H + jb), load(h + i * H + jb), A[i]);
            const vf w2 = load(W2 + jb), slope = pick(v, splat(1.0f), splat(SLOPE));
            store(shx + i * H + jb, slope);
            store(u + i * H + jb, slope * w2);
        }
    }
    /* g = u W1^T (grad of D at x_hat), kept transposed: qt [D][BP] = W1 u^T, the rows along the vector
       lanes (BP: B padded to a multiple of 16 with zero rows); then d GP / d g = c (g - g / ||g||).
       Register tiles of 8 input columns x 32 rows (eight W1 broadcasts and two u^T loads feed 16
       multiply-adds), the rest 8 x 16 and single columns; each sum runs over the hidden units in order. */
    transpose_u(u, B, BP, H, s->ut);
    int64_t c0 = 0;
    for (; c0 + 8 <= D; c0 += 8) {
        int64_t ib = 0;
        for (; ib + 2 * LANES <= BP; ib += 2 * LANES) {
            vf a0[8], a1[8];
            tile_8x32(W1 + c0 * H, 1, H, s->ut + ib, H, BP, a0, a1);
            for (int r = 0; r < 8; r++) {
                store(q + (c0 + r) * BP + ib, a0[r]);
                store(q + (c0 + r) * BP + ib + LANES, a1[r]);
            }
        }
        for (; ib < BP; ib += LANES) {
            vf acc[8] = {0};
            for (int64_t j = 0; j < H; j++) {
                const vf v = load(s->ut + j * BP + ib);
                for (int r = 0; r < 8; r++) acc[r] += splat(W1[(c0 + r) * H + j]) * v;
            }
            for (int r = 0; r < 8; r++) store(q + (c0 + r) * BP + ib, acc[r]);
        }
    }
    for (; c0 < D; c0++) {
        for (int64_t ib = 0; ib < BP; ib += LANES) {
            vf acc = splat(0.0f);
            for (int64_t j = 0; j < H; j++) acc += splat(W1[c0 * H + j]) * load(s->ut + j * BP + ib);
            store(q + c0 * BP + ib, acc);
        }
    }
    for (int64_t ib = 0; ib < BP; ib += LANES) {   /* each row's norm over the columns in order */
        vf sq = splat(0.0f);
        for (int64_t cc = 0; cc < D; cc++) {
            const vf v = load(q + cc * BP + ib);
            sq += v * v;
        }
        float nrm[LANES];
        for (int l = 0; l < LANES; l++) {
            nrm[l] = sqrtf(sq[l]);
            if (nrm[l] < 1e-30f) nrm[l] = 1e-30f;
        }
        const vf nv = load(nrm), cv = splat(c), ncv = splat(-c);
        for (int64_t cc = 0; cc < D; cc++) {
            const vf v = load(q + cc * BP + ib);
            store(q + cc * BP + ib, v * cv + ncv * (v / nv));
        }
    }
    /* loss weights of the rows: -1/B real, +1/B fake */
    for (int64_t i = 0; i < R; i++) {
        const float e = i < B ? -inv_b : inv_b;
        for (int64_t cc = 0; cc < D; cc++) xe[i * D + cc] = X[i][cc] * e;
    }
    /* dw1 = (q^T S') w2 + (e x)^T (S w2), and dw2's gradient-penalty part sum_i S'_i (W1^T q_i) =
       sum_c W1[c] (q^T S')[c] (m2) from the same product q^T S', so that it costs no product of its own.
       Register tiles of 8 input columns x 32 hidden units, q^T S' parked in dw1 while the second sum is
       formed, then added (the same two sums, the same final addition and the same order of m2's terms as
       the 4 x 16 tiles that take the rest) */
    for (c0 = 0; c0 + 8 <= D; c0 += 8) {
        int64_t jb = 0;
        for (; jb + 2 * LANES <= H; jb += 2 * LANES) {
            vf a0[8], a1[8];
            tile_8x32(q + c0 * BP, 1, BP, shx + jb, B, H, a0, a1);
            const vf w2a = load(W2 + jb), w2b = load(W2 + jb + LANES);
            vf ma = load(m2 + jb), mb = load(m2 + jb + LANES);
            for (int r = 0; r < 8; r++) {
                const float *w1r = W1 + (c0 + r) * H + jb;
                ma += load(w1r) * a0[r];
                mb += load(w1r + LANES) * a1[r];
                store(dw1 + (c0 + r) * H + jb, a0[r] * w2a);
                store(dw1 + (c0 + r) * H + jb + LANES, a1[r] * w2b);
            }
            store(m2 + jb, ma);
            store(m2 + jb + LANES, mb);
            tile_8x32(xe + c0, D, 1, sv + jb, R, H, a0, a1);
            for (int r = 0; r < 8; r++) {
                store(dw1 + (c0 + r) * H + jb, load(dw1 + (c0 + r) * H + jb) + a0[r]);
                store(dw1 + (c0 + r) * H + jb + LANES, load(dw1 + (c0 + r) * H + jb + LANES) + a1[r]);
            }
        }
        for (; jb < H; jb += LANES) {
            dw1_tile(c0, 4, jb, B, R, D, BP, H, q, shx, xe, sv, W1, W2, m2, dw1);
            dw1_tile(c0 + 4, 4, jb, B, R, D, BP, H, q, shx, xe, sv, W1, W2, m2, dw1);
        }
    }
    for (; c0 < D; c0 += 4) {
        const int64_t cols = D - c0 < 4 ? D - c0 : 4;
        for (int64_t jb = 0; jb < H; jb += LANES)
            dw1_tile(c0, cols, jb, B, R, D, BP, H, q, shx, xe, sv, W1, W2, m2, dw1);
    }
    /* db1 and dw2 (m2 + the Wasserstein part, from separate sums over fake and real rows as autograd takes
       them, so that a gradient that is exactly zero (same active units in both batches) stays zero) */
    float w = 0.0f;
    for (int64_t jb = 0; jb < H; jb += LANES) dw2_out(load(m2 + jb), jb, inv_b, W2, s, &w);
    return -w;
}

/* Scratch for critic_grads in one allocation (NULL when memory cannot be had); dw1, db1, dw2 inside it
 * unless `grads` is set. Free with free(s->h). */
static int scratch_alloc(Scratch *s, int64_t B, int64_t D, int64_t H, int own_grads) {
    const int64_t R = 2 * B, BP = (B + LANES - 1) / LANES * LANES;
    size_t sizes[15] = {R * H, R * H, B * H, B * H, H * BP, D * BP, R * D, H, own_grads ? D * H : 0,
                        own_grads ? H : 0, own_grads ? H : 0, H, H, H, H};
    size_t total = 0;
    for (int i = 0; i < 15; i++) total += sizes[i];
    const size_t pointer_floats = ((size_t)R + 1) * sizeof(const float *) / sizeof(float);   /* s->x, aligned */
    float *buf = (float *)calloc(total + pointer_floats, sizeof(float));
    if (buf == NULL) return 1;
    float **slots[15] = {&s->h, &s->sv, &s->u, &s->shx, &s->ut, &s->q, &s->xe, &s->m2, &s->dw1, &s->db1, &s->dw2,
                         &s->s_real, &s->s_fake, &s->a_real, &s->a_fake};
    float *at = buf;
    for (int i = 0; i < 15; i++) { *slots[i] = at; at += sizes[i]; }
    s->x = (const float **)(void *)(((uintptr_t)at + sizeof(float *) - 1) / sizeof(float *) * sizeof(float *));
    return 0;
}

/* Row r of step st of critic k (its position in this call) is read from
 *   real: real_rows != NULL ? real + real_rows[(k S + st) B + r] d : real + (k real_k + st real_s + r) d,
 *   fake: fake + (k fake_k + st fake_s + r) d,
 * so that a gathered batch (training's drawn rows) and fake rows shared by every critic (fake_k = 0) need
 * no copy into one [K][S][2B][d] block; strides are in rows. */
static void step_rows(Scratch *s, int64_t k, int64_t st, int64_t steps, int64_t B, int64_t D, const float *real,
                      const int64_t *real_rows, int64_t real_k, int64_t real_s, const float *fake, int64_t fake_k,
                      int64_t fake_s) {
    for (int64_t r = 0; r < B; r++) {
        const int64_t at_real = real_rows != NULL ? real_rows[(k * steps + st) * B + r] : k * real_k + st * real_s + r;
        s->x[r] = real + at_real * D;
        s->x[B + r] = fake + (k * fake_k + st * fake_s + r) * D;
    }
}

int critic_updates(int64_t n_critics, int64_t steps, int64_t batch, int64_t width, int64_t hidden,
                   const int64_t *index, float *w1, float *b1, float *w2,
                   float *m_w1, float *v_w1, float *m_b1, float *v_b1, float *m_w2, float *v_w2,
                   const float *real, const int64_t *real_rows, int64_t real_k, int64_t real_s,
                   const float *fake, int64_t fake_k, int64_t fake_s,
                   const float *alpha, const int64_t *done_steps,
                   double lr, double beta1, double beta2, double eps, double gp_lambda,
                   float *wasserstein) {
    const int64_t B = batch, D = width, H = hidden;
    if (H % LANES != 0) return 2;
    Scratch s;
    if (scratch_alloc(&s, B, D, H, 1) != 0) return 1;
    const float c = (float)(2.0 * gp_lambda / (double)B);

    for (int64_t k = 0; k < n_critics; k++) {
        /* Critic k of this call is critic index[k] of the stack (its parameters and Adam moments); its
         * rows, alpha and step count are the k-th of this call's. NULL index: the first n_critics. */
        const int64_t at_k = index != NULL ? index[k] : k;
        float *W1 = w1 + at_k * D * H, *B1 = b1 + at_k * H, *W2 = w2 + at_k * H;
        for (int64_t st = 0; st < steps; st++) {
            step_rows(&s, k, st, steps, B, D, real, real_rows, real_k, real_s, fake, fake_k, fake_s);
            /* the next critic's weights and Adam moments lie elsewhere in a large stack: fetch them during
               this critic's last step, into the outer caches */
            if (st == steps - 1 && k + 1 < n_critics) {
                const int64_t at_n = index != NULL ? index[k + 1] : k + 1;
                const float *next[3] = {w1 + at_n * D * H, m_w1 + at_n * D * H, v_w1 + at_n * D * H};
                for (int a = 0; a < 3; a++)
                    for (int64_t at = 0; at < D * H; at += 16) __builtin_prefetch(next[a] + at, 0, 1);
            }
            /* the next step's real rows lie anywhere in the table: fetch them while this step computes */
            if (real_rows != NULL && (st + 1 < steps || k + 1 < n_critics)) {
                const int64_t next = k * steps + st + 1;
                for (int64_t r = 0; r < B; r++) {
                    const char *row = (const char *)(real + real_rows[next * B + r] * D);
                    for (int64_t at = 0; at < D * (int64_t)sizeof(float); at += 64) __builtin_prefetch(row + at, 0, 2);
                }
            }
            const float *A = alpha + (k * steps + st) * B;
            float w = critic_grads(W1, B1, W2, s.x, A, B, D, H, c, &s);
            if (wasserstein != NULL && st == steps - 1) wasserstein[k] = w;
            const int64_t t = done_steps[k] + st + 1;
            adam_update(W1, s.dw1, m_w1 + at_k * D * H, v_w1 + at_k * D * H, D * H, t, lr, beta1, beta2, eps);
            adam_update(B1, s.db1, m_b1 + at_k * H, v_b1 + at_k * H, H, t, lr, beta1, beta2, eps);
            adam_update(W2, s.dw2, m_w2 + at_k * H, v_w2 + at_k * H, H, t, lr, beta1, beta2, eps);
        }
    }
    free(s.h);
    return 0;
}

/* One step's gradients of one critic (no update), for the tests: rows [2B][d] (B real, then B fake);
 * dw1 [d][H], db1 [H], dw2 [H] receive the gradients; returns the Wasserstein estimate through
 * *wasserstein. Codes as critic_updates. */
int critic_step_grads(int64_t batch, int64_t width, int64_t hidden, const float *w1, const float *b1,
                      const float *w2, const float *rows, const float *alpha, double gp_lambda,
                      float *dw1, float *db1, float *dw2, float *wasserstein) {
    const int64_t B = batch, D = width, H = hidden;
    if (H % LANES != 0) return 2;
    Scratch s;
    if (scratch_alloc(&s, B, D, H, 0) != 0) return 1;
    s.dw1 = dw1; s.db1 = db1; s.dw2 = dw2;
    for (int64_t r = 0; r < 2 * B; r++) s.x[r] = rows + r * D;
    *wasserstein = critic_grads(w1, b1, w2, s.x, alpha, B, D, H, (float)(2.0 * gp_lambda / (double)B), &s);
    free(s.h);
    return 0;
}

/* Training's critic query: for each generated row i, the gradient of critic index[i]'s score with
 * respect to that row, grad_i = W1 (LeakyReLU'(x_i W1 + b1) w2) ([d]), written to out [n][d]; the
 * critics are read in place in the stack (w1 [K][d][H], b1 [K][H], w2 [K][H]) instead of gathered
 * copies. The formulas of models/generators/networks.py CriticStack.input_grad. Returns 0, 1 without scratch
 * memory, 2 when H is not a multiple of 16. */
int critic_input_grads(int64_t n, int64_t width, int64_t hidden, const int64_t *index, const float *w1,
                       const float *b1, const float *w2, const float *x, float *out) {
    const int64_t D = width, H = hidden;
    if (H % LANES != 0) return 2;
    float *sv = (float *)malloc(sizeof(float) * (size_t)H);
    if (sv == NULL) return 1;
    for (int64_t i = 0; i < n; i++) {
        const float *W1 = w1 + index[i] * D * H, *B1 = b1 + index[i] * H, *W2 = w2 + index[i] * H;
        const float *xi = x + i * D;
        /* the next row's critic lies elsewhere in a large stack: fetch it while this row computes */
        if (i + 1 < n)
            for (int64_t at = 0; at < D * H; at += LANES) __builtin_prefetch(w1 + index[i + 1] * D * H + at, 0, 1);
        /* h = x W1 + b1, four blocks of hidden units at a time (independent sums keep the multiply-adds
           in flight); each sum over the input columns in order */
        int64_t jb = 0;
        for (; jb + 4 * LANES <= H; jb += 4 * LANES) {
            vf acc[4] = {0};
            for (int64_t cc = 0; cc < D; cc++) {
                const vf xv = splat(xi[cc]);
                for (int a = 0; a < 4; a++) acc[a] += xv * load(W1 + cc * H + jb + a * LANES);
            }
            for (int a = 0; a < 4; a++) {
                const vf h = acc[a] + load(B1 + jb + a * LANES), w2v = load(W2 + jb + a * LANES);
                store(sv + jb + a * LANES, pick(h, w2v, w2v * splat(SLOPE)));
            }
        }
        for (; jb < H; jb += LANES) {
            vf acc = splat(0.0f);
            for (int64_t cc = 0; cc < D; cc++) acc += splat(xi[cc]) * load(W1 + cc * H + jb);
            const vf h = acc + load(B1 + jb), w2v = load(W2 + jb);
            store(sv + jb, pick(h, w2v, w2v * splat(SLOPE)));
        }
        /* grad = W1 (S w2): four input columns at a time, each a sum over the hidden units in blocks */
        int64_t c0 = 0;
        for (; c0 + 4 <= D; c0 += 4) {
            vf acc[4] = {0};
            for (int64_t jb = 0; jb < H; jb += LANES) {
                const vf s = load(sv + jb);
                for (int a = 0; a < 4; a++) acc[a] += s * load(W1 + (c0 + a) * H + jb);
            }
            for (int a = 0; a < 4; a++) {
                float total = 0.0f;
                for (int l = 0; l < LANES; l++) total += acc[a][l];
                out[i * D + c0 + a] = total;
            }
        }
        for (; c0 < D; c0++) {
            vf acc = splat(0.0f);
            for (int64_t jb = 0; jb < H; jb += LANES) acc += load(sv + jb) * load(W1 + c0 * H + jb);
            float total = 0.0f;
            for (int l = 0; l < LANES; l++) total += acc[l];
            out[i * D + c0] = total;
        }
    }
    free(sv);
    return 0;
}
