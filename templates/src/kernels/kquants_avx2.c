/* AVX2 dot products of GGML's other block types (dims.h ids 8..18) against
 * q8_0 activations (the 32-weight types) or q8_k ones (the 256-weight types:
 * at the end). Reference: kernels/kquants.c, whose integer sums these
 * compute exactly (maddubs pairs stay within int16: unsigned weights are at
 * most 63, signed ones at most 127 in magnitude, |x| <= 127) and whose
 * float steps they repeat: the reference's bits. */
#include <immintrin.h>
#include <string.h>

#include "kernels.h"
#include "kquants_x86.h"

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* u (unsigned bytes) . s (signed bytes), as 16 int16 pair sums: lanes 0..7
 * hold bytes 0..15, lanes 8..15 bytes 16..31. */
static inline __m256i pairs(__m256i u, __m256i s) { return _mm256_maddubs_epi16(u, s); }

static inline __m256 f32(__m256i v) { return _mm256_cvtepi32_ps(v); }

/* Signed w . x: maddubs needs one unsigned operand, so move w's sign onto x. */
static inline __m256i dot_signed(__m256i w, __m256i x) {
    return _mm256_madd_epi16(pairs(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
}

/* 16 bytes of nibbles -> 32 bytes 0..15: low nibbles (elements 0..15) then
 * high ones (16..31). */
static inline __m256i nibbles16(const uint8_t *qs) {
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0xF));
}

/* 32 bits (bit j for element j) -> 0x10 in byte j where set: q5's 5th bit. */
static inline __m256i bit5_bytes(const uint8_t qh[4]) {
    uint32_t bits;
    memcpy(&bits, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                                                2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i mask = _mm256_set1_epi64x(0x8040201008040201LL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask), _mm256_set1_epi8(0x10));
}

static inline __m256i x_sums(__m256i x) { return _mm256_madd_epi16(pairs(_mm256_set1_epi8(1), x), _mm256_set1_epi16(1)); }

static inline __m256i codebook(const int8_t values[16]) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)values));
}

/* 2^(e - 128) for every E8M0 byte (e < 2: subnormal). Broadcast from
 * memory, and dx widened in a vector, a block's scales take no branch and
 * no move from an integer register (the scale steps, not the integer sums,
 * were most of this kernel's cost). d * dx is exact (a power of two), so
 * the bits are those of the scalar-scale form. */
#define E8M0(e) {(e) < 2 ? 0x00200000u << (e) : (uint32_t)((e) - 1) << 23}
#define E8M0_4(e) E8M0(e), E8M0((e) + 1), E8M0((e) + 2), E8M0((e) + 3)
#define E8M0_16(e) E8M0_4(e), E8M0_4((e) + 4), E8M0_4((e) + 8), E8M0_4((e) + 12)
static const union { uint32_t bits; float f; } e8m0_half_table[256] = {
    E8M0_16(0),   E8M0_16(16),  E8M0_16(32),  E8M0_16(48),  E8M0_16(64),  E8M0_16(80),  E8M0_16(96),  E8M0_16(112),
    E8M0_16(128), E8M0_16(144), E8M0_16(160), E8M0_16(176), E8M0_16(192), E8M0_16(208), E8M0_16(224), E8M0_16(240)};

/* mxfp4 (E8M0 scale): a block's int32 lanes (lane m: elements 4m..4m+3)
 * scaled into eight float lanes, the scalar reference's lanes. */
static float dot_mxfp4(const void *w, const cb_block_q8_0 *x, int n) {
    const cb_block_mxfp4 *b = w;
    const __m256i book = codebook(cb_mxfp4_values);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / CB_QK; i++) {
        const __m256 d = _mm256_mul_ps(_mm256_broadcast_ss(&e8m0_half_table[b[i].e].f),
                                       _mm256_cvtph_ps(_mm_set1_epi16((short)x[i].d)));
        const __m256i q = _mm256_shuffle_epi8(book, nibbles16(b[i].qs));
        acc = _mm256_fmadd_ps(d, f32(dot_signed(q, load32(x[i].qs))), acc);
    }
    return hsum(acc);
}

/* One row's block i into its lanes (dot4_mxfp4's step). With VNNI the
 * levels come as level + 12 (0..24: vpdpbusd's unsigned operand) and the
 * lanes start at -12 times x's lane sums (xa, once for the four rows), so
 * one vpdpbusd gives the exact sums the sign step and two madds give. */
#if CB_VNNI256
static const int8_t mxfp4_plus12[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
#endif
static inline __attribute__((always_inline)) __m256 mxfp4_step(__m256 acc, const cb_block_mxfp4 *b, __m256i xa, __m256i xq,
                                                              __m256 dx, __m256i book) {
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)b->qs));
    const __m256i u = _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0xF));
#if CB_VNNI256
    const __m256i sq = cb_dpbusd256(xa, _mm256_shuffle_epi8(book, u), xq); /* xa: the lanes' start */
#else
    const __m256i sq = _mm256_madd_epi16(pairs(xa, _mm256_sign_epi8(_mm256_shuffle_epi8(book, u), xq)), _mm256_set1_epi16(1)); /* xa: |x| */
