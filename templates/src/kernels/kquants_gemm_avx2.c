/* Eight rows of q4_k, q5_k, q6_k, q3_k, q2_k or iq4_xs against many tokens'
 * q8_k rows at once (prompts), AVX2. A super-block of the eight rows is
 * unpacked once into a tile on the stack (about 3 KB, in L1): the weights as
 * unsigned bytes (iq4_xs without VNNI: signed levels) laid out
 * row-interleaved, four weights of each row in turn (dword r of a vector is
 * row r's), and the scales as int16 in the same lanes. A token then costs,
 * per four weights of the eight rows, a broadcast of its four bytes, one
 * maddubs and one 16-bit add; a madd per scale group brings in the scales
 * (iq4_xs: tokens_step). Every int32 lane is one row's sum, so no lane is
 * ever summed across (the one-row kernels' per-super-block reduction).
 *
 * Each (row, token) result is bit for bit the one-row kernel's (and so the
 * scalar reference's): the integer sums are exact whatever their order (the
 * 16-bit partial sums stay in range, below), and the float step per
 * super-block is cb_kq_step's operations, in super-block order, one lane per
 * row. */
#include <immintrin.h>
#include <string.h>

#include "kernels.h"
#include "kquants_x86.h"

static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

enum { K_Q4, K_Q5, K_Q6, K_Q3, K_Q2, K_IQ4XS };
/* The types with a scale a 16 weights (four k-steps), against the bsums in
 * pairs as q6_k. */
#define PER16(type) ((type) == K_Q6 || (type) == K_Q3 || (type) == K_Q2)

/* 256-bit dpbusd (kquants_x86.h): AVX-512 VNNI (with VL) or AVX-VNNI (iq4_xs). */
#define VNNI CB_VNNI256
#if VNNI
#define dpbusd cb_dpbusd256
#endif
#define ROWS 8 /* a vector's dwords */
#ifndef CB_TOKENS_K_WIDE
_Static_assert(ROWS == CB_TOKENS_K_ROWS, "the rows a call takes (matmul.c) are the tile's lanes");
#endif

/* Four weights' k-steps of a super-block (64). maddubs' pair sums, added
 * over STEPS16 k-steps in int16 before one madd with their scale, stay in
 * range: q4_k 8 steps of 2 * 15 * 128, q5_k 4 of 2 * 31 * 128, q6_k (q + 32)
 * 2 of 2 * 63 * 128, q3_k (q + 4) and q2_k 4 (a scale's 16 weights) of
 * 2 * 7 * 128, all under 32768 (x is -127..127; -128 would fit too).
 * iq4_xs goes its own way (tokens_step). */
#define STEPS (CB_QK_K / 4)
#define STEPS16(type) ((type) == K_Q4 ? 8 : (type) == K_Q5 || (type) == K_Q3 || (type) == K_Q2 ? 4 : 2)

/* A super-block of eight rows, unpacked. */
typedef struct {
    __m256i q[STEPS]; /* k-step s: weights 4s..4s+3 of row r in dword r, unsigned (q6_k: q + 32, q3_k:
                         q + 4; iq4_xs: the signed level, or level + 128 with VNNI) */
    __m256i sc[16];   /* k-step s's scale (q4_k / q5_k / iq4_xs: sc[s / 8]; q6_k / q3_k / q2_k: sc[s / 4]),
                         int16 twice in dword r (iq4_xs with VNNI: int32) */
    __m256i m[8];     /* against bsums 2p, 2p + 1: q4_k / q5_k group p's min twice, iq4_xs its scale twice;
                         q6_k / q3_k scales 2p, 2p + 1; q2_k mins 2p, 2p + 1 */
    __m256 d, dmin;
} tile;

/* out[m] = dword m of in[0..7], in order: an 8 x 8 transpose of dwords. */
static inline __attribute__((always_inline)) void transpose8(const __m256i in[8], __m256i out[8]) {
    __m256i t[8], u[8];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        t[2 * k] = _mm256_unpacklo_epi32(in[2 * k], in[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_epi32(in[2 * k], in[2 * k + 1]);
    }
#pragma GCC unroll 2
    for (int k = 0; k < 2; k++) {
        u[4 * k] = _mm256_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 1] = _mm256_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 2] = _mm256_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
        u[4 * k + 3] = _mm256_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        out[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
        out[k + 4] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
    }
}

/* 32 bytes at each row's blk + off, transposed (dword r of out[m]: row r's bytes 4m..4m+3). */
static inline __attribute__((always_inline)) void rows32(const uint8_t *const blk[ROWS], size_t off, __m256i out[8]) {
    __m256i in[8];
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++) in[r] = load32(blk[r] + off);
    transpose8(in, out);
}

/* Eight fp16 fields (at p[r] + off) as floats. */
static inline __m256 halves8_at(const uint8_t *const p[ROWS], size_t off) {
    uint16_t h[ROWS];
    for (int r = 0; r < ROWS; r++) memcpy(&h[r], p[r] + off, 2);
    return _mm256_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3], (short)h[4], (short)h[5],
                                          (short)h[6], (short)h[7]));
}

/* The low (word 0) or high (word 1) int16 of each dword, twice. */
static inline __m256i dup_word(__m256i v, int high) {
    const __m256i lo = _mm256_setr_epi32(0x01000100, 0x05040504, 0x09080908, 0x0D0C0D0C, 0x01000100, 0x05040504,
                                         0x09080908, 0x0D0C0D0C);
    return _mm256_shuffle_epi8(v, high ? _mm256_add_epi8(lo, _mm256_set1_epi8(2)) : lo);
}

/* Q4_K / Q5_K: group c (k-steps 8c..8c+7) is the low (even c) or high
 * nibbles of qs[32 (c / 2)..], with bit c of qh[0..31] as bit 4 (q5_k). */
static inline __attribute__((always_inline)) void unpack_q45(const uint8_t *const blk[ROWS], int q5, tile *u) {
    const __m256i low4 = _mm256_set1_epi8(0xF), bit4 = _mm256_set1_epi8(0x10);
    const size_t qs = q5 ? offsetof(cb_block_q5_k, qs) : offsetof(cb_block_q4_k, qs);
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m256i t[8];
        rows32(blk, qs + 32 * j, t);
#pragma GCC unroll 8
        for (int m = 0; m < 8; m++) {
            u->q[16 * j + m] = _mm256_and_si256(t[m], low4);
            u->q[16 * j + 8 + m] = _mm256_and_si256(_mm256_srli_epi16(t[m], 4), low4);
        }
    }
    if (q5) {
        __m256i h[8];
        rows32(blk, offsetof(cb_block_q5_k, qh), h);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++)
