/* BatchNorm (training mode) + ReLU of the GS-WGAN pretraining generators' bfloat16 products (dpsynth).
 *
 * y [K][C][B][W] (bfloat16 bits): C chunks of B rows per network, each chunk normalised over its B
 * rows with its own statistics (float32), then gamma, beta [K][W] and ReLU:
 *   out [K][C][B][W] (bfloat16, rounded to nearest even)   = ReLU(beta + (y - mean) rstd gamma);
 * for the last chunk, which the backward pass reads, also in float32:
 *   last [K][B][W] = the same ReLU output, xhat [K][B][W] = (y - mean) rstd, scale [K][W] = rstd gamma.
 * The formulas of models/generators/networks.py GeneratorStack.forward_train (mean = sum / B, var = sum of squares
 * of the centred values times 1/B, rstd = 1 / sqrt(var + eps)) in one pass over cache-resident data
 * instead of six passes of mixed-precision tensor operations. Returns 0, or 1 when scratch memory cannot
 * be had.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

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
