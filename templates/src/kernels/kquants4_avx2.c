/* Four rows at a time of the types on q8_k activations, AVX2: q4_k, q5_k
 * and q6_k, whose one-row kernels (kquants_avx2.c) pay a super-block's
 * fixed work (its int32 lanes summed, its float step) and a call per row;
 * here the activations' loads and per-32 sums are shared, four rows' lanes
 * are reduced by one tree and their float steps are one four-lane
 * cb_kq_step. Row i's result is bit for bit the one-row kernel's (and so
 * the scalar reference's): the integer sums are exact, and each lane takes
 * the scalar step's operations in its order. */
#include <immintrin.h>
#include <string.h>

#include "kernels.h"
#include "kquants_x86.h"

static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* cb_kq_step on four lanes: s + dx * (d * sum - dmin * mins). */
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

/* The sums of each of four vectors' four int32 lanes, as four lanes. */
static inline __attribute__((always_inline)) __m128i sum4_i32(__m128i a, __m128i b, __m128i c, __m128i d) {
    return _mm_hadd_epi32(_mm_hadd_epi32(a, b), _mm_hadd_epi32(c, d));
}
/* The same of eight lanes. */
static inline __attribute__((always_inline)) __m128i hsum4_i32(const __m256i v[4]) {
#define H(r) _mm_add_epi32(_mm256_castsi256_si128(v[r]), _mm256_extracti128_si256(v[r], 1))
    return sum4_i32(H(0), H(1), H(2), H(3));
#undef H
}

static inline uint32_t u32_at(const uint8_t *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    return u;
}
/* The two fp16 values in the dword at each of p[0..3] as four floats each
 * (lo: the low halves). The dwords are inserted in registers (four 2-byte
 * stores read back as one load stall store forwarding), and this and the
 * sums above are written without loops: gcc kept the loop forms' arrays on
 * the stack. */
static inline __attribute__((always_inline)) void halves4x2(const uint8_t *const p[4], __m128 *lo, __m128 *hi) {
    __m128i v = _mm_cvtsi32_si128((int)u32_at(p[0]));
    v = _mm_insert_epi32(v, (int)u32_at(p[1]), 1);
    v = _mm_insert_epi32(v, (int)u32_at(p[2]), 2);
    v = _mm_insert_epi32(v, (int)u32_at(p[3]), 3);
    const __m256 f = _mm256_cvtph_ps(v);
    const __m128 f0 = _mm256_castps256_ps128(f), f1 = _mm256_extractf128_ps(f, 1);
    *lo = _mm_shuffle_ps(f0, f1, 0x88), *hi = _mm_shuffle_ps(f0, f1, 0xDD);
}

/* The next four rows' bytes (they follow these rows in memory: one
 * stretch), spread over the super-blocks: share bytes per super-block, four
 * blocks' in whole lines. A constant of the type (not 4 * row_bytes / nb, a
 * division a call), so the loop unrolls. */
static inline size_t prefetch_share(size_t block) { return (4 * block + 63) / 64 * 64; }
static inline __attribute__((always_inline)) void prefetch_next(const void *next, size_t share, int i) {
    if (!next) return;
    const uint8_t *p = (const uint8_t *)next + (size_t)i * share;
#pragma GCC unroll 16
    for (size_t o = 0; o < share; o += 64) cb_prefetch(p + o);
}

/* Shuffles putting word 2k of a row's eight scales in words 0..3 of each
 * lane and word 2k + 1 in words 4..7: the layout of hadd_epi16 of groups
 * 2k's and 2k + 1's pair sums. */
static const uint8_t pick4x2[4][32] __attribute__((aligned(32))) = {
#define A(k) 4 * k, 4 * k + 1
#define B(k) 4 * k + 2, 4 * k + 3
#define PICK(k) {A(k), A(k), A(k), A(k), B(k), B(k), B(k), B(k), A(k), A(k), A(k), A(k), B(k), B(k), B(k), B(k)}
    PICK(0), PICK(1), PICK(2), PICK(3)
#undef PICK
#undef A
#undef B
};

