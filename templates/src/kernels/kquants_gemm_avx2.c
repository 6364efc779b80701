/* Four rows of q4_k, q5_k or q6_k against many tokens' q8_k rows at once
 * (prompts), AVX2. The one-row kernels (kquants_avx2.c) unpack every
 * super-block's nibbles and scales again for each token; here a super-block
 * of four rows is unpacked once into unsigned bytes and int16 scale vectors
 * (about 2 KB, in L1) and every token of the call is then a load of its
 * activations and maddubs / madd / add per 32 weights and row. Each
 * (row, token) result is bit for bit the one-row kernel's (and so the scalar
 * reference's): the integer sums are exact whatever their order, and the
 * float step per super-block is cb_kq_step's operations, in super-block
 * order, one lane per row. */
#include <immintrin.h>
#include <string.h>

#include "kernels.h"

static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

enum { K_Q4, K_Q5, K_Q6 };

/* One row's super-block, unpacked: group c's 32 weights as unsigned bytes
 * (q6_k's with 32 added), the int16 scale of each of maddubs' 16 pair sums
 * of group c, and per x's 16 bsums the int16 factor they meet (q4_k / q5_k:
 * the group's min; q6_k: the 16-weight scale, for the -32 offset). */
typedef struct {
    __m256i w[8], sc[8], m;
} unpacked;

/* cb_kq_step on four lanes (the four rows), as kquants4_avx2.c's. */
static inline __m128 kq_step4(__m128 s, float dx, __m128 d, __m128i sum, __m128 dmin, __m128i mins) {
    const __m128 vdx = _mm_set1_ps(dx);
#if defined(__FMA__)
    return _mm_fnmadd_ps(_mm_mul_ps(vdx, dmin), _mm_cvtepi32_ps(mins),
                         _mm_fmadd_ps(_mm_mul_ps(vdx, d), _mm_cvtepi32_ps(sum), s));
#else
    const __m128 a = _mm_mul_ps(_mm_mul_ps(vdx, d), _mm_cvtepi32_ps(sum));
    const __m128 b = _mm_mul_ps(_mm_mul_ps(vdx, dmin), _mm_cvtepi32_ps(mins));
    return _mm_sub_ps(_mm_add_ps(s, a), b);
#endif
}

/* The sums of each of four vectors' eight int32 lanes, as four lanes. */
static inline __m128i hsum4_i32(const __m256i v[4]) {
    __m128i h[4];
    for (int r = 0; r < 4; r++) h[r] = _mm_add_epi32(_mm256_castsi256_si128(v[r]), _mm256_extracti128_si256(v[r], 1));
    return _mm_hadd_epi32(_mm_hadd_epi32(h[0], h[1]), _mm_hadd_epi32(h[2], h[3]));
}

/* Four fp16 fields (at p[r] + off) as floats. */
static inline __m128 halves4(const uint8_t *const p[4], size_t off) {
    uint16_t h[4];
    for (int r = 0; r < 4; r++) memcpy(&h[r], p[r] + off, 2);
    return _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)h));
}

/* Shuffles putting word 2k of a lane in every word of the low lane and word
 * 2k + 1 in every word of the high one (q6_k's two scales of group k). */
static const uint8_t pick6[4][32] __attribute__((aligned(32))) = {
#define PICK(k) {4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1,  \
                 4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3,  \
                 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3}
    PICK(0), PICK(1), PICK(2), PICK(3)
#undef PICK
};

/* Shuffles putting word c of a lane in every word. */
static const uint8_t pick4[8][32] __attribute__((aligned(32))) = {
#define PICK(c) {2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, \
                 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, \
                 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1}
    PICK(0), PICK(1), PICK(2), PICK(3), PICK(4), PICK(5), PICK(6), PICK(7)
#undef PICK
};

/* Q4_K / Q5_K: group c is the low (even c) or high nibbles of qs[32 (c / 2)..]
 * with bit c of qh[0..31] as bit 4 (q5_k); the 6-bit scales and mins of
 * kquants.c's scale_min_k4, four at a time in 32-bit words (bytes 0..3 of
 * the 12 hold scales 0..3 and bits 4..5 of scales 4..7, bytes 4..7 mins 0..3
 * and bits 4..5 of mins 4..7, bytes 8..11 the low 4 bits of both). */