#endif
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_broadcast_ss(&e8m0_half_table[b->e].f), dx), f32(sq), acc);
}

/* Four MXFP4 rows (row_bytes apart) . x, each row's bits dot_mxfp4's. One
 * row is a chain of dependent FMAs and twice the work a byte of q8_0 has;
 * here four rows' chains interleave and x's load, magnitudes (w . x as
 * |x| . sign(w, x), one sign step a row; with VNNI x's lane sums) and
 * scale serve four rows. */
static void dot4_mxfp4(const void *w, size_t row_bytes, const cb_block_q8_0 *x, int n, float out[4], const void *next) {
#if CB_VNNI256
    const __m256i book = codebook(mxfp4_plus12);
#else
    const __m256i book = codebook(cb_mxfp4_values);
#endif
    const cb_block_mxfp4 *b0 = w, *b1 = (const cb_block_mxfp4 *)((const uint8_t *)w + row_bytes),
                         *b2 = (const cb_block_mxfp4 *)((const uint8_t *)w + 2 * row_bytes),
                         *b3 = (const cb_block_mxfp4 *)((const uint8_t *)w + 3 * row_bytes);
    /* Four variables, not an array: kept in registers across the loop. */
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int i = 0; i < n / CB_QK; i++) {
        if (next) {
            /* The next four rows (one stretch) in step with these: the lines
             * starting in this block's share of them. */
            const size_t lo = (size_t)i * 4 * sizeof(cb_block_mxfp4), hi = lo + 4 * sizeof(cb_block_mxfp4);
            for (size_t o = (lo + 63) & ~(size_t)63; o < hi; o += 64) cb_prefetch((const uint8_t *)next + o);
        }
#if CB_VNNI256
        const __m256i xq = load32(x[i].qs),
                      xa = _mm256_sub_epi32(_mm256_setzero_si256(), cb_dpbusd256(_mm256_setzero_si256(), _mm256_set1_epi8(12), xq));
#else
        const __m256i xq = load32(x[i].qs), xa = _mm256_abs_epi8(xq);
#endif
        const __m256 dx = _mm256_cvtph_ps(_mm_set1_epi16((short)x[i].d));
        a0 = mxfp4_step(a0, b0 + i, xa, xq, dx, book);
        a1 = mxfp4_step(a1, b1 + i, xa, xq, dx, book);
        a2 = mxfp4_step(a2, b2 + i, xa, xq, dx, book);
        a3 = mxfp4_step(a3, b3 + i, xa, xq, dx, book);
    }
    out[0] = hsum(a0), out[1] = hsum(a1), out[2] = hsum(a2), out[3] = hsum(a3);
}

/* Four MXFP4 rows . n_tok (at most CB_TOKENS_BLOCK_MAX) tokens' q8_0 rows
 * xs[k] (a prompt's, or a batch step's): out[4k + r], each dot4_mxfp4's
 * bits (a block's int32 lanes, then one fma a lane and block in block
 * order, then hsum). Up to MX_CHUNK blocks of the four rows are decoded to
 * levels once (to the stack) for all the tokens; a token then costs, per
 * row and block, one vpdpbusd of x + 128 against the levels (started at
 * -128 times the lanes' level sums), or without VNNI a sign step and two
 * madds, and the scale's multiply and fma. (dot4_mxfp4 offsets x's side
 * instead: there x's correction serves four rows, here the levels' serves
 * every token.) */
#define MX_CHUNK 8
/* Fewer tokens take the one-token kernel each: at 2 the decoding did not
 * pay (colibri-kernel-bench from memory 12.8 / 14.0 against 13.5 / 16.2
 * GB/s a token), at 4 it did (18.6 / 18.7 against 15.9 / 16.0). */