/* Q4_K / Q5_K, each row as kquants_avx2.c dot_q45_k: group c (0..7) the low
 * (even c) or high nibbles of qs[32 * (c / 2)..] (plus bit c of qh for q5),
 * its 6-bit scale in madd, its min against the per-32 sums of x. */
static inline __attribute__((always_inline)) void dot4_q45_k(const void *w, size_t row_bytes, const cb_block_q8_k *x,
                                                             int n, float out[4], const void *next, int q5) {
    const size_t block = q5 ? sizeof(cb_block_q5_k) : sizeof(cb_block_q4_k);
    const __m256i low4 = _mm256_set1_epi8(0xF), bit4 = _mm256_set1_epi8(0x10);
    const int nb = n / CB_QK_K;
    const size_t share = prefetch_share(block);
    __m128 s = _mm_setzero_ps();
    for (int i = 0; i < nb; i++, x++) {
        prefetch_next(next, share, i);
        const uint8_t *blk[4];
        for (int r = 0; r < 4; r++) blk[r] = (const uint8_t *)w + (size_t)r * row_bytes + (size_t)i * block;
        /* The per-32 sums of x, shared by the four rows' mins. */
        const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)x->bsums),
                                          _mm_loadu_si128((const __m128i *)x->bsums + 1));
        __m256i acc[4], scales[4], qh[4];
        __m128i msum[4];
        const uint8_t *qs[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const cb_block_q5_k *k5 = (const cb_block_q5_k *)blk[r];
            qs[r] = q5 ? k5->qs : ((const cb_block_q4_k *)k5)->qs;
            /* The 12 packed bytes as 8 scales and 8 mins (kquants.c
             * scale_min_k4) in one vector: of the dwords u0 u1 u2 at scales
             * (16 bytes read: the rest, the block's next bytes, unused),
             * sc_lo = u0 & 0x3F.., mn_lo = u1 & 0x3F.., and sc_hi, mn_hi
             * u2's low, high nibbles with u0's, u1's top two bits as 4..5. */
            const __m128i u = _mm_loadu_si128((const __m128i *)k5->scales);
            const __m128i lo6 = _mm_and_si128(u, _mm_set1_epi8(0x3F));
            const __m128i hi = _mm_or_si128(
                _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(u, 0xAA), _mm_setr_epi32(0, 4, 0, 4)), _mm_set1_epi8(0x0F)),
                _mm_and_si128(_mm_srli_epi32(u, 2), _mm_set1_epi8(0x30)));
            const __m128i scmn = _mm_unpacklo_epi32(lo6, hi); /* sc_lo sc_hi mn_lo mn_hi */
            scales[r] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scmn));
            msum[r] = _mm_madd_epi16(bs, _mm_cvtepu8_epi16(_mm_unpackhi_epi64(scmn, scmn)));
            qh[r] = q5 ? load32(k5->qh) : _mm256_setzero_si256();
            acc[r] = _mm256_setzero_si256();
        }
        /* Group by group, each pair of x loads serving the four rows. */
#pragma GCC unroll 4
        for (int c = 0; c < 8; c += 2) {
            const __m256i x0 = load32(x->qs + 32 * c), x1 = load32(x->qs + 32 * c + 32);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                const __m256i q = load32(qs[r] + 16 * c);
                __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
                if (q5) { /* bit c of qh to bit 4: shifted in 16-bit lanes, masked to bit 4 */
                    const __m256i b0 = c < 4 ? _mm256_slli_epi16(qh[r], 4 - c) : _mm256_srli_epi16(qh[r], c - 4);
                    const __m256i b1 = c + 1 < 4 ? _mm256_slli_epi16(qh[r], 3 - c) : _mm256_srli_epi16(qh[r], c - 3);
                    lo = _mm256_or_si256(lo, _mm256_and_si256(b0, bit4));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(b1, bit4));
                }
                /* Groups c and c + 1's pair sums added in fours (at most
                 * 4 * 31 * 127, within int16), then one madd with both scales. */
                const __m256i p = _mm256_hadd_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1));
                const __m256i sc = _mm256_shuffle_epi8(scales[r], load32(pick4x2[c / 2]));
                acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(p, sc));
            }
        }
        const __m128i mins = sum4_i32(msum[0], msum[1], msum[2], msum[3]);
        __m128 d, dmin;
        halves4x2(blk, &d, &dmin);
        s = kq_step4(s, x->d, d, hsum4_i32(acc), dmin, mins);
    }
    _mm_storeu_ps(out, s);
}
static void dot4_q4_k(const void *w, size_t row_bytes, const cb_block_q8_k *x, int n, float out[4], const void *next) {
    dot4_q45_k(w, row_bytes, x, n, out, next, 0);
}
static void dot4_q5_k(const void *w, size_t row_bytes, const cb_block_q8_k *x, int n, float out[4], const void *next) {
    dot4_q45_k(w, row_bytes, x, n, out, next, 1);
}

