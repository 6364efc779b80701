/* GGML's block types beyond q8_0 / q4_0 (dims.h ids 8..18), kept as GGUF
 * files hold them: where each weight's bits lie, dequantization (the
 * toolkit's numpy one, toolkit/quant.py, gives the same bits) and the scalar
 * dot products against q8_0 activations (the 32-weight types) or q8_k ones
 * (the 256-weight types) whose bits every SIMD kernel gives (kernel_check.c).
 * Layouts are GGML's (ggml-common.h block_*). */
#include <math.h>
#include <string.h>

#include "kernels.h"

const int8_t cb_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
const int8_t cb_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e - 128) exactly, subnormal for e < 2 (GGML's E8M0 "half"). */
static float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Q4_K / Q5_K: the 6-bit scale and min of 32-weight group j (0..7) from the
 * 12 packed bytes: groups 0..3 in the low 6 bits of bytes j and j + 4,
 * groups 4..7 a nibble of byte j + 4 and the top 2 bits of bytes j - 4 / j. */
static inline void scale_min_k4(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q3_K: the 6-bit scale of 16-weight group i (0..15), 32 subtracted: low
 * nibble from byte i % 8 (high nibble for i >= 8), top 2 bits from byte
 * 8 + i % 4 at bit 2 * (i / 4). */
static inline int scale_q3_k(const uint8_t *s, int i) {
    const int lo = (i < 8 ? s[i] : s[i - 8] >> 4) & 0xF, hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | hi << 4) - 32;
}

/* Q6_K: weight e (0..255) of a block is the low (e % 128 < 64) or high
 * nibble of ql[64 * (e / 128) + e % 32 + 32 * ((e / 32) & 1)] with 2 bits
 * from qh[32 * (e / 128) + e % 32] at bit 2 * ((e % 128) / 32), 32
 * subtracted; its scale is scales[e / 16]. */
static inline int q6_k(const cb_block_q6_k *b, int e) {
    const int n = e / 128, k = (e % 128) / 32, l = e % 32;
    const int lo = (b->ql[64 * n + l + 32 * (k & 1)] >> (k >= 2 ? 4 : 0)) & 0xF;
    const int hi = (b->qh[32 * n + l] >> (2 * k)) & 3;
    return (lo | hi << 4) - 32;
}

/* Q2_K / Q3_K: the 2 low bits of weight e are qs[32 * (e / 128) + e % 32]
 * at bit 2 * ((e % 128) / 32); Q3_K's third is hmask[e % 32] bit e / 32. */
static inline int q2_bits(const uint8_t *qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3; }

/* Weight j (0..31) of a 32-weight group's 16 bytes of nibbles, and its
 * 5th bit (bit j of 4 bytes). */
static inline int nibble(const uint8_t *qs16, int j) { return j < 16 ? qs16[j] & 0xF : qs16[j - 16] >> 4; }
static inline int bit5(const uint8_t qh[4], int j) { return (qh[j / 8] >> (j % 8)) & 1; }

/* A product a * b that the compiler may not fuse into an add or subtract:
 * numpy (gguf.quants, toolkit/quant.py) rounds the product first, and
 * dequantization must give its bits on FMA targets too. */
static inline float mul_rounded(float a, float b) {
    volatile float p = a * b;
    return p;
}

int cb_dequantize_block_row(uint32_t dtype, const void *row, float *out, int n) {
    switch (dtype) {
    case CB_Q4_1:
    case CB_Q5_1:
        for (int b = 0; b < n / CB_QK; b++) {
            const int q5 = dtype == CB_Q5_1;
            const uint8_t *blk = (const uint8_t *)row + (size_t)b * (q5 ? sizeof(cb_block_q5_1) : sizeof(cb_block_q4_1));
            cb_half hd, hm;
            memcpy(&hd, blk, 2);
            memcpy(&hm, blk + 2, 2);
            const float d = cb_half_to_float(hd), m = cb_half_to_float(hm);
            const uint8_t *qs = blk + (q5 ? 8 : 4);
            for (int j = 0; j < CB_QK; j++)
                out[b * CB_QK + j] = mul_rounded(d, (float)(nibble(qs, j) | (q5 ? bit5(blk + 4, j) << 4 : 0))) + m;
        }
        return 1;
    case CB_Q5_0:
        for (int b = 0; b < n / CB_QK; b++) {
            const cb_block_q5_0 *blk = (const cb_block_q5_0 *)row + b;
            const float d = cb_half_to_float(blk->d);
            for (int j = 0; j < CB_QK; j++) out[b * CB_QK + j] = d * (float)((nibble(blk->qs, j) | bit5(blk->qh, j) << 4) - 16);
        }
        return 1;
    case CB_IQ4_NL:
        for (int b = 0; b < n / CB_QK; b++) {
            const cb_block_iq4_nl *blk = (const cb_block_iq4_nl *)row + b;
            const float d = cb_half_to_float(blk->d);
            for (int j = 0; j < CB_QK; j++) out[b * CB_QK + j] = d * (float)cb_iq4nl_values[nibble(blk->qs, j)];
        }
        return 1;
    case CB_MXFP4:
        for (int b = 0; b < n / CB_QK; b++) {
            const cb_block_mxfp4 *blk = (const cb_block_mxfp4 *)row + b;
            const float d = e8m0_half(blk->e);
            for (int j = 0; j < CB_QK; j++) out[b * CB_QK + j] = d * (float)cb_mxfp4_values[nibble(blk->qs, j)];
        }
        return 1;
    case CB_Q2_K:
        for (int b = 0; b < n / CB_QK_K; b++, out += CB_QK_K) {
            const cb_block_q2_k *blk = (const cb_block_q2_k *)row + b;
            const float d = cb_half_to_float(blk->d), dmin = cb_half_to_float(blk->dmin);
            for (int e = 0; e < CB_QK_K; e++) {
                const int s = blk->scales[e / 16];
                out[e] = mul_rounded(d * (float)(s & 0xF), (float)q2_bits(blk->qs, e)) - mul_rounded(dmin, (float)(s >> 4));
            }
        }
        return 1;
    case CB_Q3_K:
        for (int b = 0; b < n / CB_QK_K; b++, out += CB_QK_K) {
            const cb_block_q3_k *blk = (const cb_block_q3_k *)row + b;
            const float d = cb_half_to_float(blk->d);
            for (int e = 0; e < CB_QK_K; e++) {
                const int q = q2_bits(blk->qs, e) - ((blk->hmask[e % 32] >> (e / 32)) & 1 ? 0 : 4);
                out[e] = d * (float)scale_q3_k(blk->scales, e / 16) * (float)q;
            }
        }
        return 1;
    case CB_Q4_K:
    case CB_Q5_K:
        for (int b = 0; b < n / CB_QK_K; b++, out += CB_QK_K) {
            const int q5 = dtype == CB_Q5_K;
            const uint8_t *blk = (const uint8_t *)row + (size_t)b * (q5 ? sizeof(cb_block_q5_k) : sizeof(cb_block_q4_k));
            const cb_block_q5_k *k5 = (const cb_block_q5_k *)blk;
            const uint8_t *qs = q5 ? k5->qs : ((const cb_block_q4_k *)blk)->qs;
            const float d = cb_half_to_float(k5->d), dmin = cb_half_to_float(k5->dmin);
            for (int e = 0; e < CB_QK_K; e++) {
                const int g = e / 32, l = e % 32; /* group g: low nibbles of qs[32 * (g / 2)..] for even g */
                int sc, m;
                scale_min_k4(k5->scales, g, &sc, &m);
                const int q = ((qs[32 * (g / 2) + l] >> (4 * (g & 1))) & 0xF) | (q5 ? ((k5->qh[l] >> g) & 1) << 4 : 0);
                out[e] = mul_rounded(d * (float)sc, (float)q) - mul_rounded(dmin, (float)m);
            }
        }
        return 1;
    case CB_Q6_K:
        for (int b = 0; b < n / CB_QK_K; b++, out += CB_QK_K) {
            const cb_block_q6_k *blk = (const cb_block_q6_k *)row + b;
            const float d = cb_half_to_float(blk->d);
            for (int e = 0; e < CB_QK_K; e++) out[e] = d * (float)blk->scales[e / 16] * (float)q6_k(blk, e);
        }
        return 1;
    case CB_IQ4_XS:
        for (int b = 0; b < n / CB_QK_K; b++, out += CB_QK_K) {
            const cb_block_iq4_xs *blk = (const cb_block_iq4_xs *)row + b;
            const float d = cb_half_to_float(blk->d);
            for (int e = 0; e < CB_QK_K; e++) {
                const int g = e / 32;
                const int ls = ((blk->scales_l[g / 2] >> (4 * (g % 2))) & 0xF) | ((blk->scales_h >> (2 * g)) & 3) << 4;
                out[e] = d * (float)(ls - 32) * (float)cb_iq4nl_values[nibble(blk->qs + 16 * g, e % 32)];
            }
        }
        return 1;
    }
    return 0;
}

/* ---- scalar dot products of the 32-weight types against q8_0 activations:
 * per block the integer sums of q * x (and of x, for a min), then
 * cb_b32_step into lane i % 8, and cb_b32_sum of the lanes (kernels.h). ---- */

/* q4_1 on q8_0 (its block size): x = d * q + m, so d * sum(q x) + m * sum(x). */
static float dot_q4_1(const void *w, const cb_block_q8_0 *x, int n) {
    const cb_block_q4_1 *b = w;
    float lane[CB_B32_LANES] = {0};
    for (int i = 0; i < n / CB_QK; i++) {
        int sq = 0, sx = 0;
        for (int j = 0; j < CB_QK; j++) sq += nibble(b[i].qs, j) * x[i].qs[j], sx += x[i].qs[j];
        const float dx = cb_half_to_float(x[i].d);
        float *l = &lane[i % CB_B32_LANES];
        *l = cb_b32_step(cb_b32_step(*l, dx * cb_half_to_float(b[i].d), sq), dx * cb_half_to_float(b[i].m), sx);
    }
    return cb_b32_sum(lane);
}

/* q5_0 on q8_0 (its block size): sum((q - 16) x) exactly. */
static float dot_q5_0(const void *w, const cb_block_q8_0 *x, int n) {
    const cb_block_q5_0 *b = w;
    float lane[CB_B32_LANES] = {0};
    for (int i = 0; i < n / CB_QK; i++) {
        int sq = 0;
        for (int j = 0; j < CB_QK; j++) sq += ((nibble(b[i].qs, j) | bit5(b[i].qh, j) << 4) - 16) * x[i].qs[j];
        float *l = &lane[i % CB_B32_LANES];
        *l = cb_b32_step(*l, cb_half_to_float(x[i].d) * cb_half_to_float(b[i].d), sq);
    }
    return cb_b32_sum(lane);
}

/* q5_1 on q8_0 (its block size): as q4_1 with a 5th bit. */
static float dot_q5_1(const void *w, const cb_block_q8_0 *x, int n) {
    const cb_block_q5_1 *b = w;
    float lane[CB_B32_LANES] = {0};
    for (int i = 0; i < n / CB_QK; i++) {
        int sq = 0, sx = 0;
        for (int j = 0; j < CB_QK; j++) sq += (nibble(b[i].qs, j) | bit5(b[i].qh, j) << 4) * x[i].qs[j], sx += x[i].qs[j];
        const float dx = cb_half_to_float(x[i].d);
        float *l = &lane[i % CB_B32_LANES];
        *l = cb_b32_step(cb_b32_step(*l, dx * cb_half_to_float(b[i].d), sq), dx * cb_half_to_float(b[i].m), sx);
    }
    return cb_b32_sum(lane);
}

/* iq4_nl on q8_0 (its block size): the codebook's levels times x, exactly. */
static float dot_iq4_nl(const void *w, const cb_block_q8_0 *x, int n) {
    const cb_block_iq4_nl *b = w;
    float lane[CB_B32_LANES] = {0};
    for (int i = 0; i < n / CB_QK; i++) {
        int sq = 0;
        for (int j = 0; j < CB_QK; j++) sq += cb_iq4nl_values[nibble(b[i].qs, j)] * x[i].qs[j];
        float *l = &lane[i % CB_B32_LANES];
        *l = cb_b32_step(*l, cb_half_to_float(x[i].d) * cb_half_to_float(b[i].d), sq);
    }
    return cb_b32_sum(lane);
}

/* MXFP4: a scale per block per row (E8M0) and per block of x, so SIMD
 * kernels keep each block's sums in lanes rather than gather block totals:
 * lane m takes elements 4m..4m+3 of every block (an AVX2 register of int32
 * pair sums, two SDOT results), by cb_b32_step with scale dx * 2^(e - 128). */
static float dot_mxfp4(const void *w, const cb_block_q8_0 *x, int n) {
    const cb_block_mxfp4 *b = w;
    float lane[CB_B32_LANES] = {0};
    for (int i = 0; i < n / CB_QK; i++) {
        const float d = cb_half_to_float(x[i].d) * e8m0_half(b[i].e);
        for (int m = 0; m < CB_B32_LANES; m++) {
            int32_t sq = 0;
            for (int j = 4 * m; j < 4 * m + 4; j++) sq += cb_mxfp4_values[nibble(b[i].qs, j)] * x[i].qs[j];
            lane[m] = cb_b32_step(lane[m], d, sq);
        }
    }
    return cb_b32_sum(lane);
}

/* ---- scalar dot products against q8_k activations: per super-block the
 * integer sums of scale * q * x and of min * x (from the per-16 sums), then
 * cb_kq_step. ---- */

/* kernels.h: the value of largest magnitude (the first such) sets
 * iscale = -127 / max, so d = 1 / iscale is negative where it is positive. */
void cb_quantize_row_q8_k(const float *x, cb_block_q8_k *y, int n) {
    for (int b = 0; b < n / CB_QK_K; b++, x += CB_QK_K) {
        float amax = 0, max = 0;
        for (int j = 0; j < CB_QK_K; j++)
            if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
        const float iscale = cb_q8_k_iscale(max);
        y[b].d = iscale != 0.0f ? 1.0f / iscale : 0.0f;
        for (int j = 0; j < CB_QK_K; j++) {
            const int32_t v = cb_nearest_int(x[j] * iscale);
            y[b].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int g = 0; g < CB_QK_K / 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) sum += y[b].qs[16 * g + j];
            y[b].bsums[g] = (int16_t)sum;
        }
    }
}