#pragma GCC unroll 8
            for (int m = 0; m < 8; m++) { /* bit c to bit 4, shifted in 16-bit lanes and masked */
                const __m256i b = c < 4 ? _mm256_slli_epi16(h[m], 4 - c) : _mm256_srli_epi16(h[m], c - 4);
                u->q[8 * c + m] = _mm256_or_si256(u->q[8 * c + m], _mm256_and_si256(b, bit4));
            }
    }
    /* Each row's 8 scales and 8 mins as int16, dword p: (sc 2p, sc 2p + 1),
     * then (m 2p - 8, m 2p - 7); transposed, dword r is row r's. */
    __m256i w[8], p[8];
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++) {
        uint64_t sc, mn;
        cb_q45_scales_mins(blk[r] + offsetof(cb_block_q4_k, scales), &sc, &mn);
        w[r] = _mm256_cvtepu8_epi16(_mm_set_epi64x((long long)mn, (long long)sc));
    }
    transpose8(w, p);
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        u->sc[c] = dup_word(p[c / 2], c % 2);
        u->m[c] = dup_word(p[4 + c / 2], c % 2);
    }
    u->d = halves8_at(blk, offsetof(cb_block_q4_k, d));
    u->dmin = halves8_at(blk, offsetof(cb_block_q4_k, dmin));
}

/* Q6_K: half h's groups (k-steps 32h + 8k + m, k = 0..3) as kquants_avx2.c
 * dot_q6_k's u[k]: ql[64h..] / ql[64h + 32..] low then high nibbles, qh[32h..]
 * >> 2k as bits 4..5; q + 32, 0..63. */
static inline __attribute__((always_inline)) void unpack_q6(const uint8_t *const blk[ROWS], tile *u) {
    const __m256i low4 = _mm256_set1_epi8(0xF), bits45 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 2
    for (int half = 0; half < 2; half++) {
        __m256i l0[8], l1[8], h[8];
        rows32(blk, offsetof(cb_block_q6_k, ql) + 64 * half, l0);
        rows32(blk, offsetof(cb_block_q6_k, ql) + 64 * half + 32, l1);
        rows32(blk, offsetof(cb_block_q6_k, qh) + 32 * half, h);
        __m256i *q = u->q + 32 * half;
#pragma GCC unroll 8
        for (int m = 0; m < 8; m++) {
            q[m] = _mm256_or_si256(_mm256_and_si256(l0[m], low4), _mm256_and_si256(_mm256_slli_epi16(h[m], 4), bits45));
            q[8 + m] = _mm256_or_si256(_mm256_and_si256(l1[m], low4), _mm256_and_si256(_mm256_slli_epi16(h[m], 2), bits45));
            q[16 + m] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0[m], 4), low4), _mm256_and_si256(h[m], bits45));
            q[24 + m] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1[m], 4), low4),
                                        _mm256_and_si256(_mm256_srli_epi16(h[m], 2), bits45));
        }
    }
    /* The 16 signed scales as int16, dword p: (sc 2p, sc 2p + 1); transposed. */
    __m256i w[8], p[8];
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++)
        w[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk[r] + offsetof(cb_block_q6_k, scales))));
    transpose8(w, p);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        u->m[k] = p[k];
        u->sc[2 * k] = dup_word(p[k], 0);
        u->sc[2 * k + 1] = dup_word(p[k], 1);
    }
    u->d = halves8_at(blk, offsetof(cb_block_q6_k, d));
    u->dmin = _mm256_setzero_ps();
}

/* Sixteen int16 per row (w[r]: row r's 0..15) to the tile's per-16 fields:
 * sc[2p], sc[2p + 1] word 2p / 2p + 1 twice, and, where m, the pair as is. */
static inline __attribute__((always_inline)) void per16(__m256i w[8], __m256i *sc, __m256i *m) {
    __m256i p[8];
    transpose8(w, p);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        if (m) m[k] = p[k];
        if (sc) sc[2 * k] = dup_word(p[k], 0), sc[2 * k + 1] = dup_word(p[k], 1);
    }
}

/* Q3_K / Q2_K: k-step 32h + 8j + m is bits 2j..2j+1 of qs[32h + 4m..]
 * (kquants.c q2_bits); q3_k's third bit is bit 4h + j of hmask[4m..], so
 * q3_k's q + 4 is 0..7. */
static inline __attribute__((always_inline)) void unpack_q23(const uint8_t *const blk[ROWS], int q3, tile *u) {
    const __m256i low2 = _mm256_set1_epi8(3), bit2 = _mm256_set1_epi8(4);
    const size_t qs = q3 ? offsetof(cb_block_q3_k, qs) : offsetof(cb_block_q2_k, qs);
#pragma GCC unroll 2
    for (int half = 0; half < 2; half++) {
        __m256i t[8];
        rows32(blk, qs + 32 * half, t);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
#pragma GCC unroll 8
            for (int m = 0; m < 8; m++)
                u->q[32 * half + 8 * j + m] = _mm256_and_si256(_mm256_srli_epi16(t[m], 2 * j), low2);
    }
    __m256i w[8];
    if (q3) {
        __m256i h[8];
        rows32(blk, offsetof(cb_block_q3_k, hmask), h);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++)
#pragma GCC unroll 8
            for (int m = 0; m < 8; m++) { /* bit c to bit 2, shifted in 16-bit lanes and masked */
                const __m256i b = c < 2 ? _mm256_slli_epi16(h[m], 2 - c) : _mm256_srli_epi16(h[m], c - 2);
                u->q[8 * c + m] = _mm256_or_si256(u->q[8 * c + m], _mm256_and_si256(b, bit2));
            }
#pragma GCC unroll 8
        for (int r = 0; r < ROWS; r++) w[r] = _mm256_cvtepi8_epi16(q3_scales(blk[r] + offsetof(cb_block_q3_k, scales)));
        per16(w, u->sc, u->m);
        u->d = halves8_at(blk, offsetof(cb_block_q3_k, d));
        u->dmin = _mm256_setzero_ps();
    } else { /* each scale byte: the scale (low nibble) and the min */
        const __m128i low4 = _mm_set1_epi8(0xF);
        __m256i mn[8];
#pragma GCC unroll 8
        for (int r = 0; r < ROWS; r++) {
            const __m128i v = _mm_loadu_si128((const __m128i *)(blk[r] + offsetof(cb_block_q2_k, scales)));
            w[r] = _mm256_cvtepu8_epi16(_mm_and_si128(v, low4));
            mn[r] = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), low4));
        }
        per16(w, u->sc, NULL);
        per16(mn, NULL, u->m);
        u->d = halves8_at(blk, offsetof(cb_block_q2_k, d));
        u->dmin = halves8_at(blk, offsetof(cb_block_q2_k, dmin));
    }
}

