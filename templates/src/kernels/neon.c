/* NEON kernels (aarch64; also used by the dotprod family): f32 dot, top-k,
 * axpy, attention over the KV cache, exp, softmax and SwiGLU. Reference:
 * kernels/scalar.c. */
#include <arm_neon.h>
#include <math.h>

#include "kernels.h"
#include "topk_simd.h"

float cb_dot_f32_neon(const float *a, const float *b, int n) {
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    float32x4_t acc2 = vdupq_n_f32(0), acc3 = vdupq_n_f32(0);
    int i = 0;
    /* Four independent accumulators hide the FMA latency. */
    for (; i + 16 <= n; i += 16) {
        acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
        acc1 = vfmaq_f32(acc1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        acc2 = vfmaq_f32(acc2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        acc3 = vfmaq_f32(acc3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4) acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc0, acc1), vaddq_f32(acc2, acc3)));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

void cb_topk_neon(const float *values, int n, int k, int32_t *ids) {
    static const int32_t lane_index[4] = {0, 1, 2, 3};
    float pv = INFINITY;
    int pi = -1;
    for (int j = 0; j < k; j++) {
        const float32x4_t prev_v = vdupq_n_f32(pv);
        const int32x4_t prev_i = vdupq_n_s32(pi);
        float32x4_t best_v = vdupq_n_f32(-INFINITY);
        int32x4_t best_i = vdupq_n_s32(-1);
        int32x4_t idx = vld1q_s32(lane_index);
        int i = 0;
        for (; i + 4 <= n; i += 4) {
            float32x4_t v = vld1q_f32(values + i);
            uint32x4_t after = vorrq_u32(vcltq_f32(v, prev_v),
                                         vandq_u32(vceqq_f32(v, prev_v), vcgtq_s32(idx, prev_i)));
            /* Strictly greater: a lane keeps its first (lowest) index on ties. */
            uint32x4_t better = vandq_u32(after, vcgtq_f32(v, best_v));
            best_v = vbslq_f32(better, v, best_v);
            best_i = vbslq_s32(better, idx, best_i);
            idx = vaddq_s32(idx, vdupq_n_s32(4));
        }
        float lane_v[4];
        int32_t lane_i[4];
        vst1q_f32(lane_v, best_v);
        vst1q_s32(lane_i, best_i);
        float bv;
        int bi;
        cb_topk_lanes(lane_v, lane_i, 4, values, i, n, pv, pi, &bv, &bi);
        cb_topk_pick(values, n, bv, bi, &pv, &pi, &ids[j]);
    }
}

/* ---- attention over one head of the cache (float or float16 rows) ---- */

static inline float32x4_t load4(const void *row, int j, int f16) {
    return f16 ? vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)row + j)))
               : vld1q_f32((const float *)row + j);
}

/* q . row over the head (a multiple of 4) in two interleaved partial sums;
 * a position's score does not depend on its neighbours or on n. Positions
 * are independent chains, which the core overlaps; each row is read start
 * to end (the prefetchers' pattern). */
static inline __attribute__((always_inline)) float row_dot(const float *q, const uint8_t *row, int hd, int f16) {
    float32x4_t a = vdupq_n_f32(0), b = vdupq_n_f32(0);
    int j = 0;
    for (; j + 8 <= hd; j += 8) {
        a = vfmaq_f32(a, vld1q_f32(q + j), load4(row, j, f16));
        b = vfmaq_f32(b, vld1q_f32(q + j + 4), load4(row, j + 4, f16));
    }
    if (j < hd) a = vfmaq_f32(a, vld1q_f32(q + j), load4(row, j, f16));
    return vaddvq_f32(vaddq_f32(a, b));
}

static inline __attribute__((always_inline)) void attn_scores(const float *q, const void *k, size_t stride, int n,
                                                              int hd, float scale, float *scores, int f16) {
    const size_t row_bytes = stride * (f16 ? sizeof(cb_half) : sizeof(float));
    for (int p = 0; p < n; p++) scores[p] = row_dot(q, (const uint8_t *)k + (size_t)p * row_bytes, hd, f16) * scale;
}