/* Shuffles putting word 2k of a lane's scales in every word of the low lane
 * and word 2k + 1 in every word of the high one (kquants_avx2.c's q6_pick). */
static const uint8_t pick6[4][32] __attribute__((aligned(32))) = {
#define PICK(k) {4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1,  \
                 4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3,  \
                 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3}
    PICK(0), PICK(1), PICK(2), PICK(3)
#undef PICK
};

/* Q6_K, each row as kquants_avx2.c dot_q6_k. */
static void dot4_q6_k(const void *w, size_t row_bytes, const cb_block_q8_k *x, int n, float out[4], const void *next) {
    const __m256i low4 = _mm256_set1_epi8(0xF), bits45 = _mm256_set1_epi8(0x30);
    const int nb = n / CB_QK_K;
    const size_t share = prefetch_share(sizeof(cb_block_q6_k));
    __m128 s = _mm_setzero_ps();
    for (int i = 0; i < nb; i++, x++) {
        prefetch_next(next, share, i);
        const uint8_t *blk[4];
        for (int r = 0; r < 4; r++) blk[r] = (const uint8_t *)w + (size_t)r * row_bytes + (size_t)i * sizeof(cb_block_q6_k);
        const __m256i bsums = load32(x->bsums);
        __m256i acc[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const cb_block_q6_k *b = (const cb_block_q6_k *)blk[r];
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
            const __m256i sc_half[2] = {_mm256_permute4x64_epi64(sc16, 0x44), _mm256_permute4x64_epi64(sc16, 0xEE)};
            __m256i a = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 5));
#pragma GCC unroll 2
            for (int half = 0; half < 2; half++) {
                const __m256i l0 = load32(b->ql + 64 * half), l1 = load32(b->ql + 64 * half + 32);
                const __m256i h = load32(b->qh + 32 * half);
                /* 2 bits of h to bits 4..5: shifted in 16-bit lanes and
                 * masked, so no bit crosses into a byte's bits 4..5. */
                const __m256i u[4] = {
                    _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_and_si256(_mm256_slli_epi16(h, 4), bits45)),
                    _mm256_or_si256(_mm256_and_si256(l1, low4), _mm256_and_si256(_mm256_slli_epi16(h, 2), bits45)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(h, bits45)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                    _mm256_and_si256(_mm256_srli_epi16(h, 2), bits45)),
                };
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    const __m256i sc = _mm256_shuffle_epi8(sc_half[half], load32(pick6[k]));
                    a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(u[k], load32(x->qs + 128 * half + 32 * k)),
                                                              sc));
                }
            }
            acc[r] = a;
        }
        const __m128 zero = _mm_setzero_ps();
        /* d: the high halves of the dwords ending at its end (the low
         * ones, the last two scales, unused). */
        const size_t off = offsetof(cb_block_q6_k, d) - 2;
        const uint8_t *dw[4] = {blk[0] + off, blk[1] + off, blk[2] + off, blk[3] + off};
        __m128 unused, d;
        halves4x2(dw, &unused, &d);
        s = kq_step4(s, x->d, d, hsum4_i32(acc), zero, _mm_setzero_si128());
    }
    _mm_storeu_ps(out, s);
}

/* Q3_K, each row as kquants_avx2.c dot_q3_k: group c = 4 * half + k is
 * (qs[32 * half..] >> 2k) & 3 with hmask's bit c moved to bit 2 (shifts in
 * 16-bit lanes: bit 2 of a byte takes bit c of the same byte), unsigned
 * 0..7; the 4 off through the scales times the per-16 sums of x. */