#define MX_MIN_TOKENS 4
static void tokens4_mxfp4(const void *w, size_t row_bytes, const cb_block_q8_0 *const *xs, int n_tok, int n,
                          float *out, const void *next) {
    if (n_tok < MX_MIN_TOKENS) {
        for (int k = 0; k < n_tok; k++) dot4_mxfp4(w, row_bytes, xs[k], n, out + 4 * k, k ? NULL : next);
        return;
    }
    const int nb = n / CB_QK;
    const __m256i book = codebook(cb_mxfp4_values);
    float acc[CB_TOKENS_BLOCK_MAX][4][8]; /* 8 KB of stack */
    memset(acc, 0, sizeof(float) * 4 * 8 * (size_t)n_tok);
    for (int i = 0; i < nb; i += MX_CHUNK) {
        const int kb = nb - i < MX_CHUNK ? nb - i : MX_CHUNK;
        __m256i q[MX_CHUNK][4]; /* the levels, signed */
#if CB_VNNI256
        __m256i start[MX_CHUNK][4]; /* -128 times each lane's sum of levels */
#else
        __m256i mag[MX_CHUNK][4]; /* |levels| */
#endif
        float dw[MX_CHUNK][4];
        cb_b32_prefetch_next(next, sizeof(cb_block_mxfp4), i, nb);
        for (int r = 0; r < 4; r++)
            for (int b = 0; b < kb; b++) {
                const cb_block_mxfp4 *blk = (const cb_block_mxfp4 *)((const uint8_t *)w + (size_t)r * row_bytes) + i + b;
                const __m256i v = _mm256_shuffle_epi8(book, nibbles16(blk->qs));
                q[b][r] = v;
#if CB_VNNI256
                start[b][r] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                               cb_dpbusd256(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), v));
#else
                mag[b][r] = _mm256_sign_epi8(v, v);
#endif
                dw[b][r] = e8m0_half_table[blk->e].f;
            }
        for (int k = 0; k < n_tok; k++) {
            const cb_block_q8_0 *x = xs[k] + i;
            __m256 a[4];
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) a[r] = _mm256_loadu_ps(acc[k][r]);
            for (int b = 0; b < kb; b++) {
                const __m256i xq = load32(x[b].qs);
                const __m256 dx = _mm256_cvtph_ps(_mm_set1_epi16((short)x[b].d));
#if CB_VNNI256
                const __m256i xu = _mm256_xor_si256(xq, _mm256_set1_epi8((char)0x80));
#endif
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) {
#if CB_VNNI256
                    const __m256i sq = cb_dpbusd256(start[b][r], xu, q[b][r]);
#else
                    const __m256i sq = _mm256_madd_epi16(pairs(mag[b][r], _mm256_sign_epi8(xq, q[b][r])), _mm256_set1_epi16(1));
#endif
                    a[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_broadcast_ss(&dw[b][r]), dx), f32(sq), a[r]);
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) _mm256_storeu_ps(acc[k][r], a[r]);
        }
    }
    for (int k = 0; k < n_tok; k++)
        for (int r = 0; r < 4; r++) out[4 * k + r] = hsum(_mm256_loadu_ps(acc[k][r]));
}


/* ---- the 32-weight types on q8_0: a block's integer sums in int32 lanes,
 * eight blocks' totals gathered into one register (block j in lane j), then
 * scaled and added into the eight float lanes of cb_b32_step; the last
 * n / 32 % 8 blocks lane by lane. ---- */
enum { B32_Q4_1, B32_Q5_0, B32_Q5_1, B32_IQ4_NL };
static const int b32_size[] = {sizeof(cb_block_q4_1), sizeof(cb_block_q5_0), sizeof(cb_block_q5_1),
                               sizeof(cb_block_iq4_nl)};
static const int b32_qs[] = {4, 6, 8, 2}; /* offsets of qs in the block */

static inline int32_t total1(__m256i v) {
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1)));
}

/* One block's sum(q x) as int32 lanes, and sum(x) in *sx for the types with a min. */
static inline __attribute__((always_inline)) __m256i b32_sums(int t, const uint8_t *blk, const int8_t *xqs, __m256i book,
                                                             __m256i *sx) {
    const __m256i xq = load32(xqs);
    const __m256i ones = _mm256_set1_epi16(1);
    if (t == B32_IQ4_NL) return dot_signed(_mm256_shuffle_epi8(book, nibbles16(blk + 2)), xq);
    __m256i u = nibbles16(blk + b32_qs[t]);
    if (t != B32_Q4_1) u = _mm256_or_si256(u, bit5_bytes(blk + b32_qs[t] - 4));
    const __m256i sq = _mm256_madd_epi16(pairs(u, xq), ones);
    if (t == B32_Q5_0) return _mm256_sub_epi32(sq, _mm256_slli_epi32(x_sums(xq), 4)); /* q - 16 */
    *sx = x_sums(xq);
    return sq;
}

/* Blocks i..nb - 1 (fewer than eight) into their lanes one by one; the
 * row's total. */
static inline float b32_rest(int t, const uint8_t *b, const cb_block_q8_0 *x, int i, int nb, float lane[CB_B32_LANES]) {
    const int size = b32_size[t], with_min = t == B32_Q4_1 || t == B32_Q5_1;
    const __m256i book = codebook(cb_iq4nl_values);
    for (; i < nb; i++) {
        const uint8_t *blk = b + (size_t)i * size;
        __m256i sx = _mm256_setzero_si256();
        const int32_t sq = total1(b32_sums(t, blk, x[i].qs, book, &sx));
        cb_half hd, hm;
        memcpy(&hd, blk, 2);
        const float dx = _cvtsh_ss(x[i].d);
        float *l = &lane[i % CB_B32_LANES];
        *l = cb_b32_step(*l, dx * _cvtsh_ss(hd), sq);
        if (with_min) memcpy(&hm, blk + 2, 2), *l = cb_b32_step(*l, dx * _cvtsh_ss(hm), total1(sx));
    }
    return cb_b32_sum(lane);
}