/* out[j] = sum over p of w[p] v[p][j], per element one FMA chain in p order
 * (the scalar reference's, contracted): 64 columns at a time in sixteen
 * registers (a head of 64: one pass over V), then 16, then 4. */
#define UNROLLED _Pragma("GCC unroll 16") /* the accumulators then live in registers */
#define MIX_COLUMNS(W)                                                                                   \
    for (; j + (W) <= hd; j += (W)) {                                                                    \
        float32x4_t o[(W) / 4];                                                                          \
        UNROLLED for (int c = 0; c < (W) / 4; c++) o[c] = vdupq_n_f32(0);                                \
        for (int p = 0; p < n; p++) {                                                                    \
            const uint8_t *row = (const uint8_t *)v + (size_t)p * row_bytes;                             \
            const float32x4_t wp = vdupq_n_f32(w[p]);                                                    \
            UNROLLED for (int c = 0; c < (W) / 4; c++) o[c] = vfmaq_f32(o[c], wp, load4(row, j + 4 * c, f16)); \
        }                                                                                                \
        UNROLLED for (int c = 0; c < (W) / 4; c++) vst1q_f32(out + j + 4 * c, o[c]);                     \
    }

static inline __attribute__((always_inline)) void attn_mix(float *out, const float *w, const void *v, size_t stride,
                                                           int n, int hd, int f16) {
    const size_t row_bytes = stride * (f16 ? sizeof(cb_half) : sizeof(float));
    int j = 0;
    MIX_COLUMNS(64)
    MIX_COLUMNS(16)
    MIX_COLUMNS(4)
}
#undef MIX_COLUMNS

void cb_attn_scores_neon(const float *q, const float *k, size_t stride, int n, int hd, float scale, float *scores) {
    if (hd % 4) cb_attn_scores_scalar(q, k, stride, n, hd, scale, scores);
    else attn_scores(q, k, stride, n, hd, scale, scores, 0);
}

void cb_attn_mix_neon(float *out, const float *w, const float *v, size_t stride, int n, int hd) {
    if (hd % 4) cb_attn_mix_scalar(out, w, v, stride, n, hd);
    else attn_mix(out, w, v, stride, n, hd, 0);
}

void cb_attn_scores_f16_neon(const float *q, const cb_half *k, size_t stride, int n, int hd, float scale, float *scores) {
    if (hd % 4) cb_attn_scores_f16_scalar(q, k, stride, n, hd, scale, scores);
    else attn_scores(q, k, stride, n, hd, scale, scores, 1);
}

static inline float32x4_t round_to_half4(float32x4_t x) { return vcvt_f32_f16(vcvt_f16_f32(x)); }

/* Columns 16 at a time over all positions: four independent chains. */
void cb_attn_online_f16_neon(float *acc, const float *w, const cb_half *v, size_t stride, int n, int hd) {
    if (hd % 16) {
        cb_attn_online_f16_scalar(acc, w, v, stride, n, hd);
        return;
    }
    for (int j = 0; j < hd; j += 16) {
        float32x4_t a0 = vld1q_f32(acc + j), a1 = vld1q_f32(acc + j + 4);
        float32x4_t a2 = vld1q_f32(acc + j + 8), a3 = vld1q_f32(acc + j + 12);
        const cb_half *row = v + j;
        for (int p = 0; p < n; p++, row += stride) {
            const float16x8_t h0 = vreinterpretq_f16_u16(vld1q_u16(row)), h1 = vreinterpretq_f16_u16(vld1q_u16(row + 8));
            const float32x4_t v0 = vcvt_f32_f16(vget_low_f16(h0)), v1 = vcvt_high_f32_f16(h0);
            const float32x4_t v2 = vcvt_f32_f16(vget_low_f16(h1)), v3 = vcvt_high_f32_f16(h1);
            const float wp = w[p];
            if (signbit(wp)) {
                const float ms = -wp;
                a0 = round_to_half4(vaddq_f32(round_to_half4(vmulq_n_f32(a0, ms)), v0));
                a1 = round_to_half4(vaddq_f32(round_to_half4(vmulq_n_f32(a1, ms)), v1));
                a2 = round_to_half4(vaddq_f32(round_to_half4(vmulq_n_f32(a2, ms)), v2));
                a3 = round_to_half4(vaddq_f32(round_to_half4(vmulq_n_f32(a3, ms)), v3));
            } else {
                const float32x4_t ws = vdupq_n_f32(wp);
                a0 = round_to_half4(vfmaq_f32(a0, v0, ws));
                a1 = round_to_half4(vfmaq_f32(a1, v1, ws));
                a2 = round_to_half4(vfmaq_f32(a2, v2, ws));
                a3 = round_to_half4(vfmaq_f32(a3, v3, ws));
            }
        }
        vst1q_f32(acc + j, a0);
        vst1q_f32(acc + j + 4, a1);
        vst1q_f32(acc + j + 8, a2);
        vst1q_f32(acc + j + 12, a3);
    }
}