static void dot4_q3_k(const void *w, size_t row_bytes, const cb_block_q8_k *x, int n, float out[4], const void *next) {
    const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const int nb = n / CB_QK_K;
    const size_t share = prefetch_share(sizeof(cb_block_q3_k));
    __m128 s = _mm_setzero_ps();
    for (int i = 0; i < nb; i++, x++) {
        prefetch_next(next, share, i);
        const uint8_t *blk[4];
        for (int r = 0; r < 4; r++) blk[r] = (const uint8_t *)w + (size_t)r * row_bytes + (size_t)i * sizeof(cb_block_q3_k);
        const __m256i bsums = load32(x->bsums);
        __m256i acc[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const cb_block_q3_k *b = (const cb_block_q3_k *)blk[r];
            const __m256i sc16 = _mm256_cvtepi8_epi16(q3_scales(b->scales));
            const __m256i sc_half[2] = {_mm256_permute4x64_epi64(sc16, 0x44), _mm256_permute4x64_epi64(sc16, 0xEE)};
            __m256i a = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 2));
            const __m256i hm = load32(b->hmask);
#pragma GCC unroll 2
            for (int half = 0; half < 2; half++) {
                const __m256i q = load32(b->qs + 32 * half);
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    const int c = 4 * half + k;
                    const __m256i hb = c >= 2 ? _mm256_srli_epi16(hm, c - 2) : _mm256_slli_epi16(hm, 2 - c);
                    const __m256i u = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * k), three),
                                                      _mm256_and_si256(hb, four));
                    const __m256i sc = _mm256_shuffle_epi8(sc_half[half], load32(pick6[k]));
                    a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(u, load32(x->qs + 32 * c)), sc));
                }
            }
            acc[r] = a;
        }
        /* d: the high halves of the dwords ending at its end. */
        const size_t off = offsetof(cb_block_q3_k, d) - 2;
        const uint8_t *dw[4] = {blk[0] + off, blk[1] + off, blk[2] + off, blk[3] + off};
        __m128 unused, d;
        halves4x2(dw, &unused, &d);
        s = kq_step4(s, x->d, d, hsum4_i32(acc), _mm_setzero_ps(), _mm_setzero_si128());
    }
    _mm_storeu_ps(out, s);
}

/* IQ4_XS, each row as kquants_avx2.c dot_iq4_xs: qs[32c..32c + 31] holds
 * groups 2c and 2c + 1, a 128-bit lane each: its low nibbles their first 16
 * weights, its high ones their last 16 (x permuted to match, once for the
 * four rows); levels' magnitudes against x with the levels' signs, pairs
 * within int16; both halves take the same scales (less 32, as words). */
static void dot4_iq4_xs(const void *w, size_t row_bytes, const cb_block_q8_k *x, int n, float out[4], const void *next) {
    static const int8_t mag[16] = {127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113};
    const __m256i book = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)cb_iq4nl_values));
    const __m256i mbook = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)mag));
    const __m256i low4 = _mm256_set1_epi8(0xF);
    const int nb = n / CB_QK_K;
    const size_t share = prefetch_share(sizeof(cb_block_iq4_xs));
    __m128 s = _mm_setzero_ps();
    for (int i = 0; i < nb; i++, x++) {
        prefetch_next(next, share, i);
        const uint8_t *blk[4];
        for (int r = 0; r < 4; r++) blk[r] = (const uint8_t *)w + (size_t)r * row_bytes + (size_t)i * sizeof(cb_block_iq4_xs);
        __m256i xl[4], xh[4];
        for (int c = 0; c < 4; c++) {
            const __m256i a = load32(x->qs + 64 * c), b = load32(x->qs + 64 * c + 32);
            xl[c] = _mm256_permute2x128_si256(a, b, 0x20), xh[c] = _mm256_permute2x128_si256(a, b, 0x31);
        }
        __m256i acc[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const cb_block_iq4_xs *b = (const cb_block_iq4_xs *)blk[r];
            const __m128i sc8 = _mm_sub_epi8(_mm_cvtsi64_si128((long long)cb_iq4xs_scales8(blk[r])), _mm_set1_epi8(32));
            const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc8));
            __m256i a = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const __m256i q = load32(b->qs + 32 * c);
                const __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
                const __m256i sc = _mm256_shuffle_epi8(sc16, load32(pick6[c]));
                const __m256i pl = _mm256_maddubs_epi16(_mm256_shuffle_epi8(mbook, lo),
                                                        _mm256_sign_epi8(xl[c], _mm256_shuffle_epi8(book, lo)));
                const __m256i ph = _mm256_maddubs_epi16(_mm256_shuffle_epi8(mbook, hi),
                                                        _mm256_sign_epi8(xh[c], _mm256_shuffle_epi8(book, hi)));
                a = _mm256_add_epi32(a, _mm256_add_epi32(_mm256_madd_epi16(pl, sc), _mm256_madd_epi16(ph, sc)));
            }
            acc[r] = a;
        }
        /* d: the low halves of the block's first dwords. */
        __m128 d, unused;
        halves4x2(blk, &d, &unused);
        s = kq_step4(s, x->d, d, hsum4_i32(acc), _mm_setzero_ps(), _mm_setzero_si128());
    }
    _mm_storeu_ps(out, s);
}