static float dot_q45_k(const void *w, const cb_block_q8_k *x, int n, int q5) {
    const size_t block = q5 ? sizeof(cb_block_q5_k) : sizeof(cb_block_q4_k);
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, x++) {
        const cb_block_q5_k *k5 = (const void *)((const uint8_t *)w + (size_t)i * block);
        const uint8_t *qs = q5 ? k5->qs : ((const cb_block_q4_k *)k5)->qs;
        int32_t sum = 0, mins = 0;
        for (int c = 0; c < 8; c++) {
            int sc, m, sq = 0;
            scale_min_k4(k5->scales, c, &sc, &m);
            for (int j = 0; j < CB_QK; j++) {
                const int q = ((qs[32 * (c / 2) + j] >> (4 * (c & 1))) & 0xF) | (q5 ? ((k5->qh[j] >> c) & 1) << 4 : 0);
                sq += q * x->qs[32 * c + j];
            }
            sum += sc * sq;
            mins += m * (x->bsums[2 * c] + x->bsums[2 * c + 1]);
        }
        s = cb_kq_step(s, x->d, cb_half_to_float(k5->d), sum, cb_half_to_float(k5->dmin), mins);
    }
    return s;
}
static float dot_q4_k(const void *w, const cb_block_q8_k *x, int n) { return dot_q45_k(w, x, n, 0); }
static float dot_q5_k(const void *w, const cb_block_q8_k *x, int n) { return dot_q45_k(w, x, n, 1); }