static inline __attribute__((always_inline)) float dot_b32(int t, const void *w, const cb_block_q8_0 *x, int n) {
    const uint8_t *b = w;
    const int size = b32_size[t], with_min = t == B32_Q4_1 || t == B32_Q5_1, nb = n / CB_QK;
    const __m256i book = codebook(cb_iq4nl_values);
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + CB_B32_LANES <= nb; i += CB_B32_LANES) {
        __m256i sq[8], sx[8];
        const uint8_t *blk = b + (size_t)i * size;
        for (int j = 0; j < 8; j++) sq[j] = b32_sums(t, blk + (size_t)j * size, x[i + j].qs, book, &sx[j]);
        const __m256 dx = halves8((const uint8_t *)&x[i].d, sizeof(cb_block_q8_0));
        acc = _mm256_fmadd_ps(_mm256_mul_ps(dx, halves8(blk, size)), f32(totals8(sq)), acc);
        if (with_min) acc = _mm256_fmadd_ps(_mm256_mul_ps(dx, halves8(blk + 2, size)), f32(totals8(sx)), acc);
    }
    float lane[CB_B32_LANES];
    _mm256_storeu_ps(lane, acc);
    return b32_rest(t, b, x, i, nb, lane);
}
/* q4_1, q5_1: q8_0 activations (their block size), d and m steps per block. */
static float dot_q4_1(const void *w, const cb_block_q8_0 *x, int n) { return dot_b32(B32_Q4_1, w, x, n); }
static float dot_q5_1(const void *w, const cb_block_q8_0 *x, int n) { return dot_b32(B32_Q5_1, w, x, n); }
/* q5_0, iq4_nl: q8_0 activations (their block size), one step per block. */
static float dot_q5_0(const void *w, const cb_block_q8_0 *x, int n) { return dot_b32(B32_Q5_0, w, x, n); }
static float dot_iq4_nl(const void *w, const cb_block_q8_0 *x, int n) { return dot_b32(B32_IQ4_NL, w, x, n); }

cb_dot_block_fn cb_dot_block_avx2(uint32_t dtype) {
    CB_DOT_BLOCK_DISPATCH(dtype);
}

/* ---- four rows of the 32-weight types at once: a register holds one half
 * (elements 0..15 or 16..31) of two blocks of a row, a 128-bit lane a
 * block, so x's halves (loaded once for the four rows) meet a row's low
 * and high nibbles as they lie; one fold gives a row's eight block totals
 * (block B32_PERM[l] in lane l). Each lane then meets the one-row kernel's
 * steps in its order: out[r] is its bits. ---- */
static const int B32_PERM[CB_B32_LANES] = {0, 2, 4, 6, 1, 3, 5, 7};

/* Lane k of the result: the totals of lane k of p0, p1, p2, p3. */
static inline __attribute__((always_inline)) __m256i lane_totals4(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    const __m256i a = _mm256_add_epi32(_mm256_unpacklo_epi32(p0, p1), _mm256_unpackhi_epi32(p0, p1));
    const __m256i b = _mm256_add_epi32(_mm256_unpacklo_epi32(p2, p3), _mm256_unpackhi_epi32(p2, p3));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
}

/* The 16 bytes at a, then those at b. */
static inline __m256i two16(const void *a, const void *b) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                   _mm_loadu_si128((const __m128i *)b), 1);
}

static inline __attribute__((always_inline)) void b32_duo_unpack(int t, const uint8_t *blk, int size, __m256i book,
                                                                 __m256i *lo, __m256i *hi) {
    const int qs = b32_qs[t];
    const __m256i q = two16(blk + qs, blk + size + qs), low4 = _mm256_set1_epi8(0xF);
    *lo = _mm256_and_si256(q, low4), *hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
    if (t == B32_IQ4_NL) {
        *lo = _mm256_shuffle_epi8(book, *lo), *hi = _mm256_shuffle_epi8(book, *hi);
    } else if (t != B32_Q4_1) { /* the 5th bits: qh's bits 0..15 for the low nibbles, 16..31 the high */
        uint32_t ha, hb;
        memcpy(&ha, blk + qs - 4, 4);
        memcpy(&hb, blk + size + qs - 4, 4);
        uint8_t ml[4], mh[4];
        const uint32_t l = (ha & 0xFFFF) | hb << 16, h = ha >> 16 | (hb & 0xFFFF0000u);
        memcpy(ml, &l, 4);
        memcpy(mh, &h, 4);
        *lo = _mm256_or_si256(*lo, bit5_bytes(ml));
        *hi = _mm256_or_si256(*hi, bit5_bytes(mh));
    }
}
static inline __attribute__((always_inline)) __m256i b32_duo_dot(int t, __m256i lo, __m256i hi, __m256i xl, __m256i xh) {
    if (t == B32_IQ4_NL) return _mm256_add_epi32(dot_signed(lo, xl), dot_signed(hi, xh));
    /* u <= 31: each half's pair sums within int16, so are both's */
    return _mm256_madd_epi16(_mm256_add_epi16(pairs(lo, xl), pairs(hi, xh)), _mm256_set1_epi16(1));
}
/* Blocks a, b (size bytes apart) of one row . x's halves xl, xh: each
 * 128-bit lane one block's sums. */
static inline __attribute__((always_inline)) __m256i b32_duo(int t, const uint8_t *blk, int size, __m256i xl, __m256i xh,
                                                            __m256i book) {
    __m256i lo, hi;
    b32_duo_unpack(t, blk, size, book, &lo, &hi);
    return b32_duo_dot(t, lo, hi, xl, xh);
}

static inline short i16_at(const uint8_t *p) {
    short h;
    memcpy(&h, p, 2);
    return h;
}
/* The fp16 values of eight blocks' field at p (blocks size bytes apart) in
 * B32_PERM's order, as floats, inserted one by one (as halves8). */