/* Q2_K, each row as kquants_avx2.c dot_q2_k: group c = 4 * half + k is
 * (qs[32 * half..] >> 2k) & 3, its two 16-weight scales by pick6; the mins
 * (high nibbles of the scale bytes) against the per-16 sums of x. */
static void dot4_q2_k(const void *w, size_t row_bytes, const cb_block_q8_k *x, int n, float out[4], const void *next) {
    const __m256i three = _mm256_set1_epi8(3);
    const __m128i low4 = _mm_set1_epi8(0xF);
    const int nb = n / CB_QK_K;
    const size_t share = prefetch_share(sizeof(cb_block_q2_k));
    __m128 s = _mm_setzero_ps();
    for (int i = 0; i < nb; i++, x++) {
        prefetch_next(next, share, i);
        const uint8_t *blk[4];
        for (int r = 0; r < 4; r++) blk[r] = (const uint8_t *)w + (size_t)r * row_bytes + (size_t)i * sizeof(cb_block_q2_k);
        const __m256i bsums = load32(x->bsums);
        __m256i acc[4], msum[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const cb_block_q2_k *b = (const cb_block_q2_k *)blk[r];
            const __m128i sc8 = _mm_loadu_si128((const __m128i *)b->scales);
            const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc8, low4));
            msum[r] = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), low4)), bsums);
            const __m256i sc_half[2] = {_mm256_permute4x64_epi64(sc16, 0x44), _mm256_permute4x64_epi64(sc16, 0xEE)};
            __m256i a = _mm256_setzero_si256();
#pragma GCC unroll 2
            for (int half = 0; half < 2; half++) {
                const __m256i q = load32(b->qs + 32 * half);
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    const __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), three);
                    const __m256i sc = _mm256_shuffle_epi8(sc_half[half], load32(pick6[k]));
                    a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(u, load32(x->qs + 128 * half + 32 * k)), sc));
                }
            }
            acc[r] = a;
        }
        const size_t off = offsetof(cb_block_q2_k, d);
        const uint8_t *dw[4] = {blk[0] + off, blk[1] + off, blk[2] + off, blk[3] + off};
        __m128 d, dmin;
        halves4x2(dw, &d, &dmin);
        s = kq_step4(s, x->d, d, hsum4_i32(acc), dmin, hsum4_i32(msum));
    }
    _mm_storeu_ps(out, s);
}

cb_dot4_k_fn cb_dot4_k_avx2(uint32_t dtype) {
    switch (dtype) {
    case CB_Q4_K: return dot4_q4_k;
    case CB_Q5_K: return dot4_q5_k;
    case CB_Q6_K: return dot4_q6_k;
    case CB_Q3_K: return dot4_q3_k;
    case CB_IQ4_XS: return dot4_iq4_xs;
    case CB_Q2_K: return dot4_q2_k;
    }
    return NULL;
}