/* IQ4_XS: group g (k-steps 8g..8g+7) is the low then the high nibbles of
 * qs[16g..16g + 15], through the codebook by pshufb: the signed level, or
 * with VNNI level + 128 (1..241), dpbusd's unsigned side. */
static inline __attribute__((always_inline)) void unpack_iq4xs(const uint8_t *const blk[ROWS], tile *u) {
    const __m256i low4 = _mm256_set1_epi8(0xF);
    const __m128i levels = _mm_loadu_si128((const __m128i *)cb_iq4nl_values);
    const __m256i table = _mm256_broadcastsi128_si256(VNNI ? _mm_xor_si128(levels, _mm_set1_epi8((char)0x80)) : levels);
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m256i t[8];
        rows32(blk, offsetof(cb_block_iq4_xs, qs) + 32 * j, t);
#pragma GCC unroll 8
        for (int m = 0; m < 8; m++) { /* bytes 16 (2j + m / 4) + 4 (m % 4).. */
            __m256i *q = u->q + 8 * (2 * j + m / 4) + m % 4;
            q[0] = _mm256_shuffle_epi8(table, _mm256_and_si256(t[m], low4));
            q[4] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(t[m], 4), low4));
        }
    }
    /* The eight scales less 32 as int16 (words 8..15 unused), transposed. */
    __m256i w[8], p[8];
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++)
        w[r] = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_cvtsi64_si128((long long)cb_iq4xs_scales8(blk[r]))),
                                _mm256_set1_epi16(32));
    transpose8(w, p);
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        u->m[g] = dup_word(p[g / 2], g % 2);
        u->sc[g] = VNNI ? _mm256_srai_epi32(u->m[g], 16) : u->m[g];
    }
    u->d = halves8_at(blk, offsetof(cb_block_iq4_xs, d));
    u->dmin = _mm256_setzero_ps();
}

/* cb_kq_step on eight lanes (the eight rows): s + dx * (d * sum - dmin * mins). */
static inline __m256 kq_step8(__m256 s, __m256 dx, __m256 d, __m256i sum, __m256 dmin, __m256i mins) {
#if defined(__FMA__)
    return _mm256_fnmadd_ps(_mm256_mul_ps(dx, dmin), _mm256_cvtepi32_ps(mins),
                            _mm256_fmadd_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(sum), s));
#else
    const __m256 a = _mm256_mul_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(sum));
    const __m256 b = _mm256_mul_ps(_mm256_mul_ps(dx, dmin), _mm256_cvtepi32_ps(mins));
    return _mm256_sub_ps(_mm256_add_ps(s, a), b);
#endif
}

/* Four bytes at p in every dword. */
static inline __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* nt (1..4) tokens' super-block i against the tile: s[t] takes one float step. */
static inline __attribute__((always_inline)) void tokens_step(int type, const tile *u, const cb_block_q8_k *const *x,
                                                             int i, int nt, __m256 *s) {
    const int steps16 = STEPS16(type);
    __m256i acc[4];
    const int8_t *xq[4];
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_si256(), xq[t] = x[t][i].qs;
    if (type == K_IQ4XS) {
#if VNNI
        /* A group's (level + 128) . x in int32 by dpbusd, times its scale;
         * the 128 sum(x) comes off with the bsums. One chain a token: two
         * (more registers) had the weights reloaded for every token and
         * ran 0.80-0.97x q4_k against 1.04-1.14x (the commit). */
#pragma GCC unroll 1
        for (int g = 0; g < 8; g++) {
            __m256i a[4];
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) a[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                const __m256i w = u->q[8 * g + k];
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++) a[t] = dpbusd(a[t], w, bcast4(xq[t] + 4 * (8 * g + k)));
            }
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) acc[t] = _mm256_add_epi32(acc[t], _mm256_mullo_epi32(a[t], u->sc[g]));
        }
#else
        /* maddubs of |level| and x with the level's sign (each pair sum
         * at most 2 * 127 * 127, so madd by the scale every k-step). */
#pragma GCC unroll 2
        for (int k = 0; k < STEPS; k++) {
            const __m256i l = u->q[k], w = _mm256_abs_epi8(l), sc = u->sc[k / 8];
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                const __m256i v = _mm256_maddubs_epi16(w, _mm256_sign_epi8(bcast4(xq[t] + 4 * k), l));
                acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(v, sc));
            }
        }
#endif
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const __m256 dx = _mm256_set1_ps(x[t][i].d);
#if VNNI
            const int16_t *bs = x[t][i].bsums;
            __m256i mb = _mm256_madd_epi16(u->m[0], bcast4((const int8_t *)bs));
#pragma GCC unroll 7
            for (int g = 1; g < 8; g++)
                mb = _mm256_add_epi32(mb, _mm256_madd_epi16(u->m[g], bcast4((const int8_t *)(bs + 2 * g))));
            acc[t] = _mm256_sub_epi32(acc[t], _mm256_slli_epi32(mb, 7));