static inline __attribute__((always_inline)) __m256 halves8_perm(const uint8_t *p, size_t size) {
    return _mm256_cvtph_ps(_mm_setr_epi16(i16_at(p), i16_at(p + 2 * size), i16_at(p + 4 * size), i16_at(p + 6 * size),
                                          i16_at(p + size), i16_at(p + 3 * size), i16_at(p + 5 * size), i16_at(p + 7 * size)));
}

static inline __attribute__((always_inline)) void dot4_b32(int t, const void *w, size_t row_bytes, const cb_block_q8_0 *x,
                                                           int n, float out[4], const void *next) {
    const int size = b32_size[t], with_min = t == B32_Q4_1 || t == B32_Q5_1, nb = n / CB_QK;
    const uint8_t *b = w;
    const __m256i book = codebook(cb_iq4nl_values), ones = _mm256_set1_epi16(1);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int i = 0;
    for (; i + CB_B32_LANES <= nb; i += CB_B32_LANES) {
        cb_b32_prefetch_next(next, size, i, nb);
        __m256i xl[4], xh[4], sx = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            xl[j] = two16(x[i + 2 * j].qs, x[i + 2 * j + 1].qs), xh[j] = two16(x[i + 2 * j].qs + 16, x[i + 2 * j + 1].qs + 16);
        if (t != B32_IQ4_NL) { /* sum(x) of each lane's block */
            __m256i s[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                s[j] = _mm256_madd_epi16(_mm256_add_epi16(pairs(_mm256_set1_epi8(1), xl[j]), pairs(_mm256_set1_epi8(1), xh[j])), ones);
            sx = lane_totals4(s[0], s[1], s[2], s[3]);
        }
        const __m256 dx = halves8_perm((const uint8_t *)&x[i].d, sizeof(cb_block_q8_0));
        const __m256 fx = _mm256_cvtepi32_ps(sx);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const uint8_t *row = b + (size_t)r * row_bytes + (size_t)i * size;
            __m256i tot = lane_totals4(b32_duo(t, row, size, xl[0], xh[0], book), b32_duo(t, row + 2 * size, size, xl[1], xh[1], book),
                                       b32_duo(t, row + 4 * size, size, xl[2], xh[2], book),
                                       b32_duo(t, row + 6 * size, size, xl[3], xh[3], book));
            if (t == B32_Q5_0) tot = _mm256_sub_epi32(tot, _mm256_slli_epi32(sx, 4)); /* q - 16 */
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dx, halves8_perm(row, size)), f32(tot), acc[r]);
            if (with_min) acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dx, halves8_perm(row + 2, size)), fx, acc[r]);
        }
    }
    for (int r = 0; r < 4; r++) {
        float l[CB_B32_LANES], lane[CB_B32_LANES];
        _mm256_storeu_ps(l, acc[r]);
        for (int k = 0; k < CB_B32_LANES; k++) lane[B32_PERM[k]] = l[k];
        out[r] = b32_rest(t, b + (size_t)r * row_bytes, x, i, nb, lane);
    }
}
/* Four rows . n_tok (at most CB_TOKENS_BLOCK_MAX) tokens' q8_0 rows xs[k]
 * (a prompt's): out[4k + r], each dot4_b32's bits. Each eight blocks of
 * the four rows are unpacked once (to the stack: 16 registers hold two
 * rows' at most), scales too, for all the tokens; a token's lanes wait in
 * acc between them, in the same order of steps. */