static inline __attribute__((always_inline)) void unpack_q45(const uint8_t *blk, int q5, unpacked *u) {
    const __m256i low4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    const uint8_t *qs = blk + (q5 ? offsetof(cb_block_q5_k, qs) : offsetof(cb_block_q4_k, qs));
    uint32_t s0, s1, s2, scm[4];
    memcpy(&s0, blk + 4, 4), memcpy(&s1, blk + 8, 4), memcpy(&s2, blk + 12, 4);
    scm[0] = s0 & 0x3F3F3F3Fu;
    scm[1] = (s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u);
    scm[2] = s1 & 0x3F3F3F3Fu;
    scm[3] = ((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u);
    /* bytes: scales 0..7, mins 0..7 */
    const __m128i bytes = _mm_loadu_si128((const __m128i *)scm);
    const __m256i sc16 = _mm256_cvtepu8_epi16(bytes);
    const __m256i scales = _mm256_permute4x64_epi64(sc16, 0x44);
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) u->sc[g] = _mm256_shuffle_epi8(scales, load32(pick4[g]));
    u->m = _mm256_cvtepu8_epi16(
        _mm_shuffle_epi8(bytes, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
    const __m256i hb = q5 ? load32(blk + offsetof(cb_block_q5_k, qh)) : _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m256i q = load32(qs + 32 * j);
        u->w[2 * j] = _mm256_and_si256(q, low4);
        u->w[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
    }
    if (q5)
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++)
            u->w[c] = _mm256_or_si256(u->w[c], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, c), one), 4));
}

/* Q6_K: kquants4_avx2.c's unpacking, the bytes q + 32 (0..63). */
static inline __attribute__((always_inline)) void unpack_q6(const cb_block_q6_k *b, unpacked *u) {
    const __m256i low4 = _mm256_set1_epi8(0xF), bits45 = _mm256_set1_epi8(0x30);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
    const __m256i sc_halves[2] = {_mm256_permute4x64_epi64(sc16, 0x44), _mm256_permute4x64_epi64(sc16, 0xEE)};
    u->m = sc16;
#pragma GCC unroll 2
    for (int half = 0; half < 2; half++) {
        const __m256i sc_half = sc_halves[half];
        const __m256i l0 = load32(b->ql + 64 * half), l1 = load32(b->ql + 64 * half + 32);
        const __m256i h = load32(b->qh + 32 * half);
        __m256i *w = u->w + 4 * half;
        w[0] = _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_and_si256(_mm256_slli_epi16(h, 4), bits45));
        w[1] = _mm256_or_si256(_mm256_and_si256(l1, low4), _mm256_and_si256(_mm256_slli_epi16(h, 2), bits45));
        w[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(h, bits45));
        w[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                               _mm256_and_si256(_mm256_srli_epi16(h, 2), bits45));
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) u->sc[4 * half + k] = _mm256_shuffle_epi8(sc_half, load32(pick6[k]));
    }
}

/* nt (1 or 2) tokens' super-block i against the four unpacked rows: s[t]'s
 * four lanes take one float step each. */
static inline __attribute__((always_inline)) void tokens_step(int type, const unpacked u[4], const cb_block_q8_k *const *x,
                                                             int i, int nt, __m128 d4, __m128 dmin4, __m128 *s) {
    __m256i acc[2][4], am[2][4];
#pragma GCC unroll 2
    for (int t = 0; t < nt; t++)
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) acc[t][r] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        __m256i xv[2];
#pragma GCC unroll 2
        for (int t = 0; t < nt; t++) xv[t] = load32(x[t][i].qs + 32 * c);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 2
            for (int t = 0; t < nt; t++)
                acc[t][r] = _mm256_add_epi32(acc[t][r],
                                             _mm256_madd_epi16(_mm256_maddubs_epi16(u[r].w[c], xv[t]), u[r].sc[c]));
    }
