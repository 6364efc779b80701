/* Portable kernels: correct on every target, and the reference the SIMD
 * ones are tested against. */
#include <math.h>
#include <string.h>

#include "kernels.h"

float cb_dot_f32_scalar(const float *a, const float *b, int n) {
    /* Four partial sums: as accurate as a pairwise sum for these sizes, and
     * the compiler can keep them in registers. */
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

float cb_dot_f16_scalar(const cb_half *w, const float *x, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += cb_half_to_float(w[i]) * x[i];
    return s;
}

float cb_dot_bf16_scalar(const uint16_t *w, const float *x, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += cb_bf16_to_float(w[i]) * x[i];
    return s;
}

float cb_dot_q8_0_scalar(const cb_block_q8_0 *w, const cb_block_q8_0 *x, int n) {
    float s = 0;
    for (int b = 0; b < n / CB_QK; b++) {
        int sum = 0;
        for (int j = 0; j < CB_QK; j++) sum += w[b].qs[j] * x[b].qs[j];
        s += (float)sum * (cb_half_to_float(w[b].d) * cb_half_to_float(x[b].d));
    }
    return s;
}

float cb_dot_q4_0_scalar(const cb_block_q4_0 *w, const cb_block_q8_0 *x, int n) {
    float s = 0;
    for (int b = 0; b < n / CB_QK; b++) {
        int sum = 0;
        for (int j = 0; j < CB_QK / 2; j++) {
            sum += ((w[b].qs[j] & 0xF) - 8) * x[b].qs[j];
            sum += ((w[b].qs[j] >> 4) - 8) * x[b].qs[j + CB_QK / 2];
        }
        s += (float)sum * (cb_half_to_float(w[b].d) * cb_half_to_float(x[b].d));
    }
    return s;
}

/* a * b + c as the SIMD kernels compute it: one fused multiply-add where
 * the target has FMA (every SIMD target: the same bits as their kernels);
 * without it (x86-64, x86-64-v2: old and small CPUs), a multiply and an add,
 * since libm's fmaf is a software routine there (even the library call into
 * the FMA instruction costs 3 ns here against 1 for a multiply and add);
 * such a build's x4 results and exponentials differ from the others' in the
 * last bits. */
static inline float madd(float a, float b, float c) {
#if defined(__FMA__) || defined(__aarch64__) || defined(__ARM_FEATURE_FMA)
    return fmaf(a, b, c);
#else
    return a * b + c;
#endif
}

/* The x4 arithmetic every SIMD target's x4 kernels reproduce bit for bit
 * (kernels/avx2.c): per row and block the exact integer sum of the block's
 * 32 products, scaled by d_w * d_x into one accumulator with a fused
 * multiply-add (madd), blocks in order. One float step a row and block, so
 * that a prompt kernel can hold sixteen rows' sums in one vector (dword r:
 * row r) and scale them with one fma. In an x4 group (dims.h) row i's
 * elements 0..15 and 16..31 are at 8 + 16i and 72 + 16i (q8_0), or the low
 * and high nibbles of the 16 bytes at 8 + 16i (q4_0). */
static inline __attribute__((always_inline)) void dot4_x4(const uint8_t *g, const cb_block_q8_0 *x, int n,
                                                          float out[4], int q4) {
    const size_t block = q4 ? sizeof(cb_block_q4_0) : sizeof(cb_block_q8_0);
    for (int i = 0; i < 4; i++) {
        float acc = 0;
        for (int b = 0; b < n / CB_QK; b++) {
            const uint8_t *blk = g + (size_t)b * 4 * block;
            /* typed int8_t: GCC 12's AVX-512 VNNI vectoriser gets a uint8_t
             * cast to int8_t wrong (measured) */
            const int8_t *lo = (const int8_t *)blk + 8 + 16 * i, *hi = lo + 64;
            const uint8_t *nibbles = blk + 8 + 16 * i;
            const int8_t *xq = x[b].qs;
            int32_t sum = 0;
            for (int e = 0; e < 16; e++) {
                const int w_lo = q4 ? (nibbles[e] & 0xF) - 8 : lo[e], w_hi = q4 ? (nibbles[e] >> 4) - 8 : hi[e];
                sum += w_lo * xq[e] + w_hi * xq[e + 16];
            }
            cb_half dw;
            memcpy(&dw, blk + 2 * i, sizeof dw);
            acc = madd(cb_half_to_float(dw) * cb_half_to_float(x[b].d), (float)sum, acc);
        }
        out[i] = acc;
    }
}

void cb_dot4_q8_0x4_scalar(const void *group, const cb_block_q8_0 *x, int n, float out[4]) {
    dot4_x4(group, x, n, out, 0);
}

void cb_dot4_q4_0x4_scalar(const void *group, const cb_block_q8_0 *x, int n, float out[4]) {
    dot4_x4(group, x, n, out, 1);
}

void cb_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    /* double: the sum of squares of a 4096-wide row loses bits in float.
     * Eight sums (element i in sum i % 8), added in one fixed order: no
     * chain of dependent adds, which took 2.7-3.3% of a prefill's samples,
     * and the same bits on every target (a float's square is exact in a
     * double, so a fused multiply-add rounds as a multiply and an add). */
    double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) part[j] += (double)x[i + j] * x[i + j];
    for (int j = 0; i < n; i++, j++) part[j] += (double)x[i] * x[i];
    const double ss = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
    float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    /* Eight at a time through a copy: out is often x, which made gcc's
     * alias check take its one-at-a-time loop. */
    for (i = 0; i + 8 <= n; i += 8) {
        float t[8];
        for (int j = 0; j < 8; j++) t[j] = (x[i + j] * scale) * w[i + j];
        memcpy(out + i, t, sizeof t);
    }
    for (; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

/* e^x, the engine's own: x = k ln2 + r (|r| <= ln2 / 2, ln2 in two parts),
 * e^r from its Taylor series to r^7 (the next term is below float rounding
 * there) by Horner's rule, times 2^k put in the exponent bits. x is clamped
 * to [CB_EXP_MIN, CB_EXP_MAX], where 2^k stays a normal float. Each step is
 * one float operation that the SIMD kernels repeat (avx2.c exp8), so every
 * target with FMA gets the same bits, unlike libm's expf, whose last bits
 * are each C library's own (glibc, MinGW, macOS), and which is a call per
 * element. Under 2 ulp from e^x (kernel-check measures it). Not inlined,
 * so that no compiler fuses its last multiply into a caller's add (1 + e^-g;
 * GCC's default -ffp-contract=fast may), which the SIMD kernels do not. */
__attribute__((noinline)) float cb_expf(float x) {
    if (x != x) return x;
    x = x < CB_EXP_MIN ? CB_EXP_MIN : x > CB_EXP_MAX ? CB_EXP_MAX : x;
    const float k = rintf(x * CB_LOG2E);
    float r = madd(-k, CB_LN2_HI, x);
    r = madd(-k, CB_LN2_LO, r);
    float p = CB_EXP_C7;
    p = madd(p, r, CB_EXP_C6);
    p = madd(p, r, CB_EXP_C5);
    p = madd(p, r, CB_EXP_C4);
    p = madd(p, r, CB_EXP_C3);
    p = madd(p, r, CB_EXP_C2);
    p = madd(p, r, 1.0f);
    p = madd(p, r, 1.0f);
    const uint32_t bits = (uint32_t)((int32_t)k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

void cb_exp_shifted_scalar(float *x, int n, float shift, float scale) {
    for (int i = 0; i < n; i++) x[i] = cb_expf((x[i] - shift) * scale);
}

/* In place, max subtracted. The sum runs in eight interleaved partial sums
 * (element i into sum i % 8), joined as ((0+1)+(2+3))+((4+5)+(6+7)): the
 * order a vector of eight lanes takes, so SIMD softmax gives these bits. */
void cb_softmax_scalar(float *x, int n) {
    float max = x[0];
    for (int i = 1; i < n; i++) max = x[i] > max ? x[i] : max;
    float s[8] = {0};
    for (int i = 0; i < n; i++) {
        x[i] = cb_expf(x[i] - max);
        s[i % 8] += x[i];
    }
    const float sum = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    const float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void cb_swiglu_scalar(float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) {
        const float g = gate[i];
        gate[i] = g / (1.0f + cb_expf(-g)) * up[i];
    }
}

void cb_attn_scores_scalar(const float *q, const float *k, size_t stride, int n, int hd, float scale, float *scores) {
    for (int p = 0; p < n; p++) scores[p] = cb_dot_f32_scalar(q, k + (size_t)p * stride, hd) * scale;
}

void cb_attn_mix_scalar(float *out, const float *w, const float *v, size_t stride, int n, int hd) {
    for (int j = 0; j < hd; j++) out[j] = 0;
    for (int p = 0; p < n; p++)
        for (int j = 0; j < hd; j++) out[j] += w[p] * v[(size_t)p * stride + j]; /* contracted to an FMA where there is one */
}

void cb_attn_scores_f16_scalar(const float *q, const cb_half *k, size_t stride, int n, int hd, float scale, float *scores) {
    for (int p = 0; p < n; p++) scores[p] = cb_dot_f16_scalar(k + (size_t)p * stride, q, hd) * scale;
}

static float round_to_half(float x) { return cb_half_to_float(cb_float_to_half(x)); }

void cb_round_to_half(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = round_to_half(x[i]);
}

void cb_attn_online_f16_scalar(float *acc, const float *w, const cb_half *v, size_t stride, int n, int hd) {
    for (int p = 0; p < n; p++, v += stride) {
        const float wp = w[p];
        if (signbit(wp))
            for (int j = 0; j < hd; j++) acc[j] = round_to_half(round_to_half(acc[j] * -wp) + cb_half_to_float(v[j]));
        else
            for (int j = 0; j < hd; j++) acc[j] = round_to_half(fmaf(cb_half_to_float(v[j]), wp, acc[j]));
    }
}

void cb_attn_online4_f16_scalar(float *acc, size_t acc_stride, const float *w, size_t w_stride, const cb_half *v,
                                size_t stride, int n, int hd) {
    for (int j = 0; j < 4; j++) cb_attn_online_f16_scalar(acc + j * acc_stride, w + j * w_stride, v, stride, n, hd);
}

void cb_attn_mix_f16_scalar(float *out, const float *w, const cb_half *v, size_t stride, int n, int hd) {
    for (int j = 0; j < hd; j++) out[j] = 0;
    for (int p = 0; p < n; p++)
        for (int j = 0; j < hd; j++) out[j] += w[p] * cb_half_to_float(v[(size_t)p * stride + j]);
}

/* Four queries one at a time (rows q_stride / s_stride / w_stride /
 * out_stride apart), query i over n + i positions (stair: a prompt chunk)
 * or all over n (a GQA group): what the four-query SIMD kernels compute, and
 * their fallback for head sizes they do not vectorise. */
void cb_attn_scores4_scalar(const float *q, size_t q_stride, const float *k, size_t stride, int n, int hd, float scale,
                            float *scores, size_t s_stride, int stair) {
    for (int i = 0; i < CB_ATTN_BLOCK; i++)
        cb_attn_scores_scalar(q + i * q_stride, k, stride, n + stair * i, hd, scale, scores + i * s_stride);
}

void cb_attn_scores4_f16_scalar(const float *q, size_t q_stride, const cb_half *k, size_t stride, int n, int hd,
                                float scale, float *scores, size_t s_stride, int stair) {
    for (int i = 0; i < CB_ATTN_BLOCK; i++)
        cb_attn_scores_f16_scalar(q + i * q_stride, k, stride, n + stair * i, hd, scale, scores + i * s_stride);
}

void cb_attn_mix4_scalar(float *out, size_t out_stride, const float *w, size_t w_stride, const float *v, size_t stride,
                         int n, int hd) {
    for (int i = 0; i < CB_ATTN_BLOCK; i++) cb_attn_mix_scalar(out + i * out_stride, w + i * w_stride, v, stride, n + i, hd);
}

void cb_attn_mix4_f16_scalar(float *out, size_t out_stride, const float *w, size_t w_stride, const cb_half *v,
                             size_t stride, int n, int hd) {
    for (int i = 0; i < CB_ATTN_BLOCK; i++)
        cb_attn_mix_f16_scalar(out + i * out_stride, w + i * w_stride, v, stride, n + i, hd);
}

/* Four queries over the same n positions (a run's chunk of a long prompt):
 * the one-query mix for each, what cb_attn_mix4_same's SIMD forms compute. */
void cb_attn_mix4_same_scalar(float *out, size_t out_stride, const float *w, size_t w_stride, const float *v,
                              size_t stride, int n, int hd) {
    for (int i = 0; i < CB_ATTN_BLOCK; i++) cb_attn_mix_scalar(out + i * out_stride, w + i * w_stride, v, stride, n, hd);
}

void cb_attn_mix4_same_f16_scalar(float *out, size_t out_stride, const float *w, size_t w_stride, const cb_half *v,
                                  size_t stride, int n, int hd) {
    for (int i = 0; i < CB_ATTN_BLOCK; i++)
        cb_attn_mix_f16_scalar(out + i * out_stride, w + i * w_stride, v, stride, n, hd);
}

void cb_f32_to_f16_scalar(const float *x, cb_half *y, int n) {
    for (int i = 0; i < n; i++) y[i] = cb_float_to_half(x[i]);
}

void cb_axpy_scalar(float *y, float a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

void cb_rope_neox(float *vec, int n_heads, int head_dim, const float *cos_pos, const float *sin_pos) {
    const int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = vec + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * cos_pos[i] - b * sin_pos[i];
            v[i + half] = b * cos_pos[i] + a * sin_pos[i];
        }
    }
}