/* q - 32 as q . x - 32 * sum(x): the sums of x per 16 are at hand. */
static float dot_q6_k(const void *w, const cb_block_q8_k *x, int n) {
    const cb_block_q6_k *b = w;
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, b++, x++) {
        int32_t sum = 0, offs = 0;
        for (int g = 0; g < 16; g++) {
            int sq = 0;
            for (int j = 0; j < 16; j++) sq += (q6_k(b, 16 * g + j) + 32) * x->qs[16 * g + j];
            sum += b->scales[g] * sq;
            offs += b->scales[g] * x->bsums[g];
        }
        s = cb_kq_step(s, x->d, cb_half_to_float(b->d), sum - 32 * offs, 0.0f, 0);
    }
    return s;
}

/* q2_k on q8_k (one step per super-block like llama.cpp): per 16 weights
 * scale * sum(q x), and the min through the per-16 sums of x. */
static float dot_q2_k(const void *w, const cb_block_q8_k *x, int n) {
    const cb_block_q2_k *b = w;
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, b++, x++) {
        int32_t sum = 0, mins = 0;
        for (int g = 0; g < 16; g++) {
            int sq = 0;
            for (int j = 0; j < 16; j++) sq += q2_bits(b->qs, 16 * g + j) * x->qs[16 * g + j];
            sum += (b->scales[g] & 0xF) * sq;
            mins += (b->scales[g] >> 4) * x->bsums[g];
        }
        s = cb_kq_step(s, x->d, cb_half_to_float(b->d), sum, cb_half_to_float(b->dmin), mins);
    }
    return s;
}

