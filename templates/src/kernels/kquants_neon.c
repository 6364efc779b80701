/* NEON dot products of GGML's other block types (dims.h ids 8..18) against
 * q8_0 activations (the 32-weight types) or q8_k ones (the 256-weight types:
 * at the end); SDOT where the target has the dot-product extension.
 * Reference: kernels/kquants.c, whose integer sums these compute exactly
 * (weights unpacked to int8, products summed per 16) and whose float steps
 * they repeat: the reference's bits. */
#include <arm_neon.h>
#include <string.h>

#include "kernels.h"

static inline float half(cb_half h) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); }

/* Sum of 16 int8 products. */
static inline int32_t dot16(int8x16_t w, int8x16_t x) {
#if CB_KERNELS_DOTPROD
    return vaddvq_s32(vdotq_s32(vdupq_n_s32(0), w, x));
#else
    const int16x8_t p = vmlal_s8(vmull_s8(vget_low_s8(w), vget_low_s8(x)), vget_high_s8(w), vget_high_s8(x));
    return vaddlvq_s16(p);
#endif
}

static inline int32_t sum16(int8x16_t x) { return vaddlvq_s8(x); }

/* 16 bytes of nibbles -> low nibbles (elements 0..15), high ones (16..31). */
static inline void nibbles(const uint8_t *qs, int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t q = vld1q_u8(qs);
    *lo = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0xF)));
    *hi = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
}

/* q5's 5th bits, 0x10 in byte j where bit j of qh is set (j < 16: lo). */
static inline void bit5(const uint8_t qh[4], uint8x16_t *lo, uint8x16_t *hi) {
    uint32_t bits;
    memcpy(&bits, qh, 4);
    static const uint8_t mask_bytes[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t mask = vld1q_u8(mask_bytes);
    const uint8x16_t b01 = vcombine_u8(vdup_n_u8((uint8_t)bits), vdup_n_u8((uint8_t)(bits >> 8)));
    const uint8x16_t b23 = vcombine_u8(vdup_n_u8((uint8_t)(bits >> 16)), vdup_n_u8((uint8_t)(bits >> 24)));
    *lo = vandq_u8(vtstq_u8(b01, mask), vdupq_n_u8(0x10));
    *hi = vandq_u8(vtstq_u8(b23, mask), vdupq_n_u8(0x10));
}

/* ---- the 32-weight types on q8_0: a block's integer sums exact, then
 * cb_b32_step into lane i % 8 and cb_b32_sum (the scalar reference's bits). ---- */

/* q4_1 on q8_0 (its block size): d * sum(q x) + m * sum(x). */
static float dot_q4_1(const void *w, const cb_block_q8_0 *x, int n) {
    const cb_block_q4_1 *b = w;
    float lane[CB_B32_LANES] = {0};
    for (int i = 0; i < n / CB_QK; i++) {
        int8x16_t lo, hi;
        nibbles(b[i].qs, &lo, &hi);
        const int8x16_t x0 = vld1q_s8(x[i].qs), x1 = vld1q_s8(x[i].qs + 16);
        const int32_t sq = dot16(lo, x0) + dot16(hi, x1), sx = sum16(x0) + sum16(x1);
        const float dx = half(x[i].d);
        float *l = &lane[i % CB_B32_LANES];
        *l = cb_b32_step(cb_b32_step(*l, dx * half(b[i].d), sq), dx * half(b[i].m), sx);
    }
    return cb_b32_sum(lane);
}

/* q5_0 (sum((q - 16) x)) and q5_1 (as q4_1) on q8_0, their block size. */
static inline __attribute__((always_inline)) float dot_q5(const void *w, const cb_block_q8_0 *x, int n, int with_min) {
    const size_t block = with_min ? sizeof(cb_block_q5_1) : sizeof(cb_block_q5_0);
    float lane[CB_B32_LANES] = {0};
    for (int i = 0; i < n / CB_QK; i++) {
        const uint8_t *blk = (const uint8_t *)w + (size_t)i * block;
        const uint8_t *qh = blk + (with_min ? 4 : 2), *qs = qh + 4;
        cb_half hd, hm = 0;
        memcpy(&hd, blk, 2);
        if (with_min) memcpy(&hm, blk + 2, 2);
        int8x16_t lo, hi;
        uint8x16_t h0, h1;
        nibbles(qs, &lo, &hi);
        bit5(qh, &h0, &h1);
        lo = vreinterpretq_s8_u8(vorrq_u8(vreinterpretq_u8_s8(lo), h0));
        hi = vreinterpretq_s8_u8(vorrq_u8(vreinterpretq_u8_s8(hi), h1));
        if (!with_min) lo = vsubq_s8(lo, vdupq_n_s8(16)), hi = vsubq_s8(hi, vdupq_n_s8(16));
        const int8x16_t x0 = vld1q_s8(x[i].qs), x1 = vld1q_s8(x[i].qs + 16);
        const int32_t sq = dot16(lo, x0) + dot16(hi, x1);
        const float dx = half(x[i].d);
        float *l = &lane[i % CB_B32_LANES];
        *l = cb_b32_step(*l, dx * half(hd), sq);
        if (with_min) *l = cb_b32_step(*l, dx * half(hm), sum16(x0) + sum16(x1));
    }
    return cb_b32_sum(lane);
}
static float dot_q5_0(const void *w, const cb_block_q8_0 *x, int n) { return dot_q5(w, x, n, 0); }
static float dot_q5_1(const void *w, const cb_block_q8_0 *x, int n) { return dot_q5(w, x, n, 1); }

/* iq4_nl on q8_0 (its block size): the codebook's levels . x, exactly. */
static float dot_iq4_nl(const void *w, const cb_block_q8_0 *x, int n) {
    const cb_block_iq4_nl *b = w;
    const int8x16_t book = vld1q_s8(cb_iq4nl_values);
    float lane[CB_B32_LANES] = {0};
    for (int i = 0; i < n / CB_QK; i++) {
        int8x16_t lo, hi;
        nibbles(b[i].qs, &lo, &hi);
        lo = vqtbl1q_s8(book, vreinterpretq_u8_s8(lo));
        hi = vqtbl1q_s8(book, vreinterpretq_u8_s8(hi));
        const int32_t sq = dot16(lo, vld1q_s8(x[i].qs)) + dot16(hi, vld1q_s8(x[i].qs + 16));
        float *l = &lane[i % CB_B32_LANES];
        *l = cb_b32_step(*l, half(x[i].d) * half(b[i].d), sq);
    }
    return cb_b32_sum(lane);
}

/* The sums of each four consecutive int8 products of w . x, as four lanes. */
static inline int32x4_t dot4s(int8x16_t w, int8x16_t x) {
#if CB_KERNELS_DOTPROD
    return vdotq_s32(vdupq_n_s32(0), w, x);
#else
    return vpaddq_s32(vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x))), vpaddlq_s16(vmull_high_s8(w, x)));