#endif
            s[t] = kq_step8(s[t], dx, u->d, acc[t], u->dmin, _mm256_setzero_si256());
        }
        return;
    }
    for (int s0 = 0; s0 < STEPS; s0 += steps16) {
        __m256i p[4];
#pragma GCC unroll 8
        for (int k = 0; k < steps16; k++) {
            const __m256i w = u->q[s0 + k];
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                const __m256i v = _mm256_maddubs_epi16(w, bcast4(xq[t] + 4 * (s0 + k)));
                p[t] = k ? _mm256_add_epi16(p[t], v) : v;
            }
            /* Each k-step's sums in registers before the next: left free, gcc
             * ran all the steps' maddubs first and spilled them. */
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) __asm__("" : "+x"(p[t]));
        }
        const __m256i sc = u->sc[PER16(type) ? s0 / 4 : s0 / 8];
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(p[t], sc));
    }
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        /* The mins (q4_k / q5_k / q2_k) or the 32 / 4 taken off q6_k's / q3_k's q, against the per-16 sums of x. */
        const int16_t *bs = x[t][i].bsums;
        __m256i mb = _mm256_madd_epi16(u->m[0], bcast4((const int8_t *)bs));
#pragma GCC unroll 7
        for (int k = 1; k < 8; k++) mb = _mm256_add_epi32(mb, _mm256_madd_epi16(u->m[k], bcast4((const int8_t *)(bs + 2 * k))));
        const __m256 dx = _mm256_set1_ps(x[t][i].d);
        if (type == K_Q6 || type == K_Q3)
            s[t] = kq_step8(s[t], dx, u->d, _mm256_sub_epi32(acc[t], _mm256_slli_epi32(mb, type == K_Q6 ? 5 : 2)),
                            u->dmin, _mm256_setzero_si256());
        else s[t] = kq_step8(s[t], dx, u->d, acc[t], u->dmin, mb);
    }
}

/* Tokens whose running sums are kept at once (on the stack); more are taken
 * in turn, each turn unpacking the rows again. */
#define TOKENS_AT_ONCE 64

static inline __attribute__((always_inline)) void tokens_k(int type, const void *w, size_t row_bytes, int rows,
                                                          const cb_block_q8_k *const *x, int n_tok, int n, float *out,
                                                          const void *next) {
    const size_t block = type == K_Q4   ? sizeof(cb_block_q4_k)
                         : type == K_Q5 ? sizeof(cb_block_q5_k)
                         : type == K_Q6 ? sizeof(cb_block_q6_k)
                         : type == K_Q3 ? sizeof(cb_block_q3_k)
                         : type == K_Q2 ? sizeof(cb_block_q2_k)
                                        : sizeof(cb_block_iq4_xs);
    const int nb = n / CB_QK_K;
    /* The next rows (one stretch after these), spread over the super-blocks. */
    const size_t share = ((size_t)rows * row_bytes / (size_t)nb + 63) / 64 * 64;
    for (int t0 = 0; t0 < n_tok; t0 += TOKENS_AT_ONCE) {
        const int tn = n_tok - t0 < TOKENS_AT_ONCE ? n_tok - t0 : TOKENS_AT_ONCE;
        const cb_block_q8_k *const *xt = x + t0;
        __m256 s[TOKENS_AT_ONCE];
        for (int t = 0; t < tn; t++) s[t] = _mm256_setzero_ps();
        for (int i = 0; i < nb; i++) {
            if (next && t0 == 0)
                for (size_t o = 0; o < share; o += 64) cb_prefetch((const uint8_t *)next + (size_t)i * share + o);
            /* Fewer than eight rows: the last lanes repeat row 0 (their results unused). */
            const uint8_t *blk[ROWS];
            for (int r = 0; r < ROWS; r++) blk[r] = (const uint8_t *)w + (size_t)(r < rows ? r : 0) * row_bytes + (size_t)i * block;
            tile u;
            if (type == K_Q6) unpack_q6(blk, &u);
            else if (type == K_Q3 || type == K_Q2) unpack_q23(blk, type == K_Q3, &u);
            else if (type == K_IQ4XS) unpack_iq4xs(blk, &u);
            else unpack_q45(blk, type == K_Q5, &u);
            int t = 0;
            for (; t + 4 <= tn; t += 4) tokens_step(type, &u, xt + t, i, 4, s + t);
            switch (tn - t) {
            case 3: tokens_step(type, &u, xt + t, i, 3, s + t); break;
            case 2: tokens_step(type, &u, xt + t, i, 2, s + t); break;
            case 1: tokens_step(type, &u, xt + t, i, 1, s + t); break;
            }
        }
        for (int t = 0; t < tn; t++) _mm256_storeu_ps(out + ROWS * (size_t)(t0 + t), s[t]);
    }
}

static void tokens_q4_k(const void *w, size_t row_bytes, int rows, const cb_block_q8_k *const *x, int n_tok, int n,
                        float *out, const void *next) {
    tokens_k(K_Q4, w, row_bytes, rows, x, n_tok, n, out, next);
}
static void tokens_q5_k(const void *w, size_t row_bytes, int rows, const cb_block_q8_k *const *x, int n_tok, int n,
                        float *out, const void *next) {
    tokens_k(K_Q5, w, row_bytes, rows, x, n_tok, n, out, next);
}
static void tokens_q6_k(const void *w, size_t row_bytes, int rows, const cb_block_q8_k *const *x, int n_tok, int n,
                        float *out, const void *next) {
    tokens_k(K_Q6, w, row_bytes, rows, x, n_tok, n, out, next);
}

static void tokens_q3_k(const void *w, size_t row_bytes, int rows, const cb_block_q8_k *const *x, int n_tok, int n,
                        float *out, const void *next) {
    tokens_k(K_Q3, w, row_bytes, rows, x, n_tok, n, out, next);
}
static void tokens_q2_k(const void *w, size_t row_bytes, int rows, const cb_block_q8_k *const *x, int n_tok, int n,
                        float *out, const void *next) {
    tokens_k(K_Q2, w, row_bytes, rows, x, n_tok, n, out, next);
}
static void tokens_iq4_xs(const void *w, size_t row_bytes, int rows, const cb_block_q8_k *const *x, int n_tok, int n,
                          float *out, const void *next) {
    tokens_k(K_IQ4XS, w, row_bytes, rows, x, n_tok, n, out, next);
}

