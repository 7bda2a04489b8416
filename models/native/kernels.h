/* The entry points of dpsynth's C kernels, one shared library built from gswgan_critic.c,
 * generator_batchnorm.c and logistic_selection.c (models/native/kernels.py binds them with ctypes: its
 * argtypes must match these declarations). Each source includes this header, so a definition that drifts
 * from its declaration fails to compile. Array layouts and return codes: at each definition. */
#ifndef DPSYNTH_KERNELS_H
#define DPSYNTH_KERNELS_H

#include <stdint.h>

/* GS-WGAN critics (gswgan_critic.c) */
int critic_updates(int64_t n_critics, int64_t steps, int64_t batch, int64_t width, int64_t hidden,
                   const int64_t *index, float *w1, float *b1, float *w2,
                   float *m_w1, float *v_w1, float *m_b1, float *v_b1, float *m_w2, float *v_w2,
                   const float *real, const int64_t *real_rows, int64_t real_k, int64_t real_s,
                   const float *fake, int64_t fake_k, int64_t fake_s,
                   const float *alpha, const int64_t *done_steps,
                   double lr, double beta1, double beta2, double eps, double gp_lambda,
                   float *wasserstein);
int critic_step_grads(int64_t batch, int64_t width, int64_t hidden, const float *w1, const float *b1,
                      const float *w2, const float *rows, const float *alpha, double gp_lambda,
                      float *dw1, float *db1, float *dw2, float *wasserstein);
int critic_input_grads(int64_t n, int64_t width, int64_t hidden, const int64_t *index, const float *w1,
                       const float *b1, const float *w2, const float *x, float *out);

/* The generators' BatchNorm + ReLU in pretraining (generator_batchnorm.c) */
int batchnorm_relu_bf16(int64_t n_networks, int64_t chunks, int64_t batch, int64_t width,
                        const uint16_t *y, const float *gamma, const float *beta, double eps,
                        uint16_t *out, float *last, float *xhat, float *scale_last);

/* Logistic model selection (logistic_selection.c) */
int l1_cd(int64_t d, const double *H, double *u, double *a, double tol, int64_t max_sweeps, int64_t *active,
          int64_t *sweeps_done);
void logistic_margins(int64_t n, int64_t d, const float *Xs, const double *w, double *m);
void logistic_gradient(int64_t n, int64_t d, const float *Xs, const double *m, const double *e, double *r,
                       double *g);
int logistic_hessian(int64_t n, int64_t d, const float *Xs, const double *r, double *H);

#endif