#endif
}

/* mxfp4 (E8M0, 2^(e - 128)): lane m (elements 4m..4m+3 of every block) by
 * cb_b32_step, lanes 0..3 in lo, 4..7 in hi, then cb_b32_sum's tree. */
static float dot_mxfp4(const void *w, const cb_block_q8_0 *x, int n) {
    const cb_block_mxfp4 *b = w;
    const int8x16_t book = vld1q_s8(cb_mxfp4_values);
    float32x4_t lo_acc = vdupq_n_f32(0), hi_acc = vdupq_n_f32(0);
    for (int i = 0; i < n / CB_QK; i++) {
        const uint32_t bits = b[i].e < 2 ? 0x00200000u << b[i].e : (uint32_t)(b[i].e - 1) << 23;
        float e;
        memcpy(&e, &bits, sizeof e);
        const float d = half(x[i].d) * e;
        int8x16_t lo, hi;
        nibbles(b[i].qs, &lo, &hi);
        lo = vqtbl1q_s8(book, vreinterpretq_u8_s8(lo));
        hi = vqtbl1q_s8(book, vreinterpretq_u8_s8(hi));
        lo_acc = vfmaq_n_f32(lo_acc, vcvtq_f32_s32(dot4s(lo, vld1q_s8(x[i].qs))), d);
        hi_acc = vfmaq_n_f32(hi_acc, vcvtq_f32_s32(dot4s(hi, vld1q_s8(x[i].qs + 16))), d);
    }
    const float32x4_t s = vaddq_f32(lo_acc, hi_acc); /* lane k: l[k] + l[k + 4] */
    return (vgetq_lane_f32(s, 0) + vgetq_lane_f32(s, 2)) + (vgetq_lane_f32(s, 1) + vgetq_lane_f32(s, 3));
}

cb_dot_block_fn cb_dot_block_neon(uint32_t dtype) {
    CB_DOT_BLOCK_DISPATCH(dtype);
}

/* ---- q8_k activations: a super-block's products summed in int32 lanes,
 * reduced exactly, then cb_kq_step (the scalar reference's bits). ---- */

