/* Numeric kernels. Every SIMD kernel has a scalar reference beside it
 * (kernels/scalar.c) that is compiled on every target and tested against it;
 * build_config.h picks the family the target file names. */
#ifndef CB_KERNELS_H
#define CB_KERNELS_H

#include <stdint.h>

#include "build_config.h"
#include "weights.h"

float cb_dot_f32_scalar(const float *a, const float *b, int n);
#if CB_KERNELS_AVX2
float cb_dot_f32_avx2(const float *a, const float *b, int n);
#define cb_dot_f32 cb_dot_f32_avx2
#else
#define cb_dot_f32 cb_dot_f32_scalar
#endif

/* Y[t][r] = W[r] . X[t] for rows [row_begin, row_end) and n_tok tokens.
 * Each weight row is read once for all tokens (they share the read). */
void cb_matmul_rows(const cb_tensor *W, int row_begin, int row_end, const float *X, int x_stride,
                    int n_tok, float *Y, int y_stride);

/* out = x / sqrt(mean(x^2) + eps) * w, in float32 like transformers. */
void cb_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
/* In place, numerically safe (max subtracted). */
void cb_softmax(float *x, int n);
/* silu(gate) * up, into gate. */
void cb_swiglu(float *gate, const float *up, int n);
/* y += a * x */
void cb_axpy(float *y, float a, const float *x, int n);
/* Rotates each head of vec (NeoX / rotate_half layout: pairs i, i + d/2)
 * by the angles of one position: cos/sin hold d/2 values. */
void cb_rope_neox(float *vec, int n_heads, int head_dim, const float *cos_pos, const float *sin_pos);

#endif