#ifdef CB_TOKENS_K_WIDE
/* ---- AVX-512 VNNI: sixteen rows a call (kernels.h), q4_k / q5_k / q6_k /
 * iq4_xs in zmm. A super-block of the sixteen rows is unpacked as the
 * eight-row tile is, in zmm (dword r: row r; the scales as int32), so a token costs per
 * four weights of the sixteen rows one vpdpbusd with its four bytes as an
 * embedded broadcast, and per scale group one vpmulld and one add (the
 * group's int32 sum times the row's scale; iq4_xs: level + 128, the 128
 * off through the per-16 sums as q6_k's 32). The integer sums are the
 * eight-row tile's (exact), the float step its operations on 16 lanes: the
 * same bits. q3_k and q2_k take the eight-row kernel twice; so do the
 * others' calls of at most eight rows or fewer than WIDE_MIN tokens. */
#define WROWS 16
_Static_assert(WROWS == CB_TOKENS_K_ROWS, "the rows a call takes (matmul.c) are the wide tile's lanes");
/* Tokens a pass over a scale group takes at once: 2 x 8 accumulators. */
#define WIDE_TOKENS 8

typedef struct {
    __m512i q[STEPS]; /* k-step s: as tile.q, rows 0..15 */
    __m512i sc[16];   /* scale group g's scale (k-steps 8g.. or 4g..) as int32 in dword r */
    __m512i m[8];     /* as tile.m */
    __m512 d, dmin;
} wtile;

static inline __m512i join_i(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

/* 64 bytes at each row's blk + off, transposed (dword r of out[m]: row r's
 * bytes 4m..4m+3): 4 x 4 dword transposes in each 128-bit lane, then of
 * the lanes, 64 shuffles a KB (the eight-row tiles' 8 x 8: 96 and a join). */
static inline __attribute__((always_inline)) void rows64(const uint8_t *const blk[WROWS], size_t off, __m512i out[16]) {
    __m512i in[16], t[16], v[4][4];
#pragma GCC unroll 16
    for (int r = 0; r < WROWS; r++) in[r] = _mm512_loadu_si512((const void *)(blk[r] + off));
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        t[2 * k] = _mm512_unpacklo_epi32(in[2 * k], in[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(in[2 * k], in[2 * k + 1]);
    }
    /* v[a][c], lane L: dword 4L + c of rows 4a..4a+3 */
#pragma GCC unroll 4
    for (int a = 0; a < 4; a++) {
        v[a][0] = _mm512_unpacklo_epi64(t[4 * a], t[4 * a + 2]);
        v[a][1] = _mm512_unpackhi_epi64(t[4 * a], t[4 * a + 2]);
        v[a][2] = _mm512_unpacklo_epi64(t[4 * a + 1], t[4 * a + 3]);
        v[a][3] = _mm512_unpackhi_epi64(t[4 * a + 1], t[4 * a + 3]);
    }
    /* out[4L + c], lane a: v[a][c]'s lane L */
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512i s0 = _mm512_shuffle_i32x4(v[0][c], v[1][c], 0x44), s1 = _mm512_shuffle_i32x4(v[0][c], v[1][c], 0xEE);
        const __m512i s2 = _mm512_shuffle_i32x4(v[2][c], v[3][c], 0x44), s3 = _mm512_shuffle_i32x4(v[2][c], v[3][c], 0xEE);
        out[c] = _mm512_shuffle_i32x4(s0, s2, 0x88);
        out[4 + c] = _mm512_shuffle_i32x4(s0, s2, 0xDD);
        out[8 + c] = _mm512_shuffle_i32x4(s1, s3, 0x88);
        out[12 + c] = _mm512_shuffle_i32x4(s1, s3, 0xDD);
    }
}

/* 32 bytes at each row's blk + off, transposed (out[0..7], as rows32). */
static inline __attribute__((always_inline)) void rows32w(const uint8_t *const blk[WROWS], size_t off, __m512i out[8]) {
    __m256i lo[8], hi[8];
    rows32(blk, off, lo);
    rows32(blk + ROWS, off, hi);
#pragma GCC unroll 8
    for (int m = 0; m < 8; m++) out[m] = join_i(lo[m], hi[m]);
}

/* unpack_q45's weights for sixteen rows, in zmm. */
static inline __attribute__((always_inline)) void wide_q45(const uint8_t *const blk[WROWS], int q5, wtile *u) {
    const __m512i low4 = _mm512_set1_epi8(0xF), bit4 = _mm512_set1_epi8(0x10);
    const size_t qs = q5 ? offsetof(cb_block_q5_k, qs) : offsetof(cb_block_q4_k, qs);
#pragma GCC unroll 2
    for (int j = 0; j < 2; j++) {
        __m512i t[16];
        rows64(blk, qs + 64 * j, t);
#pragma GCC unroll 16
        for (int m = 0; m < 16; m++) { /* unpack_q45's 32-byte chunk 2j + m / 8 */
            __m512i *q = u->q + 16 * (2 * j + m / 8) + m % 8;
            q[0] = _mm512_and_si512(t[m], low4);
            q[8] = _mm512_and_si512(_mm512_srli_epi16(t[m], 4), low4);
        }
    }
    if (q5) {
        __m512i h[8];
        rows32w(blk, offsetof(cb_block_q5_k, qh), h);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++)
#pragma GCC unroll 8
            for (int m = 0; m < 8; m++) {
                const __m512i b = c < 4 ? _mm512_slli_epi16(h[m], 4 - c) : _mm512_srli_epi16(h[m], c - 4);
                u->q[8 * c + m] = _mm512_or_si512(u->q[8 * c + m], _mm512_and_si512(b, bit4));
            }
    }
}

/* unpack_q6's weights for sixteen rows, in zmm. */
static inline __attribute__((always_inline)) void wide_q6(const uint8_t *const blk[WROWS], wtile *u) {
    const __m512i low4 = _mm512_set1_epi8(0xF), bits45 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 2
    for (int half = 0; half < 2; half++) {
        __m512i l[16], h[8];
        rows64(blk, offsetof(cb_block_q6_k, ql) + 64 * half, l); /* unpack_q6's l0: l[0..7], l1: l[8..15] */
        rows32w(blk, offsetof(cb_block_q6_k, qh) + 32 * half, h);
        __m512i *q = u->q + 32 * half;
#pragma GCC unroll 8
        for (int m = 0; m < 8; m++) {
            q[m] = _mm512_or_si512(_mm512_and_si512(l[m], low4), _mm512_and_si512(_mm512_slli_epi16(h[m], 4), bits45));
            q[8 + m] = _mm512_or_si512(_mm512_and_si512(l[8 + m], low4), _mm512_and_si512(_mm512_slli_epi16(h[m], 2), bits45));
            q[16 + m] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l[m], 4), low4), _mm512_and_si512(h[m], bits45));
            q[24 + m] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l[8 + m], 4), low4),
                                        _mm512_and_si512(_mm512_srli_epi16(h[m], 2), bits45));
        }
    }
}

