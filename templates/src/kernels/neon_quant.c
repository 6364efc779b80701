/* NEON kernels for the f16, bf16, q8_0 and q4_0 weight types (aarch64), and
 * with the dot-product extension (armv8.2-a+dotprod) SDOT versions of the
 * integer ones. Reference: kernels/scalar.c. */
#include <arm_neon.h>

#include "kernels.h"

static inline float half(cb_half h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

float cb_dot_f16_neon(const cb_half *w, const float *x, int n) {
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(w + i));
        acc0 = vfmaq_f32(acc0, vcvt_f32_f16(vget_low_f16(h)), vld1q_f32(x + i));
        acc1 = vfmaq_f32(acc1, vcvt_high_f32_f16(h), vld1q_f32(x + i + 4));
    }
    float sum = vaddvq_f32(vaddq_f32(acc0, acc1));
    for (; i < n; i++) sum += cb_half_to_float(w[i]) * x[i];
    return sum;
}

float cb_dot_bf16_neon(const uint16_t *w, const float *x, int n) {
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        uint16x8_t raw = vld1q_u16(w + i);
        /* bf16 is the top half of a float32: widen and shift left 16. */
        acc0 = vfmaq_f32(acc0, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(raw), 16)), vld1q_f32(x + i));
        acc1 = vfmaq_f32(acc1, vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(raw), 16)), vld1q_f32(x + i + 4));
    }
    float sum = vaddvq_f32(vaddq_f32(acc0, acc1));
    for (; i < n; i++) sum += cb_bf16_to_float(w[i]) * x[i];
    return sum;
}

/* 32 int8 products summed: widening multiplies, pairwise adds (no int16
 * overflow even for -128 * -128). */
static inline int32x4_t dot_i8x32(int8x16_t w0, int8x16_t w1, int8x16_t x0, int8x16_t x1) {
    int32x4_t s = vpaddlq_s16(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)));
    s = vpadalq_s16(s, vmull_high_s8(w0, x0));
    s = vpadalq_s16(s, vmull_s8(vget_low_s8(w1), vget_low_s8(x1)));
    return vpadalq_s16(s, vmull_high_s8(w1, x1));
}

/* q4_0's 32 values as two int8 vectors: low nibbles are elements 0..15. */
static inline void unpack_q4(const uint8_t *qs, int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t bytes = vld1q_u8(qs);
    const int8x16_t eight = vdupq_n_s8(8);
    *lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(bytes, vdupq_n_u8(0xF))), eight);
    *hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(bytes, 4)), eight);
}

float cb_dot_q8_0_neon(const cb_block_q8_0 *w, const cb_block_q8_0 *x, int n) {
    float32x4_t acc = vdupq_n_f32(0);
    for (int b = 0; b < n / CB_QK; b++) {
        int32x4_t s = dot_i8x32(vld1q_s8(w[b].qs), vld1q_s8(w[b].qs + 16), vld1q_s8(x[b].qs), vld1q_s8(x[b].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), half(w[b].d) * half(x[b].d));
    }
    return vaddvq_f32(acc);
}

float cb_dot_q4_0_neon(const cb_block_q4_0 *w, const cb_block_q8_0 *x, int n) {
    float32x4_t acc = vdupq_n_f32(0);
    for (int b = 0; b < n / CB_QK; b++) {
        int8x16_t lo, hi;
        unpack_q4(w[b].qs, &lo, &hi);
        int32x4_t s = dot_i8x32(lo, hi, vld1q_s8(x[b].qs), vld1q_s8(x[b].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), half(w[b].d) * half(x[b].d));
    }
    return vaddvq_f32(acc);
}

#if CB_KERNELS_DOTPROD
float cb_dot_q8_0_dotprod(const cb_block_q8_0 *w, const cb_block_q8_0 *x, int n) {
    float32x4_t acc = vdupq_n_f32(0);
    for (int b = 0; b < n / CB_QK; b++) {
        int32x4_t s = vdotq_s32(vdupq_n_s32(0), vld1q_s8(w[b].qs), vld1q_s8(x[b].qs));
        s = vdotq_s32(s, vld1q_s8(w[b].qs + 16), vld1q_s8(x[b].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), half(w[b].d) * half(x[b].d));
    }
    return vaddvq_f32(acc);
}

float cb_dot_q4_0_dotprod(const cb_block_q4_0 *w, const cb_block_q8_0 *x, int n) {
    float32x4_t acc = vdupq_n_f32(0);
    for (int b = 0; b < n / CB_QK; b++) {
        int8x16_t lo, hi;
        unpack_q4(w[b].qs, &lo, &hi);
        int32x4_t s = vdotq_s32(vdupq_n_s32(0), lo, vld1q_s8(x[b].qs));
        s = vdotq_s32(s, hi, vld1q_s8(x[b].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), half(w[b].d) * half(x[b].d));
    }
    return vaddvq_f32(acc);
}
#endif