#pragma GCC unroll 2
    for (int t = 0; t < nt; t++) {
        const __m256i bsums = load32(x[t][i].bsums);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __m256i mb = _mm256_madd_epi16(u[r].m, bsums);
            if (type == K_Q6) acc[t][r] = _mm256_sub_epi32(acc[t][r], _mm256_slli_epi32(mb, 5)); /* q - 32 */
            else am[t][r] = mb;
        }
        s[t] = kq_step4(s[t], x[t][i].d, d4, hsum4_i32(acc[t]), dmin4,
                        type == K_Q6 ? _mm_setzero_si128() : hsum4_i32(am[t]));
    }
}

/* Tokens handed to the float steps at once (their running sums stay on the
 * stack); more are taken in turn, each turn unpacking the rows again. */
#define TOKENS_AT_ONCE 64

static inline __attribute__((always_inline)) void tokens_k(int type, const void *w, size_t row_bytes,
                                                          const cb_block_q8_k *const *x, int n_tok, int n, float *out) {
    const size_t block = type == K_Q4 ? sizeof(cb_block_q4_k) : type == K_Q5 ? sizeof(cb_block_q5_k)
                                                                              : sizeof(cb_block_q6_k);
    const int nb = n / CB_QK_K;
    for (int t0 = 0; t0 < n_tok; t0 += TOKENS_AT_ONCE) {
        const int tn = n_tok - t0 < TOKENS_AT_ONCE ? n_tok - t0 : TOKENS_AT_ONCE;
        const cb_block_q8_k *const *xt = x + t0;
        __m128 s[TOKENS_AT_ONCE];
        for (int t = 0; t < tn; t++) s[t] = _mm_setzero_ps();
        for (int i = 0; i < nb; i++) {
            unpacked u[4];
            const uint8_t *blk[4];
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                blk[r] = (const uint8_t *)w + (size_t)r * row_bytes + (size_t)i * block;
                if (i + 1 < nb)
                    for (size_t o = 0; o < block; o += 64) cb_prefetch(blk[r] + block + o);
                if (type == K_Q6) unpack_q6((const cb_block_q6_k *)blk[r], &u[r]);
                else unpack_q45(blk[r], type == K_Q5, &u[r]);
            }
            __m128 d4, dmin4;
            if (type == K_Q6) {
                d4 = halves4(blk, offsetof(cb_block_q6_k, d));
                dmin4 = _mm_setzero_ps();
            } else {
                d4 = halves4(blk, offsetof(cb_block_q4_k, d));
                dmin4 = halves4(blk, offsetof(cb_block_q4_k, dmin));
            }
            int t = 0;
            for (; t + 2 <= tn; t += 2) tokens_step(type, u, xt + t, i, 2, d4, dmin4, s + t);
            if (t < tn) tokens_step(type, u, xt + t, i, 1, d4, dmin4, s + t);
        }
        for (int t = 0; t < tn; t++) _mm_storeu_ps(out + 4 * (size_t)(t0 + t), s[t]);
    }
}

static void tokens_q4_k(const void *w, size_t row_bytes, const cb_block_q8_k *const *x, int n_tok, int n, float *out) {
    tokens_k(K_Q4, w, row_bytes, x, n_tok, n, out);
}
static void tokens_q5_k(const void *w, size_t row_bytes, const cb_block_q8_k *const *x, int n_tok, int n, float *out) {
    tokens_k(K_Q5, w, row_bytes, x, n_tok, n, out);
}
static void tokens_q6_k(const void *w, size_t row_bytes, const cb_block_q8_k *const *x, int n_tok, int n, float *out) {
    tokens_k(K_Q6, w, row_bytes, x, n_tok, n, out);
}

cb_tokens_k_fn cb_tokens_k_avx2(uint32_t dtype) {
    switch (dtype) {
    case CB_Q4_K: return tokens_q4_k;
    case CB_Q5_K: return tokens_q5_k;
    case CB_Q6_K: return tokens_q6_k;
    }
    return NULL;
}