static inline __attribute__((always_inline)) void tokens4_b32(int t, const void *w, size_t row_bytes,
                                                              const cb_block_q8_0 *const *xs, int n_tok, int n,
                                                              float *out, const void *next) {
    const int size = b32_size[t], with_min = t == B32_Q4_1 || t == B32_Q5_1, nb = n / CB_QK;
    const uint8_t *b = w;
    const __m256i book = codebook(cb_iq4nl_values), ones = _mm256_set1_epi16(1);
    float acc[CB_TOKENS_BLOCK_MAX][4][CB_B32_LANES]; /* 8 KB of stack */
    memset(acc, 0, sizeof(float) * 4 * CB_B32_LANES * (size_t)n_tok);
    int i = 0;
    for (; i + CB_B32_LANES <= nb; i += CB_B32_LANES) {
        uint8_t u[4][4][2][32];
        float dw[4][CB_B32_LANES], mw[4][CB_B32_LANES];
        cb_b32_prefetch_next(next, size, i, nb);
        for (int r = 0; r < 4; r++) {
            const uint8_t *row = b + (size_t)r * row_bytes + (size_t)i * size;
            for (int j = 0; j < 4; j++) {
                __m256i lo, hi;
                b32_duo_unpack(t, row + 2 * j * size, size, book, &lo, &hi);
                _mm256_storeu_si256((__m256i *)u[r][j][0], lo);
                _mm256_storeu_si256((__m256i *)u[r][j][1], hi);
            }
            _mm256_storeu_ps(dw[r], halves8_perm(row, size));
            if (with_min) _mm256_storeu_ps(mw[r], halves8_perm(row + 2, size));
        }
        for (int k = 0; k < n_tok; k++) {
            const cb_block_q8_0 *x = xs[k] + i;
            __m256i xl[4], xh[4], sx = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                xl[j] = two16(x[2 * j].qs, x[2 * j + 1].qs), xh[j] = two16(x[2 * j].qs + 16, x[2 * j + 1].qs + 16);
            if (t != B32_IQ4_NL) {
                __m256i s[4];
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++)
                    s[j] = _mm256_madd_epi16(_mm256_add_epi16(pairs(_mm256_set1_epi8(1), xl[j]), pairs(_mm256_set1_epi8(1), xh[j])), ones);
                sx = lane_totals4(s[0], s[1], s[2], s[3]);
            }
            const __m256 dx = halves8_perm((const uint8_t *)&x->d, sizeof(cb_block_q8_0));
            const __m256 fx = _mm256_cvtepi32_ps(sx);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                __m256i p[4];
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++)
                    p[j] = b32_duo_dot(t, _mm256_loadu_si256((const __m256i *)u[r][j][0]), _mm256_loadu_si256((const __m256i *)u[r][j][1]),
                                       xl[j], xh[j]);
                __m256i tot = lane_totals4(p[0], p[1], p[2], p[3]);
                if (t == B32_Q5_0) tot = _mm256_sub_epi32(tot, _mm256_slli_epi32(sx, 4)); /* q - 16 */
                __m256 a = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_loadu_ps(dw[r])), f32(tot), _mm256_loadu_ps(acc[k][r]));
                if (with_min) a = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_loadu_ps(mw[r])), fx, a);
                _mm256_storeu_ps(acc[k][r], a);
            }
        }
    }
    for (int k = 0; k < n_tok; k++)
        for (int r = 0; r < 4; r++) {
            float lane[CB_B32_LANES];
            for (int j = 0; j < CB_B32_LANES; j++) lane[B32_PERM[j]] = acc[k][r][j];
            out[4 * k + r] = b32_rest(t, b + (size_t)r * row_bytes, xs[k], i, nb, lane);
        }
}
CB_B32_ENTRY_POINTS(q4_1, B32_Q4_1)
CB_B32_ENTRY_POINTS(q5_0, B32_Q5_0)
CB_B32_ENTRY_POINTS(q5_1, B32_Q5_1)
CB_B32_ENTRY_POINTS(iq4_nl, B32_IQ4_NL)
cb_tokens4_block_fn cb_tokens4_block_avx2(uint32_t dtype) {
    switch (dtype) {
    case CB_Q4_1: return tokens4_q4_1;
    case CB_Q5_0: return tokens4_q5_0;
    case CB_Q5_1: return tokens4_q5_1;
    case CB_IQ4_NL: return tokens4_iq4_nl;
    case CB_MXFP4: return tokens4_mxfp4;
    }
    return NULL;
}

cb_dot4_block_fn cb_dot4_block_avx2(uint32_t dtype) {
    switch (dtype) {
    case CB_Q4_1: return dot4_q4_1;
    case CB_Q5_0: return dot4_q5_0;
    case CB_Q5_1: return dot4_q5_1;
    case CB_IQ4_NL: return dot4_iq4_nl;
    case CB_MXFP4: return dot4_mxfp4;
    }
    return NULL;
}

/* ---- q8_k activations: a super-block's products summed in int32 lanes,
 * reduced exactly, then cb_kq_step (the scalar reference's bits). ---- */

/* The int32 sums of a's and b's lanes. */
static inline void hsum2_i32(__m256i a, __m128i b, int32_t *sa, int32_t *sb) {
    const __m128i a4 = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    const __m128i h = _mm_hadd_epi32(a4, b); /* a01 a23 b01 b23 */
    const __m128i t = _mm_hadd_epi32(h, h);
    *sa = _mm_cvtsi128_si32(t);
    *sb = _mm_extract_epi32(t, 1);
}

/* Shuffles putting word c of the scales in every word: loaded, not built
 * in the loop (gcc built each with a move and a broadcast on the shuffle
 * port the loop is bound by: hot-row q4_k 5.0 ticks per 32 weights). */
static const uint8_t q4_pick[8][32] __attribute__((aligned(32))) = {
#define PICK(c) {2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, \
                 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, \
                 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1}
    PICK(0), PICK(1), PICK(2), PICK(3), PICK(4), PICK(5), PICK(6), PICK(7)
#undef PICK
};

/* Q4_K / Q5_K: group c (0..7) is the low (even c) or high nibbles of
 * qs[32 * (c / 2)..] (plus bit c of qh[0..31] for q5); its 6-bit scale
 * multiplies the int16 pair sums in madd, and its min meets the group's 32
 * x through their per-16 sums. */