/* unpack_iq4xs's weights for sixteen rows (level + 128, VNNI's form), in
 * zmm: chunk j's t[m] is qs bytes 16 (4j + m / 4) + 4 (m % 4).., group
 * 4j + m / 4's k-step m % 4 (low nibbles) and 4 + m % 4 (high). */
static inline __attribute__((always_inline)) void wide_iq4xs(const uint8_t *const blk[WROWS], wtile *u) {
    const __m512i low4 = _mm512_set1_epi8(0xF);
    const __m128i levels = _mm_loadu_si128((const __m128i *)cb_iq4nl_values);
    const __m512i table = _mm512_broadcast_i32x4(_mm_xor_si128(levels, _mm_set1_epi8((char)0x80)));
#pragma GCC unroll 2
    for (int j = 0; j < 2; j++) {
        __m512i t[16];
        rows64(blk, offsetof(cb_block_iq4_xs, qs) + 64 * j, t);
#pragma GCC unroll 16
        for (int m = 0; m < 16; m++) {
            __m512i *q = u->q + 8 * (4 * j + m / 4) + m % 4;
            q[0] = _mm512_shuffle_epi8(table, _mm512_and_si512(t[m], low4));
            q[4] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(t[m], 4), low4));
        }
    }
}

/* 16 bytes at each row's blk + off as four fields (dwords): out[f] dword r
 * is row r's field f. Four rows a zmm (one a lane), each lane's 4 x 4
 * dwords transposed by one permute, then the lanes. */
static inline __attribute__((always_inline)) void fields16(const uint8_t *const blk[WROWS], size_t off, __m512i out[4]) {
    const __m512i by_field = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512i t[4];
#pragma GCC unroll 4
    for (int a = 0; a < 4; a++) { /* lane f: field f of rows 4a..4a+3 */
        __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(blk[4 * a] + off)));
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(blk[4 * a + 1] + off)), 1);
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(blk[4 * a + 2] + off)), 2);
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(blk[4 * a + 3] + off)), 3);
        t[a] = _mm512_permutexvar_epi32(by_field, z);
    }
    const __m512i s0 = _mm512_shuffle_i32x4(t[0], t[1], 0x44), s1 = _mm512_shuffle_i32x4(t[0], t[1], 0xEE);
    const __m512i s2 = _mm512_shuffle_i32x4(t[2], t[3], 0x44), s3 = _mm512_shuffle_i32x4(t[2], t[3], 0xEE);
    out[0] = _mm512_shuffle_i32x4(s0, s2, 0x88);
    out[1] = _mm512_shuffle_i32x4(s0, s2, 0xDD);
    out[2] = _mm512_shuffle_i32x4(s1, s3, 0x88);
    out[3] = _mm512_shuffle_i32x4(s1, s3, 0xDD);
}

/* Per dword: byte b into word 0 and 1 (two = 1; the other bytes zero) or,
 * two = 0, into byte 3 (the rest zero): a vpshufb control. */
static inline __m512i byte_ctl(int b, int two) {
    const __m512i d4 = _mm512_set1_epi32(b * 0x01010101), lanes = _mm512_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0,
        0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404, 0x08080808, 0x0C0C0C0C);
    const __m512i keep = _mm512_set1_epi32(two ? (int)0x80008000 : 0x808080); /* 0x80: zero the byte */
    return _mm512_or_si512(_mm512_add_epi8(d4, lanes), keep);
}

/* Q4_K / Q5_K's scales (int32), mins (int16 twice), d and dmin for sixteen
 * rows as the eight-row tile has them, from the first 16 bytes of the
 * blocks: cb_q45_scales_mins on every row's dwords at once. */
static inline __attribute__((always_inline)) void wide_scales_q45(const uint8_t *const blk[WROWS], wtile *u) {
    __m512i f[4]; /* d | dmin << 16, then the scale bytes' three dwords */
    fields16(blk, offsetof(cb_block_q4_k, d), f);
    _Static_assert(offsetof(cb_block_q4_k, scales) == 4 && offsetof(cb_block_q4_k, dmin) == 2, "the fields' dwords");
    const __m512i lo6 = _mm512_set1_epi32(0x3F3F3F3F), lo4 = _mm512_set1_epi32(0x0F0F0F0F), top2 = _mm512_set1_epi32(0x30303030);
    const __m512i sc[2] = {_mm512_and_si512(f[1], lo6),
                           _mm512_or_si512(_mm512_and_si512(f[3], lo4), _mm512_and_si512(_mm512_srli_epi32(f[1], 2), top2))};
    const __m512i mn[2] = {_mm512_and_si512(f[2], lo6), _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(f[3], 4), lo4),
                                                                        _mm512_and_si512(_mm512_srli_epi32(f[2], 2), top2))};
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        u->sc[g] = _mm512_srli_epi32(_mm512_shuffle_epi8(sc[g / 4], byte_ctl(g % 4, 0)), 24);
        u->m[g] = _mm512_shuffle_epi8(mn[g / 4], byte_ctl(g % 4, 1));
    }
    u->d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(f[0]));
    u->dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(f[0], 16)));
}

/* Q6_K's scales (int32), their pairs (int16), and d for sixteen rows (d
 * from the blocks' last 16 bytes transposed as well; as fast as a gather
 * of the sixteen d at 8 tokens, 87.0 / 86.5 against 87.7 / 88.0 GMAC/s,
 * and no gather). */