/* One query at a time: sixteen columns already keep four chains going. */
void cb_attn_online4_f16_neon(float *acc, size_t acc_stride, const float *w, size_t w_stride, const cb_half *v,
                              size_t stride, int n, int hd) {
    for (int j = 0; j < 4; j++) cb_attn_online_f16_neon(acc + j * acc_stride, w + j * w_stride, v, stride, n, hd);
}

void cb_attn_mix_f16_neon(float *out, const float *w, const cb_half *v, size_t stride, int n, int hd) {
    if (hd % 4) cb_attn_mix_f16_scalar(out, w, v, stride, n, hd);
    else attn_mix(out, w, v, stride, n, hd, 1);
}

/* Four queries against each K row read once: at consecutive positions of
 * one slot (a prompt chunk; stair), query i over positions [0, n + i), or a
 * GQA group's four heads at one position over [0, n). Per (query, position)
 * row_dot's two partial sums in its order, so the one-query bits. Rows past
 * a query's own positions get values nobody reads. */
static inline __attribute__((always_inline)) void attn_scores4(const float *q, size_t q_stride, const void *k,
                                                               size_t stride, int n, int hd, float scale,
                                                               float *scores, size_t s_stride, int f16, int stair) {
    const size_t row_bytes = stride * (f16 ? sizeof(cb_half) : sizeof(float));
    const int last = stair ? n + CB_ATTN_BLOCK - 1 : n;
    const float *q1 = q + q_stride, *q2 = q1 + q_stride, *q3 = q2 + q_stride;
    for (int p = 0; p < last; p++) {
        const uint8_t *row = (const uint8_t *)k + (size_t)p * row_bytes;
        float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        int j = 0;
        for (; j + 8 <= hd; j += 8) {
            const float32x4_t lo = load4(row, j, f16), hi = load4(row, j + 4, f16);
            a0 = vfmaq_f32(a0, vld1q_f32(q + j), lo), b0 = vfmaq_f32(b0, vld1q_f32(q + j + 4), hi);
            a1 = vfmaq_f32(a1, vld1q_f32(q1 + j), lo), b1 = vfmaq_f32(b1, vld1q_f32(q1 + j + 4), hi);
            a2 = vfmaq_f32(a2, vld1q_f32(q2 + j), lo), b2 = vfmaq_f32(b2, vld1q_f32(q2 + j + 4), hi);
            a3 = vfmaq_f32(a3, vld1q_f32(q3 + j), lo), b3 = vfmaq_f32(b3, vld1q_f32(q3 + j + 4), hi);
        }
        if (j < hd) {
            const float32x4_t lo = load4(row, j, f16);
            a0 = vfmaq_f32(a0, vld1q_f32(q + j), lo), a1 = vfmaq_f32(a1, vld1q_f32(q1 + j), lo);
            a2 = vfmaq_f32(a2, vld1q_f32(q2 + j), lo), a3 = vfmaq_f32(a3, vld1q_f32(q3 + j), lo);
        }
        scores[p] = vaddvq_f32(vaddq_f32(a0, b0)) * scale;
        scores[s_stride + p] = vaddvq_f32(vaddq_f32(a1, b1)) * scale;
        scores[2 * s_stride + p] = vaddvq_f32(vaddq_f32(a2, b2)) * scale;
        scores[3 * s_stride + p] = vaddvq_f32(vaddq_f32(a3, b3)) * scale;
    }
}

