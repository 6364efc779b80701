/* NEON kernels for the f16, bf16, q8_0 and q4_0 weight types (aarch64), and
 * with the dot-product extension (armv8.2-a+dotprod) SDOT versions of the
 * integer ones. Reference: kernels/scalar.c. */
#include <arm_neon.h>
#include <string.h>

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

/* One GGML row's blocks: scales block_stride bytes apart from d, quants
 * from qs. */
static inline __attribute__((always_inline)) float dot_row_at(const uint8_t *d, const uint8_t *qs,
                                                              size_t block_stride, const cb_block_q8_0 *x, int n,
                                                              int q4, int sdot) {
    float32x4_t acc = vdupq_n_f32(0);
    for (int b = 0; b < n / CB_QK; b++, d += block_stride, qs += block_stride) {
        int8x16_t w0, w1;
        if (q4) unpack_q4(qs, &w0, &w1);
        else w0 = vld1q_s8((const int8_t *)qs), w1 = vld1q_s8((const int8_t *)qs + 16);
        int32x4_t s;
#if CB_KERNELS_DOTPROD
        if (sdot) s = vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, vld1q_s8(x[b].qs)), w1, vld1q_s8(x[b].qs + 16));
        else
#endif
            s = dot_i8x32(w0, w1, vld1q_s8(x[b].qs), vld1q_s8(x[b].qs + 16));
        cb_half h;
        memcpy(&h, d, sizeof h);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), half(h) * half(x[b].d));
    }
    (void)sdot;
    return vaddvq_f32(acc);
}

#define ROW_Q8(w) (const uint8_t *)&(w)[0].d, (const uint8_t *)(w)[0].qs, sizeof(cb_block_q8_0), x, n, 0
#define ROW_Q4(w) (const uint8_t *)&(w)[0].d, (w)[0].qs, sizeof(cb_block_q4_0), x, n, 1

float cb_dot_q8_0_neon(const cb_block_q8_0 *w, const cb_block_q8_0 *x, int n) { return dot_row_at(ROW_Q8(w), 0); }
float cb_dot_q4_0_neon(const cb_block_q4_0 *w, const cb_block_q8_0 *x, int n) { return dot_row_at(ROW_Q4(w), 0); }
#if CB_KERNELS_DOTPROD
float cb_dot_q8_0_dotprod(const cb_block_q8_0 *w, const cb_block_q8_0 *x, int n) { return dot_row_at(ROW_Q8(w), 1); }
float cb_dot_q4_0_dotprod(const cb_block_q4_0 *w, const cb_block_q8_0 *x, int n) { return dot_row_at(ROW_Q4(w), 1); }
#endif

/* Lane j: elements 4j..4j+3 of w . x over 16 elements (what SDOT gives). */
static inline int32x4_t lanes_i8x16(int8x16_t w, int8x16_t x) {
    return vpaddq_s32(vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x))), vpaddlq_s16(vmull_high_s8(w, x)));
}

/* Rows 0..3's lanes -> their totals, lane i row i. */
static inline int32x4_t row_totals(int32x4_t s0, int32x4_t s1, int32x4_t s2, int32x4_t s3) {
    return vpaddq_s32(vpaddq_s32(s0, s1), vpaddq_s32(s2, s3));
}

/* An x4 group (dims.h) with the arithmetic of the x4 reference in
 * kernels/scalar.c (one float step a row and block, on the block's integer
 * total), so x4 matrices give the same bits on every target. */
static inline __attribute__((always_inline)) void dot4_x4(const uint8_t *g, const cb_block_q8_0 *x, int n,
                                                          float out[4], int q4) {
    const size_t block = 4 * (q4 ? sizeof(cb_block_q4_0) : sizeof(cb_block_q8_0));
    float32x4_t acc = vdupq_n_f32(0);
    for (int b = 0; b < n / CB_QK; b++, g += block) {
        const int8x16_t xlo = vld1q_s8(x[b].qs), xhi = vld1q_s8(x[b].qs + 16);
        const float32x4_t d = vmulq_n_f32(vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)g))), half(x[b].d));
        int32x4_t s[4];
        for (int i = 0; i < 4; i++) {
            int8x16_t lo, hi;
            if (q4) unpack_q4(g + 8 + 16 * i, &lo, &hi);
            else lo = vld1q_s8((const int8_t *)g + 8 + 16 * i), hi = vld1q_s8((const int8_t *)g + 72 + 16 * i);
#if CB_KERNELS_DOTPROD
            s[i] = vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, xlo), hi, xhi);