static inline __attribute__((always_inline)) void wide_scales_q6(const uint8_t *const blk[WROWS], wtile *u) {
    __m512i f[4]; /* scales 4f..4f+3 */
    fields16(blk, offsetof(cb_block_q6_k, scales), f);
#pragma GCC unroll 16
    for (int g = 0; g < 16; g++) u->sc[g] = _mm512_srai_epi32(_mm512_shuffle_epi8(f[g / 4], byte_ctl(g % 4, 0)), 24);
    /* (scale 2k, scale 2k + 1): bytes 2 (k % 2) and 2 (k % 2) + 1 into words' high bytes, shifted down with sign */
    const __m512i lanes = _mm512_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0,
                                            0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404, 0x08080808, 0x0C0C0C0C);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const int b = 2 * (k % 2);
        const __m512i ctl = _mm512_or_si512(_mm512_add_epi8(_mm512_set1_epi32((b + 1) << 24 | b << 8), lanes),
                                            _mm512_set1_epi32(0x00800080));
        u->m[k] = _mm512_srai_epi16(_mm512_shuffle_epi8(f[k / 2], ctl), 8);
    }
    __m512i e[4]; /* the last 16 bytes: scales 2..15, then d */
    fields16(blk, sizeof(cb_block_q6_k) - 16, e);
    _Static_assert(offsetof(cb_block_q6_k, d) == sizeof(cb_block_q6_k) - 2, "d ends the block");
    u->d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(e[3], 16)));
    u->dmin = _mm512_setzero_ps();
}

/* IQ4_XS's scales less 32 (int32; unpack_iq4xs's m: int16 twice) and d for
 * sixteen rows from the blocks' first dwords: d | scales_h << 16, then
 * scales_l, so group g's low four bits are bits 4g.. of the second and its
 * high two bits 16 + 2g.. of the first (cb_iq4xs_scales8 on every row). */
static inline __attribute__((always_inline)) void wide_scales_iq4xs(const uint8_t *const blk[WROWS], wtile *u) {
    __m512i f[4]; /* f[2], f[3]: qs's first bytes, unused */
    fields16(blk, 0, f);
    _Static_assert(offsetof(cb_block_iq4_xs, scales_h) == 2 && offsetof(cb_block_iq4_xs, scales_l) == 4, "the fields' dwords");
    const __m512i lo4 = _mm512_set1_epi32(0xF), hi2 = _mm512_set1_epi32(0x30), k32 = _mm512_set1_epi32(32);
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        const __m512i sc = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(f[1], 4 * g), lo4),
                                           _mm512_and_si512(_mm512_srli_epi32(f[0], 12 + 2 * g), hi2));
        u->sc[g] = _mm512_sub_epi32(sc, k32); /* -32..31 */
        u->m[g] = _mm512_sub_epi16(_mm512_or_si512(sc, _mm512_slli_epi32(sc, 16)), _mm512_set1_epi16(32)); /* both words */
    }
    u->d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(f[0]));
    u->dmin = _mm512_setzero_ps();
}

/* Four bytes at p in every dword (an embedded broadcast where it feeds vpdpbusd). */
static inline __m512i bcast4w(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* acc + u . the four bytes at p in every dword, the broadcast embedded in
 * the vpdpbusd (gcc loads it into a register first, a uop more). */
static inline __m512i dpbusd_bcast(__m512i acc, __m512i u, const int8_t *p) {
#ifdef KQ_NO_ASM
    return _mm512_dpbusd_epi32(acc, u, bcast4w(p));
#else
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)p));
    return acc;
#endif
}

/* nt (1..WIDE_TOKENS) tokens' super-block i against the wide tile: s[t]
 * takes one float step (kq_step8's operations on 16 lanes). */
static inline __attribute__((always_inline)) void wide_step(int type, const wtile *u, const cb_block_q8_k *const *x,
                                                           int i, int nt, __m512 *s) {
    const int per = PER16(type) ? 4 : 8; /* k-steps a scale group */
    __m512i acc[WIDE_TOKENS];
    const int8_t *xq[WIDE_TOKENS];
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_si512(), xq[t] = x[t][i].qs;
#pragma GCC unroll 1
    for (int g = 0; g < STEPS / per; g++) {
        __m512i a[WIDE_TOKENS];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) a[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < per; k++) {
            const __m512i w = u->q[per * g + k];
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) a[t] = dpbusd_bcast(a[t], w, xq[t] + 4 * (per * g + k));
        }
        const __m512i sc = u->sc[g];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) acc[t] = _mm512_add_epi32(acc[t], _mm512_mullo_epi32(a[t], sc));
    }
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        /* the mins (q4_k / q5_k), the 32 taken off q6_k's q or the 128 off
         * iq4_xs's level + 128 (its scales), against the bsums in pairs */
        const int16_t *bs = x[t][i].bsums;
        __m512i mb = _mm512_madd_epi16(u->m[0], bcast4w(bs));
#pragma GCC unroll 7
        for (int k = 1; k < 8; k++) mb = _mm512_dpwssd_epi32(mb, u->m[k], bcast4w(bs + 2 * k));
        const __m512 dx = _mm512_set1_ps(x[t][i].d);
        __m512i sum = acc[t], mins = mb;
        if (type == K_Q6 || type == K_IQ4XS)
            sum = _mm512_sub_epi32(acc[t], _mm512_slli_epi32(mb, type == K_Q6 ? 5 : 7)), mins = _mm512_setzero_si512();
        s[t] = _mm512_fnmadd_ps(_mm512_mul_ps(dx, u->dmin), _mm512_cvtepi32_ps(mins),
                                _mm512_fmadd_ps(_mm512_mul_ps(dx, u->d), _mm512_cvtepi32_ps(sum), s[t]));
    }
}