/* out_i = sum over p < n + i of w_i[p] v[p] (a prompt chunk's four
 * queries): each V row read once for the four, 16 columns at a time (then
 * 4); per element the FMA chain of attn_mix. */
#define MIX4_COLUMNS(W)                                                                                  \
    for (; j + (W) <= hd; j += (W)) {                                                                    \
        float32x4_t o[CB_ATTN_BLOCK][(W) / 4];                                                           \
        UNROLLED for (int i = 0; i < CB_ATTN_BLOCK; i++)                                                 \
            UNROLLED for (int c = 0; c < (W) / 4; c++) o[i][c] = vdupq_n_f32(0);                         \
        for (int p = 0; p < n + CB_ATTN_BLOCK - 1; p++) {                                                \
            const uint8_t *row = (const uint8_t *)v + (size_t)p * row_bytes;                             \
            float32x4_t vr[(W) / 4];                                                                     \
            UNROLLED for (int c = 0; c < (W) / 4; c++) vr[c] = load4(row, j + 4 * c, f16);               \
            /* positions n.. only for the later queries: their own last ones */                         \
            UNROLLED for (int i = 0; i < CB_ATTN_BLOCK; i++) {                                           \
                if (p >= n + i) continue;                                                                \
                const float32x4_t wp = vdupq_n_f32(w[i * w_stride + p]);                                 \
                UNROLLED for (int c = 0; c < (W) / 4; c++) o[i][c] = vfmaq_f32(o[i][c], wp, vr[c]);      \
            }                                                                                            \
        }                                                                                                \
        UNROLLED for (int i = 0; i < CB_ATTN_BLOCK; i++)                                                 \
            UNROLLED for (int c = 0; c < (W) / 4; c++) vst1q_f32(out + i * out_stride + j + 4 * c, o[i][c]); \
    }

static inline __attribute__((always_inline)) void attn_mix4(float *out, size_t out_stride, const float *w,
                                                            size_t w_stride, const void *v, size_t stride, int n,
                                                            int hd, int f16) {
    const size_t row_bytes = stride * (f16 ? sizeof(cb_half) : sizeof(float));
    int j = 0;
    MIX4_COLUMNS(16)
    MIX4_COLUMNS(4)
}
#undef MIX4_COLUMNS
#undef UNROLLED

void cb_attn_scores4_neon(const float *q, size_t q_stride, const float *k, size_t stride, int n, int hd, float scale,
                          float *scores, size_t s_stride, int stair) {
    if (hd % 4) cb_attn_scores4_scalar(q, q_stride, k, stride, n, hd, scale, scores, s_stride, stair);
    else attn_scores4(q, q_stride, k, stride, n, hd, scale, scores, s_stride, 0, stair);
}

void cb_attn_scores4_f16_neon(const float *q, size_t q_stride, const cb_half *k, size_t stride, int n, int hd,
                              float scale, float *scores, size_t s_stride, int stair) {
    if (hd % 4) cb_attn_scores4_f16_scalar(q, q_stride, k, stride, n, hd, scale, scores, s_stride, stair);
    else attn_scores4(q, q_stride, k, stride, n, hd, scale, scores, s_stride, 1, stair);
}

void cb_attn_mix4_neon(float *out, size_t out_stride, const float *w, size_t w_stride, const float *v, size_t stride,
                       int n, int hd) {
    if (hd % 4) cb_attn_mix4_scalar(out, out_stride, w, w_stride, v, stride, n, hd);
    else attn_mix4(out, out_stride, w, w_stride, v, stride, n, hd, 0);
}

void cb_attn_mix4_f16_neon(float *out, size_t out_stride, const float *w, size_t w_stride, const cb_half *v,
                           size_t stride, int n, int hd) {
    if (hd % 4) cb_attn_mix4_f16_scalar(out, out_stride, w, w_stride, v, stride, n, hd);
    else attn_mix4(out, out_stride, w, w_stride, v, stride, n, hd, 1);
}