#else
            s[i] = vaddq_s32(lanes_i8x16(lo, xlo), lanes_i8x16(hi, xhi));
#endif
        }
        acc = vfmaq_f32(acc, d, vcvtq_f32_s32(row_totals(s[0], s[1], s[2], s[3])));
    }
    vst1q_f32(out, acc);
}

void cb_dot4_q8_0x4_neon(const void *group, const cb_block_q8_0 *x, int n, float out[4]) {
    dot4_x4(group, x, n, out, 0);
}

void cb_dot4_q4_0x4_neon(const void *group, const cb_block_q8_0 *x, int n, float out[4]) {
    dot4_x4(group, x, n, out, 1);
}

#if CB_KERNELS_DOTPROD
/* A q8_0x4 group over many tokens (prompts): the group's four rows of a
 * block are loaded once for GEMM_TOKENS tokens, each token's rows take the
 * block totals, scales and float order of dot4_x4, so the bits are its. */
#define GEMM_TOKENS 4
static inline __attribute__((always_inline)) void gemm_tile(const uint8_t *g, int nb, const cb_block_q8_0 *const *x,
                                                            int nt, float *out) {
    float32x4_t acc[GEMM_TOKENS];
    for (int t = 0; t < nt; t++) acc[t] = vdupq_n_f32(0);
    for (int b = 0; b < nb; b++, g += 4 * sizeof(cb_block_q8_0)) {
        const float32x4_t dw = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)g)));
        int8x16_t lo[4], hi[4];
        for (int i = 0; i < 4; i++)
            lo[i] = vld1q_s8((const int8_t *)g + 8 + 16 * i), hi[i] = vld1q_s8((const int8_t *)g + 72 + 16 * i);
        for (int t = 0; t < nt; t++) {
            const int8x16_t xlo = vld1q_s8(x[t][b].qs), xhi = vld1q_s8(x[t][b].qs + 16);
            const float32x4_t d = vmulq_n_f32(dw, half(x[t][b].d));
#define ROW(i) vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo[i], xlo), hi[i], xhi)
            acc[t] = vfmaq_f32(acc[t], d, vcvtq_f32_s32(row_totals(ROW(0), ROW(1), ROW(2), ROW(3))));
#undef ROW
        }
    }
    for (int t = 0; t < nt; t++) vst1q_f32(out + 4 * t, acc[t]);
}

void cb_gemm_q8_0x4_dotprod(const void *group, const cb_block_q8_0 *const *x, int n_tok, int n, float *out) {
    for (int t = 0; t < n_tok; t += GEMM_TOKENS) {
        const int nt = n_tok - t < GEMM_TOKENS ? n_tok - t : GEMM_TOKENS;
        if (nt == GEMM_TOKENS) gemm_tile(group, n / CB_QK, x + t, GEMM_TOKENS, out + 4 * t);
        else if (nt == 3) gemm_tile(group, n / CB_QK, x + t, 3, out + 4 * t);
        else if (nt == 2) gemm_tile(group, n / CB_QK, x + t, 2, out + 4 * t);
        else gemm_tile(group, n / CB_QK, x + t, 1, out + 4 * t);
    }
}
#endif

/* The engine's activation quantizer: cb_quantize_row_q8_0's bytes. FCVTNS
 * rounds to nearest even whatever FPCR says; FMAXNM skips a NaN like fmaxf. */
void cb_quantize_row_q8_0_neon(const float *x, cb_block_q8_0 *y, int n) {
    for (int b = 0; b < n / CB_QK; b++, x += CB_QK) {
        float32x4_t v[8], m = vdupq_n_f32(0);
        for (int i = 0; i < 8; i++) {
            v[i] = vld1q_f32(x + 4 * i);
            m = vmaxnmq_f32(m, vabsq_f32(v[i]));
        }
        const float amax = vmaxnmvq_f32(m), id = cb_q8_0_inv_step(amax);
        y[b].d = cb_float_to_half(amax / 127.0f);
        int16x8_t h[4];
        for (int i = 0; i < 4; i++)
            h[i] = vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(v[2 * i], id))),
                                vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(v[2 * i + 1], id))));
        vst1q_s8(y[b].qs, vcombine_s8(vqmovn_s16(h[0]), vqmovn_s16(h[1])));
        vst1q_s8(y[b].qs + 16, vcombine_s8(vqmovn_s16(h[2]), vqmovn_s16(h[3])));
    }
}