/* q3_k on q8_k: q - 4 (3rd bit clear) as u . x - 4 * (sum of 16 x), u in 0..7. */
static float dot_q3_k(const void *w, const cb_block_q8_k *x, int n) {
    const cb_block_q3_k *b = w;
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, b++, x++) {
        int32_t sum = 0;
        for (int g = 0; g < 16; g++) {
            int sq = 0;
            for (int j = 0; j < 16; j++) {
                const int e = 16 * g + j, u = q2_bits(b->qs, e) | ((b->hmask[e % 32] >> (e / 32)) & 1) << 2;
                sq += u * x->qs[e];
            }
            sum += scale_q3_k(b->scales, g) * (sq - 4 * x->bsums[g]);
        }
        s = cb_kq_step(s, x->d, cb_half_to_float(b->d), sum, 0.0f, 0);
    }
    return s;
}

/* iq4_xs on q8_k: (scale - 32) * sum(level x) per 32 weights. */
static float dot_iq4_xs(const void *w, const cb_block_q8_k *x, int n) {
    const cb_block_iq4_xs *b = w;
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, b++, x++) {
        int32_t sum = 0;
        for (int g = 0; g < 8; g++) {
            const int ls = ((b->scales_l[g / 2] >> (4 * (g % 2))) & 0xF) | ((b->scales_h >> (2 * g)) & 3) << 4;
            int sq = 0;
            for (int j = 0; j < CB_QK; j++) sq += cb_iq4nl_values[nibble(b->qs + 16 * g, j)] * x->qs[32 * g + j];
            sum += (ls - 32) * sq;
        }
        s = cb_kq_step(s, x->d, cb_half_to_float(b->d), sum, 0.0f, 0);
    }
    return s;
}