/* 16 int8 products as int32 lanes that sum to their dot product. */
static inline int32x4_t dot16v(int8x16_t w, int8x16_t x) {
#if CB_KERNELS_DOTPROD
    return vdotq_s32(vdupq_n_s32(0), w, x);
#else
    return vpaddlq_s16(vmlal_s8(vmull_s8(vget_low_s8(w), vget_low_s8(x)), vget_high_s8(w), vget_high_s8(x)));
#endif
}

/* Q4_K / Q5_K: group c is the low (even c) or high nibbles of
 * qs[32 * (c / 2)..], plus bit c of qh[0..31] for q5; mins through the
 * per-16 sums of x. */
static inline __attribute__((always_inline)) float dot_q45_k(const void *w, const cb_block_q8_k *x, int n, int q5) {
    const size_t block = q5 ? sizeof(cb_block_q5_k) : sizeof(cb_block_q4_k);
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, x++) {
        const cb_block_q5_k *k5 = (const void *)((const uint8_t *)w + (size_t)i * block);
        const uint8_t *qs = q5 ? k5->qs : ((const cb_block_q4_k *)k5)->qs, *sc6 = k5->scales;
        uint8x16_t h0 = vdupq_n_u8(0), h1 = vdupq_n_u8(0);
        if (q5) h0 = vld1q_u8(k5->qh), h1 = vld1q_u8(k5->qh + 16);
        int32x4_t acc = vdupq_n_s32(0);
        int32_t mins = 0;
        for (int c = 0; c < 8; c++) {
            int sc, m;
            if (c < 4) sc = sc6[c] & 63, m = sc6[c + 4] & 63;
            else sc = (sc6[c + 4] & 0xF) | ((sc6[c - 4] >> 6) << 4), m = (sc6[c + 4] >> 4) | ((sc6[c] >> 6) << 4);
            const uint8x16_t q0 = vld1q_u8(qs + 32 * (c / 2)), q1 = vld1q_u8(qs + 32 * (c / 2) + 16);
            uint8x16_t u0 = c & 1 ? vshrq_n_u8(q0, 4) : vandq_u8(q0, vdupq_n_u8(0xF));
            uint8x16_t u1 = c & 1 ? vshrq_n_u8(q1, 4) : vandq_u8(q1, vdupq_n_u8(0xF));
            if (q5) {
                const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << c));
                u0 = vorrq_u8(u0, vandq_u8(vtstq_u8(h0, bit), vdupq_n_u8(0x10)));
                u1 = vorrq_u8(u1, vandq_u8(vtstq_u8(h1, bit), vdupq_n_u8(0x10)));
            }
            const int32x4_t p = vaddq_s32(dot16v(vreinterpretq_s8_u8(u0), vld1q_s8(x->qs + 32 * c)),
                                          dot16v(vreinterpretq_s8_u8(u1), vld1q_s8(x->qs + 32 * c + 16)));
            acc = vmlaq_n_s32(acc, p, sc);
            mins += m * (x->bsums[2 * c] + x->bsums[2 * c + 1]);
        }
        s = cb_kq_step(s, x->d, half(k5->d), vaddvq_s32(acc), half(k5->dmin), mins);
    }
    return s;
}
static float dot_q4_k(const void *w, const cb_block_q8_k *x, int n) { return dot_q45_k(w, x, n, 0); }
static float dot_q5_k(const void *w, const cb_block_q8_k *x, int n) { return dot_q45_k(w, x, n, 1); }

/* Q6_K: group c (n = c / 4, k = c % 4) is ql[64n + 32(k & 1)..] (low nibbles
 * for k < 2, high ones after) with qh[32n..] >> 2k as bits 4..5, unsigned
 * 0..63; the 32 subtracted comes off as 32 * scale * (sum of 16 x). */
static float dot_q6_k(const void *w, const cb_block_q8_k *x, int n) {
    const cb_block_q6_k *b = w;
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, b++, x++) {
        int32x4_t acc = vdupq_n_s32(0);
        int32_t offs = 0;
        for (int g = 0; g < 16; g++) offs += b->scales[g] * x->bsums[g];
        for (int c = 0; c < 8; c++) {
            const int hf = c / 4, k = c % 4;
            for (int p = 0; p < 2; p++) {
                const uint8x16_t l = vld1q_u8(b->ql + 64 * hf + 32 * (k & 1) + 16 * p);
                const uint8x16_t h = vld1q_u8(b->qh + 32 * hf + 16 * p);
                const uint8x16_t lo = k >= 2 ? vshrq_n_u8(l, 4) : vandq_u8(l, vdupq_n_u8(0xF));
                const uint8x16_t hi = vshlq_n_u8(vandq_u8(vshlq_u8(h, vdupq_n_s8((int8_t)(-2 * k))), vdupq_n_u8(3)), 4);
                acc = vmlaq_n_s32(acc, dot16v(vreinterpretq_s8_u8(vorrq_u8(lo, hi)), vld1q_s8(x->qs + 32 * c + 16 * p)),
                                  b->scales[2 * c + p]);
            }
        }
        s = cb_kq_step(s, x->d, half(b->d), vaddvq_s32(acc) - 32 * offs, 0.0f, 0);
    }
    return s;
}