/* y += a * x: each element one fused multiply-add, as the compiler
 * contracts the scalar reference on aarch64. */
void cb_axpy_neon(float *y, float a, const float *x, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

/* FCVTN rounds to nearest even like cb_float_to_half, subnormals included. */
void cb_f32_to_f16_neon(const float *x, cb_half *y, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    cb_f32_to_f16_scalar(x + i, y + i, n - i);
}

/* ---- exp, softmax, SwiGLU ---- */

/* cb_expf (kernels/scalar.c) on four lanes, operation for operation (its
 * madd is fmaf on aarch64, so VFMA gives its bits). FMAX and FMIN pass a NaN
 * through, as the reference does. */
static inline float32x4_t exp4(float32x4_t x) {
    x = vminq_f32(vdupq_n_f32(CB_EXP_MAX), vmaxq_f32(vdupq_n_f32(CB_EXP_MIN), x));
    const float32x4_t k = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(CB_LOG2E)));
    float32x4_t r = vfmsq_f32(x, k, vdupq_n_f32(CB_LN2_HI));
    r = vfmsq_f32(r, k, vdupq_n_f32(CB_LN2_LO));
    float32x4_t p = vdupq_n_f32(CB_EXP_C7);
    p = vfmaq_f32(vdupq_n_f32(CB_EXP_C6), p, r);
    p = vfmaq_f32(vdupq_n_f32(CB_EXP_C5), p, r);
    p = vfmaq_f32(vdupq_n_f32(CB_EXP_C4), p, r);
    p = vfmaq_f32(vdupq_n_f32(CB_EXP_C3), p, r);
    p = vfmaq_f32(vdupq_n_f32(CB_EXP_C2), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    const int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(k), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(bits));
}

/* cb_softmax_scalar's bits: its eight partial sums are two vectors here
 * (element i into lane i % 8); the tail's elements go to lanes 0, 1, ... */
void cb_softmax_neon(float *x, int n) {
    if (n <= 0) return;
    int i = 0;
    float32x4_t vmax = vdupq_n_f32(x[0]);
    for (; i + 4 <= n; i += 4) vmax = vmaxq_f32(vmax, vld1q_f32(x + i));
    float max = vmaxvq_f32(vmax);
    for (; i < n; i++) max = x[i] > max ? x[i] : max;
    const float32x4_t m = vdupq_n_f32(max);
    float32x4_t s0 = vdupq_n_f32(0), s1 = vdupq_n_f32(0);
    for (i = 0; i + 8 <= n; i += 8) {
        const float32x4_t e0 = exp4(vsubq_f32(vld1q_f32(x + i), m)), e1 = exp4(vsubq_f32(vld1q_f32(x + i + 4), m));
        vst1q_f32(x + i, e0), vst1q_f32(x + i + 4, e1);
        s0 = vaddq_f32(s0, e0), s1 = vaddq_f32(s1, e1);
    }
    float lanes[8];
    vst1q_f32(lanes, s0), vst1q_f32(lanes + 4, s1);
    for (int j = 0; i < n; i++, j++) {
        x[i] = cb_expf(x[i] - max);
        lanes[j] += x[i];
    }
    const float total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    const float32x4_t inv = vdupq_n_f32(1.0f / total);
    for (i = 0; i + 4 <= n; i += 4) vst1q_f32(x + i, vmulq_f32(vld1q_f32(x + i), inv));
    for (; i < n; i++) x[i] *= 1.0f / total;
}

void cb_exp_shifted_neon(float *x, int n, float shift, float scale) {
    int i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(x + i, exp4(vmulq_f32(vsubq_f32(vld1q_f32(x + i), vdupq_n_f32(shift)), vdupq_n_f32(scale))));
    cb_exp_shifted_scalar(x + i, n - i, shift, scale);
}

void cb_swiglu_neon(float *gate, const float *up, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t g = vld1q_f32(gate + i);
        const float32x4_t silu = vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), exp4(vnegq_f32(g))));
        vst1q_f32(gate + i, vmulq_f32(silu, vld1q_f32(up + i)));
    }
    cb_swiglu_scalar(gate + i, up + i, n - i);
}