cb_dot_block_fn cb_dot_block_scalar(uint32_t dtype) {
    CB_DOT_BLOCK_DISPATCH(dtype);
}

cb_dot_k_fn cb_dot_k_scalar(uint32_t dtype) {
    CB_DOT_K_DISPATCH(dtype);
}

cb_dot_k_fn cb_dot_k(uint32_t dtype) {
#if CB_KERNELS_AVX512
    cb_dot_k_fn f5 = cb_dot_k_avx512(dtype);
    if (f5) return f5;
#endif
#if CB_KERNELS_AVX2
    cb_dot_k_fn f = cb_dot_k_avx2(dtype);
    if (f) return f;
#endif
#if CB_KERNELS_NEON
    cb_dot_k_fn f = cb_dot_k_neon(dtype);
    if (f) return f;
#endif
    return cb_dot_k_scalar(dtype);
}

cb_dot_block_fn cb_dot_block(uint32_t dtype) {
#if CB_KERNELS_AVX512
    cb_dot_block_fn f5 = cb_dot_block_avx512(dtype);
    if (f5) return f5;
#endif
#if CB_KERNELS_AVX2
    cb_dot_block_fn f = cb_dot_block_avx2(dtype);
    if (f) return f;
#endif
#if CB_KERNELS_NEON
    cb_dot_block_fn f = cb_dot_block_neon(dtype);
    if (f) return f;
#endif
    return cb_dot_block_scalar(dtype);
}