/* Q2_K / Q3_K on q8_k: the 2 low bits of group c (n = c / 4, j = c % 4) are
 * qs[32n..] >> 2j; Q3_K's third is hmask[0..31] bit c, q = that | bit << 2
 * less 4 (through the per-16 sums of x); Q2_K's mins through them too. */
static inline __attribute__((always_inline)) float dot_q23_k(const void *w, const cb_block_q8_k *x, int n, int q3) {
    const size_t block = q3 ? sizeof(cb_block_q3_k) : sizeof(cb_block_q2_k);
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, x++) {
        const uint8_t *blk = (const uint8_t *)w + (size_t)i * block;
        const cb_block_q2_k *b2 = (const void *)blk;
        const cb_block_q3_k *b3 = (const void *)blk;
        const uint8_t *qs = q3 ? b3->qs : b2->qs;
        int sc[16];
        int32_t offs = 0;
        for (int g = 0; g < 16; g++) {
            if (q3)
                sc[g] = (((g < 8 ? b3->scales[g] : b3->scales[g - 8] >> 4) & 0xF) |
                         ((b3->scales[8 + g % 4] >> (2 * (g / 4))) & 3) << 4) - 32;
            else sc[g] = b2->scales[g] & 0xF;
            offs += (q3 ? 4 * sc[g] : b2->scales[g] >> 4) * x->bsums[g];
        }
        int32x4_t acc = vdupq_n_s32(0);
        for (int c = 0; c < 8; c++) {
            for (int p = 0; p < 2; p++) {
                const uint8x16_t l = vld1q_u8(qs + 32 * (c / 4) + 16 * p);
                uint8x16_t u = vandq_u8(vshlq_u8(l, vdupq_n_s8((int8_t)(-2 * (c % 4)))), vdupq_n_u8(3));
                if (q3) {
                    const uint8x16_t set = vtstq_u8(vld1q_u8(b3->hmask + 16 * p), vdupq_n_u8((uint8_t)(1u << c)));
                    u = vorrq_u8(u, vandq_u8(set, vdupq_n_u8(4)));
                }
                acc = vmlaq_n_s32(acc, dot16v(vreinterpretq_s8_u8(u), vld1q_s8(x->qs + 32 * c + 16 * p)), sc[2 * c + p]);
            }
        }
        const int32_t sum = vaddvq_s32(acc);
        s = q3 ? cb_kq_step(s, x->d, half(b3->d), sum - offs, 0.0f, 0)
               : cb_kq_step(s, x->d, half(b2->d), sum, half(b2->dmin), offs);
    }
    return s;
}
static float dot_q2_k(const void *w, const cb_block_q8_k *x, int n) { return dot_q23_k(w, x, n, 0); }
static float dot_q3_k(const void *w, const cb_block_q8_k *x, int n) { return dot_q23_k(w, x, n, 1); }

/* IQ4_XS on q8_k: group g's levels . x times its 6-bit scale less 32. */
static float dot_iq4_xs(const void *w, const cb_block_q8_k *x, int n) {
    const cb_block_iq4_xs *b = w;
    const int8x16_t book = vld1q_s8(cb_iq4nl_values);
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, b++, x++) {
        int32x4_t acc = vdupq_n_s32(0);
        for (int g = 0; g < 8; g++) {
            const int ls = ((b->scales_l[g / 2] >> (4 * (g % 2))) & 0xF) | ((b->scales_h >> (2 * g)) & 3) << 4;
            int8x16_t lo, hi;
            nibbles(b->qs + 16 * g, &lo, &hi);
            lo = vqtbl1q_s8(book, vreinterpretq_u8_s8(lo));
            hi = vqtbl1q_s8(book, vreinterpretq_u8_s8(hi));
            const int32x4_t p = vaddq_s32(dot16v(lo, vld1q_s8(x->qs + 32 * g)), dot16v(hi, vld1q_s8(x->qs + 32 * g + 16)));
            acc = vmlaq_n_s32(acc, p, ls - 32);
        }
        s = cb_kq_step(s, x->d, half(b->d), vaddvq_s32(acc), 0.0f, 0);
    }
    return s;
}

cb_dot_k_fn cb_dot_k_neon(uint32_t dtype) {
    CB_DOT_K_DISPATCH(dtype);
}