static inline __attribute__((always_inline)) void wide_k(int type, const void *w, size_t row_bytes, int rows,
                                                        const cb_block_q8_k *const *x, int n_tok, int n, float *out,
                                                        const void *next) {
    const size_t block = type == K_Q4   ? sizeof(cb_block_q4_k)
                         : type == K_Q5 ? sizeof(cb_block_q5_k)
                         : type == K_Q6 ? sizeof(cb_block_q6_k)
                                        : sizeof(cb_block_iq4_xs);
    const int nb = n / CB_QK_K;
    const size_t share = ((size_t)rows * row_bytes / (size_t)nb + 63) / 64 * 64;
    size_t off[WROWS]; /* each row's block from row 0's (rows past the last: row 0 again, their results unused) */
    for (int r = 0; r < WROWS; r++) off[r] = (size_t)(r < rows ? r : 0) * row_bytes;
    for (int t0 = 0; t0 < n_tok; t0 += TOKENS_AT_ONCE) {
        const int tn = n_tok - t0 < TOKENS_AT_ONCE ? n_tok - t0 : TOKENS_AT_ONCE;
        const cb_block_q8_k *const *xt = x + t0;
        __m512 s[TOKENS_AT_ONCE];
        for (int t = 0; t < tn; t++) s[t] = _mm512_setzero_ps();
        for (int i = 0; i < nb; i++) {
            if (next && t0 == 0)
                for (size_t o = 0; o < share; o += 64) cb_prefetch((const uint8_t *)next + (size_t)i * share + o);
            const uint8_t *blk[WROWS];
            for (int r = 0; r < WROWS; r++) blk[r] = (const uint8_t *)w + (size_t)i * block + off[r];
            wtile u;
            if (type == K_Q6) wide_q6(blk, &u), wide_scales_q6(blk, &u);
            else if (type == K_IQ4XS) wide_iq4xs(blk, &u), wide_scales_iq4xs(blk, &u);
            else wide_q45(blk, type == K_Q5, &u), wide_scales_q45(blk, &u);
            int t = 0;
            for (; t + WIDE_TOKENS <= tn; t += WIDE_TOKENS) wide_step(type, &u, xt + t, i, WIDE_TOKENS, s + t);
            switch (tn - t) { /* the token count a constant in each */
            case 7: wide_step(type, &u, xt + t, i, 7, s + t); break;
            case 6: wide_step(type, &u, xt + t, i, 6, s + t); break;
            case 5: wide_step(type, &u, xt + t, i, 5, s + t); break;
            case 4: wide_step(type, &u, xt + t, i, 4, s + t); break;
            case 3: wide_step(type, &u, xt + t, i, 3, s + t); break;
            case 2: wide_step(type, &u, xt + t, i, 2, s + t); break;
            case 1: wide_step(type, &u, xt + t, i, 1, s + t); break;
            }
        }
        for (int t = 0; t < tn; t++) _mm512_storeu_ps(out + WROWS * (size_t)(t0 + t), s[t]);
    }
}

/* Up to sixteen rows as (at most) two calls of the eight-row kernel f,
 * their results re-strided (rows 0..7 then 8..15 of each token). */
static void by_halves(cb_tokens_k_fn f, const void *w, size_t row_bytes, int rows, const cb_block_q8_k *const *x,
                      int n_tok, int n, float *out, const void *next) {
    float part[TOKENS_AT_ONCE * ROWS];
    for (int h = 0; h * ROWS < rows; h++) {
        const int hn = rows - h * ROWS < ROWS ? rows - h * ROWS : ROWS;
        const uint8_t *hw = (const uint8_t *)w + (size_t)h * ROWS * row_bytes;
        const void *hnext = h == 0 && rows > ROWS ? (const void *)(hw + ROWS * row_bytes) : next;
        for (int t0 = 0; t0 < n_tok; t0 += TOKENS_AT_ONCE) {
            const int tn = n_tok - t0 < TOKENS_AT_ONCE ? n_tok - t0 : TOKENS_AT_ONCE;
            f(hw, row_bytes, hn, x + t0, tn, n, part, t0 ? NULL : hnext);
            for (int t = 0; t < tn; t++) memcpy(out + WROWS * (size_t)(t0 + t) + h * ROWS, part + ROWS * t, sizeof(float) * ROWS);
        }
    }
}

/* Tokens from which the sixteen-row kernel takes a call; fewer go to the
 * eight-row one, twice. From memory (colibri-kernel-bench --types, 1024
 * columns, two alternating runs, load 1.2-1.4) the sixteen rows at 4 and 8
 * tokens ran q4_k 22.1 / 17.7 and 36.0 / 30.0 token-GB/s against the eight
 * rows' 35.1 / 30.4 and 45.0 / 42.6 (q6_k alike), even at 16 (48.4 / 49.3
 * against 53.5 / 47.7); from L2 they win from 3 tokens (the commit).
 * iq4_xs alike: from memory 4 tokens lost, 8 even (docs/kernels.md). */
#define WIDE_MIN 16
#define WIDE(name, type)                                                                                               \
    static void wide_##name(const void *w, size_t row_bytes, int rows, const cb_block_q8_k *const *x, int n_tok,     \
                            int n, float *out, const void *next) {                                                   \
        if (rows <= ROWS || n_tok < WIDE_MIN) by_halves(tokens_##name, w, row_bytes, rows, x, n_tok, n, out, next);   \
        else wide_k(type, w, row_bytes, rows, x, n_tok, n, out, next);                                                \
    }
WIDE(q4_k, K_Q4)
WIDE(q5_k, K_Q5)
WIDE(q6_k, K_Q6)
WIDE(iq4_xs, K_IQ4XS)
#define HALVES(name)                                                                                                   \
    static void halves_##name(const void *w, size_t row_bytes, int rows, const cb_block_q8_k *const *x, int n_tok,   \
                              int n, float *out, const void *next) {                                                 \
        by_halves(tokens_##name, w, row_bytes, rows, x, n_tok, n, out, next);                                         \
    }
HALVES(q3_k)
HALVES(q2_k)

cb_tokens_k_fn cb_tokens_k_avx512(uint32_t dtype) {
    switch (dtype) {
    case CB_Q4_K: return wide_q4_k;
    case CB_Q5_K: return wide_q5_k;
    case CB_Q6_K: return wide_q6_k;
    case CB_Q3_K: return halves_q3_k;
    case CB_Q2_K: return halves_q2_k;
    case CB_IQ4_XS: return wide_iq4_xs;
    }
    return NULL;
}
#endif

cb_tokens_k_fn cb_tokens_k_avx2(uint32_t dtype) {
    switch (dtype) {
    case CB_Q4_K: return tokens_q4_k;
    case CB_Q5_K: return tokens_q5_k;
    case CB_Q6_K: return tokens_q6_k;
    case CB_Q3_K: return tokens_q3_k;
    case CB_Q2_K: return tokens_q2_k;
    case CB_IQ4_XS: return tokens_iq4_xs;
    }
    return NULL;
}