static inline __attribute__((always_inline)) float dot_q45_k(const void *w, const cb_block_q8_k *x, int n, int q5) {
    const size_t block = q5 ? sizeof(cb_block_q5_k) : sizeof(cb_block_q4_k);
    const __m256i low4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, x++) {
        const cb_block_q5_k *k5 = (const void *)((const uint8_t *)w + (size_t)i * block);
        const uint8_t *qs = q5 ? k5->qs : ((const cb_block_q4_k *)k5)->qs;
        uint64_t sc, mn;
        cb_q45_scales_mins(k5->scales, &sc, &mn);
        const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc)));
        const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn));
        const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)x->bsums),
                                          _mm_loadu_si128((const __m128i *)x->bsums + 1)); /* per 32 */
        const __m256i qh = q5 ? load32(k5->qh) : _mm256_setzero_si256();
        __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 8; c += 2) {
            const __m256i q = load32(qs + 16 * c);
            __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
            if (q5) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(c)), one), 4));
                hi = _mm256_or_si256(hi,
                                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(c + 1)), one), 4));
            }
            const __m256i s0 = _mm256_shuffle_epi8(scales, load32(q4_pick[c]));
            const __m256i s1 = _mm256_shuffle_epi8(scales, load32(q4_pick[c + 1]));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs(lo, load32(x->qs + 32 * c)), s0));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs(hi, load32(x->qs + 32 * c + 32)), s1));
        }
        int32_t sum, msum;
        hsum2_i32(acc, _mm_madd_epi16(bs, mins), &sum, &msum);
        s = cb_kq_step(s, x->d, _cvtsh_ss(k5->d), sum, _cvtsh_ss(k5->dmin), msum);
    }
    return s;
}
static float dot_q4_k(const void *w, const cb_block_q8_k *x, int n) { return dot_q45_k(w, x, n, 0); }
static float dot_q5_k(const void *w, const cb_block_q8_k *x, int n) { return dot_q45_k(w, x, n, 1); }

/* Q6_K: group c (n = c / 4, k = c % 4) is ql[64n + 32(k & 1)..] (low nibbles
 * for k < 2, high ones after) with qh[32n..] >> 2k as bits 4..5, unsigned
 * 0..63; the 32 subtracted comes off as 32 * scale * (sum of 16 x). */
/* Shuffles putting word 2k of a lane's scales in every word of the low
 * lane and word 2k + 1 in every word of the high one (a table: built from
 * k in the loop, gcc assembled them word by word). */
static const uint8_t q6_pick[4][32] __attribute__((aligned(32))) = {
#define PICK(k) {4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k, 4 * k + 1,  \
                 4 * k, 4 * k + 1, 4 * k, 4 * k + 1, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3,  \
                 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3, 4 * k + 2, 4 * k + 3}
    PICK(0), PICK(1), PICK(2), PICK(3)
#undef PICK
};

static float dot_q6_k(const void *w, const cb_block_q8_k *x, int n) {
    const cb_block_q6_k *b = w;
    const __m256i low4 = _mm256_set1_epi8(0xF), three = _mm256_set1_epi8(3);
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, b++, x++) {
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        /* Scales 0..7 in both lanes, then 8..15 in both: group c's two are
         * words 2k and 2k + 1 (k = c % 4) of one of them. */
        const __m256i sc_half[2] = {_mm256_permute4x64_epi64(sc16, 0x44), _mm256_permute4x64_epi64(sc16, 0xEE)};
        __m256i acc = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, load32(x->bsums)), 5));
        for (int half = 0; half < 2; half++) {
            const __m256i l0 = load32(b->ql + 64 * half), l1 = load32(b->ql + 64 * half + 32);
            const __m256i h = load32(b->qh + 32 * half);
            const __m256i u[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_slli_epi16(_mm256_and_si256(h, three), 4)),
                _mm256_or_si256(_mm256_and_si256(l1, low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), three), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), three), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), three), 4)),
            };
            for (int k = 0; k < 4; k++) {
                const __m256i sc = _mm256_shuffle_epi8(sc_half[half], load32(q6_pick[k]));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs(u[k], load32(x->qs + 128 * half + 32 * k)), sc));
            }
        }
        int32_t sum, unused;
        hsum2_i32(acc, _mm_setzero_si128(), &sum, &unused);
        s = cb_kq_step(s, x->d, _cvtsh_ss(b->d), sum, 0.0f, 0);
    }
    return s;
}

/* The int32 lane sums of the scales (16 int16) times the per-16 sums of x. */
static inline __m128i scaled_bsums(__m256i sc16, const int16_t *bsums) {
    const __m256i p = _mm256_madd_epi16(sc16, load32(bsums));
    return _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
}

/* Q2_K on q8_k: group c = 4 * half + k is (qs[32 * half..] >> 2k) & 3; its
 * two 16-weight scales meet the pair sums as Q6_K's do (q6_pick); mins
 * through the per-16 sums of x. */
static float dot_q2_k(const void *w, const cb_block_q8_k *x, int n) {
    const cb_block_q2_k *b = w;
    const __m256i three = _mm256_set1_epi8(3);
    const __m128i low4 = _mm_set1_epi8(0xF);
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, b++, x++) {
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)b->scales);
        const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc8, low4));
        const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), low4));
        const __m256i sc_half[2] = {_mm256_permute4x64_epi64(sc16, 0x44), _mm256_permute4x64_epi64(sc16, 0xEE)};
        __m256i acc = _mm256_setzero_si256();
        for (int half = 0; half < 2; half++) {
            const __m256i q = load32(b->qs + 32 * half);
            for (int k = 0; k < 4; k++) {
                const __m256i u = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * k)), three);
                const __m256i sc = _mm256_shuffle_epi8(sc_half[half], load32(q6_pick[k]));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs(u, load32(x->qs + 128 * half + 32 * k)), sc));
            }
        }
        int32_t sum, mins;
        hsum2_i32(acc, scaled_bsums(mn16, x->bsums), &sum, &mins);
        s = cb_kq_step(s, x->d, _cvtsh_ss(b->d), sum, _cvtsh_ss(b->dmin), mins);
    }
    return s;
}

/* Q3_K on q8_k: u = low 2 bits | 3rd bit << 2 (0..7), q = u - 4, so the
 * scales times the per-16 sums of x, 4 times, come off the start. */
static float dot_q3_k(const void *w, const cb_block_q8_k *x, int n) {
    const cb_block_q3_k *b = w;
    const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, b++, x++) {
        const __m256i sc16 = _mm256_cvtepi8_epi16(q3_scales(b->scales));
        const __m256i sc_half[2] = {_mm256_permute4x64_epi64(sc16, 0x44), _mm256_permute4x64_epi64(sc16, 0xEE)};
        const __m256i hm = load32(b->hmask);
        __m256i acc = _mm256_setzero_si256();
        for (int half = 0; half < 2; half++) {
            const __m256i q = load32(b->qs + 32 * half);
            for (int k = 0; k < 4; k++) {
                const __m256i hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(4 * half + k)), one);
                const __m256i u = _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * k)), three),
                                                  _mm256_slli_epi16(hb, 2));
                const __m256i sc = _mm256_shuffle_epi8(sc_half[half], load32(q6_pick[k]));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs(u, load32(x->qs + 128 * half + 32 * k)), sc));
            }
        }
        int32_t sum, offs;
        hsum2_i32(acc, scaled_bsums(sc16, x->bsums), &sum, &offs);
        s = cb_kq_step(s, x->d, _cvtsh_ss(b->d), sum - 4 * offs, 0.0f, 0);
    }
    return s;
}

/* IQ4_XS on q8_k: group g's levels . x (signs moved onto x) as int16 pair
 * sums, times its 6-bit scale less 32 in madd. */
static float dot_iq4_xs(const void *w, const cb_block_q8_k *x, int n) {
    const cb_block_iq4_xs *b = w;
    const __m256i book = codebook(cb_iq4nl_values);
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, b++, x++) {
        __m256i acc = _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) {
            const int ls = ((b->scales_l[g / 2] >> (4 * (g % 2))) & 0xF) | ((b->scales_h >> (2 * g)) & 3) << 4;
            const __m256i q = _mm256_shuffle_epi8(book, nibbles16(b->qs + 16 * g));
            const __m256i xq = load32(x->qs + 32 * g);
            const __m256i p = pairs(_mm256_sign_epi8(q, q), _mm256_sign_epi8(xq, q));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16((short)(ls - 32))));
        }
        int32_t sum, unused;
        hsum2_i32(acc, _mm_setzero_si128(), &sum, &unused);
        s = cb_kq_step(s, x->d, _cvtsh_ss(b->d), sum, 0.0f, 0);
    }
    return s;
}

/* cb_quantize_row_q8_k's bytes (the engine's q8_k activations): amax by
 * max (exact), the first value of that magnitude found by a compare, each
 * q rounded to nearest even in the instruction, the per-16 sums exact in
 * int32. */
void cb_quantize_row_q8_k_avx2(const float *x, cb_block_q8_k *y, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int b = 0; b < n / CB_QK_K; b++, x += CB_QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < CB_QK_K / 8; i++) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * i)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        float max = 0.0f;
        if (amax != 0.0f)
            for (int i = 0; i < CB_QK_K / 8; i++) {
                const __m256 v = _mm256_loadu_ps(x + 8 * i);
                const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, v), _mm256_set1_ps(amax), _CMP_EQ_OQ));
                if (hit) {
                    max = x[8 * i + __builtin_ctz((unsigned)hit)];
                    break;
                }
            }
        const float iscale = cb_q8_k_iscale(max);
        y[b].d = iscale != 0.0f ? 1.0f / iscale : 0.0f;
        __m256i sums[16];
        for (int g = 0; g < CB_QK_K / 32; g++) {
            __m256i q[4];
            for (int i = 0; i < 4; i++) {
                const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + 32 * g + 8 * i), _mm256_set1_ps(iscale));
                q[i] = _mm256_min_epi32(_mm256_cvttps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)),
                                        _mm256_set1_epi32(127));
            }
            sums[2 * g] = _mm256_add_epi32(q[0], q[1]);
            sums[2 * g + 1] = _mm256_add_epi32(q[2], q[3]);
            /* int32 -> int8; the packs work per 128-bit lane, so put the dwords back in order. */
            __m256i q8 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            q8 = _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(y[b].qs + 32 * g), q8);
        }
        /* Sixteen totals to int16 (each at most 16 * 127): packs interleaves
         * the lanes' halves, the permute restores the order. */
        const __m256i s16 = _mm256_packs_epi32(totals8(sums), totals8(sums + 8));
        _mm256_storeu_si256((__m256i *)y[b].bsums, _mm256_permute4x64_epi64(s16, 0xD8));
    }
}

cb_dot_k_fn cb_dot_k_avx2(uint32_t dtype) {
    CB_DOT_K_DISPATCH(dtype);
}
