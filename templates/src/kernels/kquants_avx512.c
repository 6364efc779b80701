/* AVX-512 (F/BW/DQ/VL) dot products of GGML's block types (dims.h ids
 * 8..17; MXFP4 keeps the AVX2 kernel) against q8_0 activations (the
 * 32-weight types) or q8_k ones (the 256-weight types). Reference:
 * kernels/kquants.c: the integer sums are computed exactly and the float
 * steps are the shared cb_b32_step / cb_kq_step, so the results are the
 * reference's bits (kernel_check.c).
 * With AVX512-VNNI in the compiler's flags (-march=native on such a CPU:
 * colibri-server then checks the CPU has it at start) four byte products go
 * into an int32 lane in one vpdpbusd; otherwise maddubs + madd give the same
 * lane sums. tests/test_avx512_simde.py compiles this file over SIMDe, both
 * forms, where the CPU has no AVX-512. */
#ifdef CB_SIMDE /* the SIMDe check: AVX-512 emulated, the same source */
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#undef _mm512_madd_epi16 /* SIMDe 0.7.4 aliases it with the masked form's four arguments */
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)
#else
#include <immintrin.h>
#endif
#include <string.h>

#include "kernels.h"
#include "kquants_x86.h"

#if defined(__AVX512VNNI__) || defined(CB_AVX512_VNNI_FORM)
#define KQ_VNNI 1
#else
#define KQ_VNNI 0
#endif

static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

/* u (unsigned bytes, at most 127) . s (signed bytes): each int32 lane the
 * sum of its four byte products (maddubs pairs stay within int16). */
static inline __m512i dot4(__m512i u, __m512i s) {
#if KQ_VNNI
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
#else
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
#endif
}

/* Signed w . x: |w| against x negated where w < 0. */
static inline __m512i dot4_signed(__m512i w, __m512i x) {
    return dot4(_mm512_abs_epi8(w), _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x));
}

/* The exact sum of the int32 lanes. */
static inline int32_t total256(__m256i v) {
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1)));
}
static inline int32_t total512(__m512i v) {
    return total256(_mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)));
}

/* ---- the 32-weight types on q8_0: two blocks a register (block a in the
 * low half), eight blocks' totals into the eight float lanes of cb_b32_step,
 * the last n / 32 % 8 blocks lane by lane. ---- */
enum { B32_Q4_1, B32_Q5_0, B32_Q5_1, B32_IQ4_NL };
static const int b32_size[] = {sizeof(cb_block_q4_1), sizeof(cb_block_q5_0), sizeof(cb_block_q5_1),
                               sizeof(cb_block_iq4_nl)};
static const int b32_qs[] = {4, 6, 8, 2}; /* offsets of qs in the block */
/* The four-row and prompt kernels with VNNI take iq4_nl's levels as level
 * + 128 (vpdpbusd's unsigned operand; maddubs' int16 pairs would overflow)
 * and take 128 sum(x) off a block's total, as q5_0 takes its 16 sum(x):
 * two vpdpbusd a quad where |w| . sign(x, w) took eight operations. The
 * totals are exact either way: the same bits. */
#define B32_NL_PLUS128 KQ_VNNI
/* The shift of sum(x) a type's block total loses (0: none). */
static inline int b32_offset_shift(int t) { return t == B32_Q5_0 ? 4 : t == B32_IQ4_NL && B32_NL_PLUS128 ? 7 : 0; }

/* Two blocks' 16 bytes of nibbles -> 64 bytes 0..15 in element order. */
static inline __m512i nibbles_pair(const uint8_t *qa, const uint8_t *qb) {
    const __m512i q = join(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qa)),
                           _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qb)));
    return _mm512_and_si512(_mm512_srlv_epi64(q, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0xF));
}

/* Two blocks' 5th bits (bit j of 4 bytes) -> 0x10 in byte j where set. */
static inline __m512i bit5_pair(const uint8_t *ha, const uint8_t *hb) {
    uint32_t a, b;
    memcpy(&a, ha, 4);
    memcpy(&b, hb, 4);
    return _mm512_maskz_mov_epi8((__mmask64)b << 32 | a, _mm512_set1_epi8(0x10));
}

/* Blocks a and b's sum(q x) as int32 lanes (a's in the low half), and
 * sum(x) in *sx for the types with a min. */
static inline __attribute__((always_inline)) __m512i b32_pair(int t, const uint8_t *ba, const uint8_t *bb,
                                                             const int8_t *xa, const int8_t *xb, __m512i *sx) {
    const __m512i xq = join(load32(xa), load32(xb));
    if (t == B32_IQ4_NL) {
        const __m512i book = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)cb_iq4nl_values));
        return dot4_signed(_mm512_shuffle_epi8(book, nibbles_pair(ba + 2, bb + 2)), xq);
    }
    __m512i u = nibbles_pair(ba + b32_qs[t], bb + b32_qs[t]);
    if (t != B32_Q4_1) u = _mm512_or_si512(u, bit5_pair(ba + b32_qs[t] - 4, bb + b32_qs[t] - 4));
    const __m512i sq = dot4(u, xq), s1 = dot4(_mm512_set1_epi8(1), xq);
    if (t == B32_Q5_0) return _mm512_sub_epi32(sq, _mm512_slli_epi32(s1, 4)); /* q - 16 */
    *sx = s1;
    return sq;
}

/* Blocks i..nb - 1 (fewer than eight) into their lanes one by one, each as
 * both halves of a pair (its sums from the low one); the row's total. */
static inline float b32_rest(int t, const uint8_t *b, const cb_block_q8_0 *x, int i, int nb, float lane[CB_B32_LANES]) {
    const int size = b32_size[t], with_min = t == B32_Q4_1 || t == B32_Q5_1;
    for (; i < nb; i++) {
        const uint8_t *blk = b + (size_t)i * size;
        __m512i px = _mm512_setzero_si512();
        const int32_t sq = total256(_mm512_castsi512_si256(b32_pair(t, blk, blk, x[i].qs, x[i].qs, &px)));
        cb_half hd, hm;
        memcpy(&hd, blk, 2);
        const float dx = _cvtsh_ss(x[i].d);
        float *l = &lane[i % CB_B32_LANES];
        *l = cb_b32_step(*l, dx * _cvtsh_ss(hd), sq);
        if (with_min) memcpy(&hm, blk + 2, 2), *l = cb_b32_step(*l, dx * _cvtsh_ss(hm), total256(_mm512_castsi512_si256(px)));
    }
    return cb_b32_sum(lane);
}

static inline __attribute__((always_inline)) float dot_b32(int t, const void *w, const cb_block_q8_0 *x, int n) {
    const uint8_t *b = w;
    const int size = b32_size[t], with_min = t == B32_Q4_1 || t == B32_Q5_1, nb = n / CB_QK;
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + CB_B32_LANES <= nb; i += CB_B32_LANES) {
        __m256i sq[8], sx[8];
        for (int j = 0; j < 8; j += 2) {
            const uint8_t *ba = b + (size_t)(i + j) * size, *bb = ba + size;
            __m512i pq, px = _mm512_setzero_si512();
            pq = b32_pair(t, ba, bb, x[i + j].qs, x[i + j + 1].qs, &px);
            sq[j] = _mm512_castsi512_si256(pq), sq[j + 1] = _mm512_extracti64x4_epi64(pq, 1);
            sx[j] = _mm512_castsi512_si256(px), sx[j + 1] = _mm512_extracti64x4_epi64(px, 1);
        }
        const uint8_t *blk = b + (size_t)i * size;
        const __m256 dx = halves8((const uint8_t *)&x[i].d, sizeof(cb_block_q8_0));
        acc = _mm256_fmadd_ps(_mm256_mul_ps(dx, halves8(blk, size)), _mm256_cvtepi32_ps(totals8(sq)), acc);
        if (with_min) acc = _mm256_fmadd_ps(_mm256_mul_ps(dx, halves8(blk + 2, size)), _mm256_cvtepi32_ps(totals8(sx)), acc);
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

cb_dot_block_fn cb_dot_block_avx512(uint32_t dtype) {
    switch (dtype) {
    case CB_Q4_1: return dot_q4_1;
    case CB_Q5_0: return dot_q5_0;
    case CB_Q5_1: return dot_q5_1;
    case CB_IQ4_NL: return dot_iq4_nl;
    }
    return NULL;
}

/* ---- four rows of the 32-weight types on q8_0 at once. A register holds
 * one half (elements 0..15 or 16..31) of four blocks of a row, a 128-bit
 * lane a block, so x's halves (loaded once for the four rows) meet a
 * row's low and high nibbles as they lie, and one fold gives two rows'
 * eight block totals. Each lane then meets the one-row kernel's steps in
 * its order (dx * d, cb_b32_step, the min's step after): out[r] is its
 * bits. ---- */

/* Four registers' 128-bit lanes' totals: lane k of the result holds those
 * of lane k of p0, p1, p2, p3 in its dwords 0..3. */
static inline __attribute__((always_inline)) __m512i lane_totals4(__m512i p0, __m512i p1, __m512i p2, __m512i p3) {
    const __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(p0, p1), _mm512_unpackhi_epi32(p0, p1));
    const __m512i b = _mm512_add_epi32(_mm512_unpacklo_epi32(p2, p3), _mm512_unpackhi_epi32(p2, p3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}

/* Bytes 16h.. of x[0..3]'s quants, a block a 128-bit lane. */
static inline __m512i x_halves4(const cb_block_q8_0 *x, int h) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(x[0].qs + 16 * h)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(x[1].qs + 16 * h)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(x[2].qs + 16 * h)), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(x[3].qs + 16 * h)), 3);
}

static inline __attribute__((always_inline)) __m512i dot4_acc(__m512i acc, __m512i u, __m512i s) {
#if KQ_VNNI
    return _mm512_dpbusd_epi32(acc, u, s);
#else
    return _mm512_add_epi32(acc, dot4(u, s));
#endif
}

/* Blocks 0..3 (from blk, size bytes apart) of one row as the bytes that
 * meet x's halves: *lo elements 0..15, *hi 16..31, a block a 128-bit lane
 * (iq4_nl: its signed levels; the others unsigned, the 5th bit set). */
static inline __attribute__((always_inline)) void b32_unpack(int t, const uint8_t *blk, int size, __m512i *lo, __m512i *hi) {
    const int qs = b32_qs[t];
    __m512i q = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(blk + qs)));
    q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(blk + size + qs)), 1);
    q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(blk + 2 * size + qs)), 2);
    q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(blk + 3 * size + qs)), 3);
    const __m512i low4 = _mm512_set1_epi8(0xF);
    *lo = _mm512_and_si512(q, low4), *hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
    if (t == B32_IQ4_NL) {
        __m512i book = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)cb_iq4nl_values));
        if (B32_NL_PLUS128) book = _mm512_xor_si512(book, _mm512_set1_epi8((char)0x80));
        *lo = _mm512_shuffle_epi8(book, *lo), *hi = _mm512_shuffle_epi8(book, *hi);
    } else if (t != B32_Q4_1) { /* the 5th bits: qh's bits 0..15 for the low nibbles, 16..31 the high */
        uint32_t h[4];
        for (int k = 0; k < 4; k++) memcpy(&h[k], blk + k * size + qs - 4, 4);
        const uint64_t ml = (h[0] & 0xFFFF) | (uint64_t)(h[1] & 0xFFFF) << 16 | (uint64_t)(h[2] & 0xFFFF) << 32 |
                            (uint64_t)(h[3] & 0xFFFF) << 48;
        const uint64_t mh = (h[0] >> 16) | (uint64_t)(h[1] >> 16) << 16 | (uint64_t)(h[2] >> 16) << 32 |
                            (uint64_t)(h[3] >> 16) << 48;
        const __m512i bit4 = _mm512_set1_epi8(0x10);
        *lo = _mm512_or_si512(*lo, _mm512_maskz_mov_epi8((__mmask64)ml, bit4));
        *hi = _mm512_or_si512(*hi, _mm512_maskz_mov_epi8((__mmask64)mh, bit4));
    }
}
/* b32_unpack's lo, hi . x's halves xl, xh: each 128-bit lane one block's
 * four-product sums (less b32_offset_shift's sum(x)). */
static inline __attribute__((always_inline)) __m512i b32_dot(int t, __m512i lo, __m512i hi, __m512i xl, __m512i xh) {
    if (t == B32_IQ4_NL && !B32_NL_PLUS128) return _mm512_add_epi32(dot4_signed(lo, xl), dot4_signed(hi, xh));
    return dot4_acc(dot4(lo, xl), hi, xh);
}
static inline __attribute__((always_inline)) __m512i b32_quad(int t, const uint8_t *blk, int size, __m512i xl, __m512i xh) {
    __m512i lo, hi;
    b32_unpack(t, blk, size, &lo, &hi);
    return b32_dot(t, lo, hi, xl, xh);
}

/* The words idx picks from the 64 bytes at p and the 64 at hi, into the
 * words of into that mask selects (a row's four blocks' scales, or x's). */
static inline __attribute__((always_inline)) __m512i halves_of4(const void *p, const void *hi, __m512i idx, __mmask32 mask,
                                                                __m512i into) {
    return _mm512_mask_blend_epi16(mask, into, _mm512_permutex2var_epi16(_mm512_loadu_si512(p), idx, _mm512_loadu_si512(hi)));
}
/* x's four blocks (136 bytes): the second 64 right after the first. */
#define X_HALVES4(x, idx, mask, into) halves_of4((x), (const uint8_t *)(x) + 64, idx, mask, into)
/* A row's four blocks end 4 * size (72..96) bytes on, maybe at the end of
 * the mapped file: the second load is the 64 bytes that end there, and
 * b32_scale_idx points the words past the first 64 into it. */
#define W_HALVES4(q, size, idx, mask, into) halves_of4((q), (q) + 4 * (size) - 64, idx, mask, into)
/* vpermt2w controls for W_HALVES4: word 4k + m (and 16 + 4k + m, the
 * min) of the scales is block k's word k * size / 2 (+ 1); sizes are even. */
static inline __m512i b32_scale_idx(int size) {
    int16_t idx[32];
    for (int l = 0; l < 32; l++) {
        const int word = (l % 16) / 4 * (size / 2) + (l >= 16);
        idx[l] = (int16_t)(word < 32 ? word : word + (128 - 4 * size) / 2);
    }
    return _mm512_loadu_si512((const void *)idx);
}

static const int16_t b32_k_of[32] __attribute__((aligned(64))) = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3,
                                                                  0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
/* Lane 4k + m of a fold of rows a, b (m: 0 row a block k, 1 row a block
 * 4 + k, 2 and 3 row b's) -> its block. */
#define B32_BLOCK_OF(l) ((l) / 4 + 4 * ((l) & 1))

static inline __attribute__((always_inline)) void dot4_b32(int t, const void *w, size_t row_bytes,
                                                           const cb_block_q8_0 *x, int n, float out[4],
                                                           const void *next) {
    const int size = b32_size[t], with_min = t == B32_Q4_1 || t == B32_Q5_1, nb = n / CB_QK;
    const uint8_t *b = w;
    const __m512i k_of = _mm512_load_si512((const void *)b32_k_of);
    const __m512i w_idx = b32_scale_idx(size);
    const __m512i x_idx = _mm512_mullo_epi16(k_of, _mm512_set1_epi16((short)(sizeof(cb_block_q8_0) / 2)));
    /* float steps in 256-bit halves: lanes 0..7 and 8..15 of each fold (the
     * file's float work is AVX2's: SIMDe has no 512-bit cvtph_ps / cvtepi32_ps) */
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int i = 0;
    for (; i + CB_B32_LANES <= nb; i += CB_B32_LANES) {
        cb_b32_prefetch_next(next, size, i, nb);
        const __m512i xl0 = x_halves4(x + i, 0), xh0 = x_halves4(x + i, 1);
        const __m512i xl1 = x_halves4(x + i + 4, 0), xh1 = x_halves4(x + i + 4, 1);
        __m512i tot[2];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const uint8_t *ra = b + (size_t)(2 * h) * row_bytes + (size_t)i * size, *rb = ra + row_bytes;
            tot[h] = lane_totals4(b32_quad(t, ra, size, xl0, xh0), b32_quad(t, ra + 4 * size, size, xl1, xh1),
                                  b32_quad(t, rb, size, xl0, xh0), b32_quad(t, rb + 4 * size, size, xl1, xh1));
        }
        __m512i sx = _mm512_setzero_si512();
        if (t != B32_IQ4_NL || B32_NL_PLUS128) { /* sum(x) of each lane's block */
            const __m512i one = _mm512_set1_epi8(1);
            const __m512i s0 = dot4_acc(dot4(one, xl0), one, xh0), s1 = dot4_acc(dot4(one, xl1), one, xh1);
            sx = lane_totals4(s0, s1, s0, s1);
        }
        if (b32_offset_shift(t)) { /* q5_0: q - 16; iq4_nl (VNNI): level + 128 */
            tot[0] = _mm512_sub_epi32(tot[0], _mm512_slli_epi32(sx, b32_offset_shift(t)));
            tot[1] = _mm512_sub_epi32(tot[1], _mm512_slli_epi32(sx, b32_offset_shift(t)));
        }
        /* each lane's fp16 d (words 0..15; m in 16..31, for the types with a
         * min) of w, and d of x */
        const __m256i hx =
            _mm512_castsi512_si256(X_HALVES4(x + i + 4, x_idx, 0xAAAA, X_HALVES4(x + i, x_idx, 0x5555, _mm512_setzero_si512())));
        const __m256 dx[2] = {_mm256_cvtph_ps(_mm256_castsi256_si128(hx)), _mm256_cvtph_ps(_mm256_extracti128_si256(hx, 1))};
        __m256 fx[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        if (with_min)
            fx[0] = _mm256_cvtepi32_ps(_mm512_castsi512_si256(sx)), fx[1] = _mm256_cvtepi32_ps(_mm512_extracti64x4_epi64(sx, 1));
#pragma GCC unroll 2
        for (int f = 0; f < 2; f++) {
            const uint8_t *ra = b + (size_t)(2 * f) * row_bytes + (size_t)i * size, *rb = ra + row_bytes;
            __m512i h = W_HALVES4(ra, size, w_idx, 0x11111111, _mm512_setzero_si512());
            h = W_HALVES4(ra + 4 * size, size, w_idx, 0x22222222, h);
            h = W_HALVES4(rb, size, w_idx, 0x44444444, h);
            h = W_HALVES4(rb + 4 * size, size, w_idx, 0x88888888, h);
            const __m256i d = _mm512_castsi512_si256(h), m = _mm512_extracti64x4_epi64(h, 1);
            const __m256i tt[2] = {_mm512_castsi512_si256(tot[f]), _mm512_extracti64x4_epi64(tot[f], 1)};
#pragma GCC unroll 2
            for (int k = 0; k < 2; k++) {
                const __m256 dw = _mm256_cvtph_ps(k ? _mm256_extracti128_si256(d, 1) : _mm256_castsi256_si128(d));
                __m256 a = _mm256_fmadd_ps(_mm256_mul_ps(dx[k], dw), _mm256_cvtepi32_ps(tt[k]), acc[2 * f + k]);
                if (with_min) {
                    const __m256 mw = _mm256_cvtph_ps(k ? _mm256_extracti128_si256(m, 1) : _mm256_castsi256_si128(m));
                    a = _mm256_fmadd_ps(_mm256_mul_ps(dx[k], mw), fx[k], a);
                }
                acc[2 * f + k] = a;
            }
        }
    }
    float l[2][16], lane[4][CB_B32_LANES];
    for (int k = 0; k < 4; k++) _mm256_storeu_ps(&l[k / 2][8 * (k % 2)], acc[k]);
    for (int k = 0; k < 16; k++) {
        const int m = k & 3;
        lane[m >> 1][B32_BLOCK_OF(k)] = l[0][k];
        lane[2 + (m >> 1)][B32_BLOCK_OF(k)] = l[1][k];
    }
    for (int r = 0; r < 4; r++) out[r] = b32_rest(t, b + (size_t)r * row_bytes, x, i, nb, lane[r]);
}
/* Four rows . n_tok (at most CB_TOKENS_BLOCK_MAX) tokens' q8_0 rows xs[k]
 * (a prompt's): out[4k + r], each dot4_b32's bits. Each eight blocks of
 * the four rows are unpacked once, their scales too, for all the tokens;
 * a token's lanes wait in acc between them, in the same order of steps. */
static inline __attribute__((always_inline)) void tokens4_b32(int t, const void *w, size_t row_bytes,
                                                              const cb_block_q8_0 *const *xs, int n_tok, int n,
                                                              float *out, const void *next) {
    const int size = b32_size[t], with_min = t == B32_Q4_1 || t == B32_Q5_1, nb = n / CB_QK;
    const uint8_t *b = w;
    const __m512i k_of = _mm512_load_si512((const void *)b32_k_of);
    const __m512i w_idx = b32_scale_idx(size);
    const __m512i x_idx = _mm512_mullo_epi16(k_of, _mm512_set1_epi16((short)(sizeof(cb_block_q8_0) / 2)));
    float acc[CB_TOKENS_BLOCK_MAX][4][CB_B32_LANES]; /* a token's four fold halves; 8 KB of stack */
    memset(acc, 0, sizeof(float) * 4 * CB_B32_LANES * (size_t)n_tok);
    int i = 0;
    for (; i + CB_B32_LANES <= nb; i += CB_B32_LANES) {
        __m512i u[2][4][2];
        __m256 dw[2][2], mw[2][2];
        cb_b32_prefetch_next(next, size, i, nb);
#pragma GCC unroll 2
        for (int f = 0; f < 2; f++) {
            const uint8_t *ra = b + (size_t)(2 * f) * row_bytes + (size_t)i * size, *rb = ra + row_bytes;
            const uint8_t *quad[4] = {ra, ra + 4 * size, rb, rb + 4 * size};
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) b32_unpack(t, quad[q], size, &u[f][q][0], &u[f][q][1]);
            __m512i h = W_HALVES4(ra, size, w_idx, 0x11111111, _mm512_setzero_si512());
            h = W_HALVES4(ra + 4 * size, size, w_idx, 0x22222222, h);
            h = W_HALVES4(rb, size, w_idx, 0x44444444, h);
            h = W_HALVES4(rb + 4 * size, size, w_idx, 0x88888888, h);
            const __m256i d = _mm512_castsi512_si256(h), m = _mm512_extracti64x4_epi64(h, 1);
            dw[f][0] = _mm256_cvtph_ps(_mm256_castsi256_si128(d)), dw[f][1] = _mm256_cvtph_ps(_mm256_extracti128_si256(d, 1));
            mw[f][0] = _mm256_cvtph_ps(_mm256_castsi256_si128(m)), mw[f][1] = _mm256_cvtph_ps(_mm256_extracti128_si256(m, 1));
        }
        for (int k = 0; k < n_tok; k++) {
            const cb_block_q8_0 *x = xs[k] + i;
            const __m512i xl0 = x_halves4(x, 0), xh0 = x_halves4(x, 1), xl1 = x_halves4(x + 4, 0), xh1 = x_halves4(x + 4, 1);
            __m512i sx = _mm512_setzero_si512();
            if (t != B32_IQ4_NL || B32_NL_PLUS128) {
                const __m512i one = _mm512_set1_epi8(1);
                const __m512i s0 = dot4_acc(dot4(one, xl0), one, xh0), s1 = dot4_acc(dot4(one, xl1), one, xh1);
                sx = lane_totals4(s0, s1, s0, s1);
            }
            const __m256i hx =
                _mm512_castsi512_si256(X_HALVES4(x + 4, x_idx, 0xAAAA, X_HALVES4(x, x_idx, 0x5555, _mm512_setzero_si512())));
            const __m256 dx[2] = {_mm256_cvtph_ps(_mm256_castsi256_si128(hx)), _mm256_cvtph_ps(_mm256_extracti128_si256(hx, 1))};
            __m256 fx[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
            if (with_min)
                fx[0] = _mm256_cvtepi32_ps(_mm512_castsi512_si256(sx)), fx[1] = _mm256_cvtepi32_ps(_mm512_extracti64x4_epi64(sx, 1));
#pragma GCC unroll 2
            for (int f = 0; f < 2; f++) {
                __m512i tot = lane_totals4(b32_dot(t, u[f][0][0], u[f][0][1], xl0, xh0), b32_dot(t, u[f][1][0], u[f][1][1], xl1, xh1),
                                           b32_dot(t, u[f][2][0], u[f][2][1], xl0, xh0), b32_dot(t, u[f][3][0], u[f][3][1], xl1, xh1));
                if (b32_offset_shift(t)) tot = _mm512_sub_epi32(tot, _mm512_slli_epi32(sx, b32_offset_shift(t)));
                const __m256i tt[2] = {_mm512_castsi512_si256(tot), _mm512_extracti64x4_epi64(tot, 1)};
#pragma GCC unroll 2
                for (int j = 0; j < 2; j++) {
                    __m256 a = _mm256_fmadd_ps(_mm256_mul_ps(dx[j], dw[f][j]), _mm256_cvtepi32_ps(tt[j]),
                                               _mm256_loadu_ps(acc[k][2 * f + j]));
                    if (with_min) a = _mm256_fmadd_ps(_mm256_mul_ps(dx[j], mw[f][j]), fx[j], a);
                    _mm256_storeu_ps(acc[k][2 * f + j], a);
                }
            }
        }
    }
    for (int k = 0; k < n_tok; k++) {
        float l[2][16], lane[4][CB_B32_LANES];
        for (int j = 0; j < 4; j++) memcpy(&l[j / 2][8 * (j % 2)], acc[k][j], sizeof acc[k][j]);
        for (int j = 0; j < 16; j++) {
            const int m = j & 3;
            lane[m >> 1][B32_BLOCK_OF(j)] = l[0][j];
            lane[2 + (m >> 1)][B32_BLOCK_OF(j)] = l[1][j];
        }
        for (int r = 0; r < 4; r++) out[4 * k + r] = b32_rest(t, b + (size_t)r * row_bytes, xs[k], i, nb, lane[r]);
    }
}
#undef B32_BLOCK_OF
CB_B32_ENTRY_POINTS(q4_1, B32_Q4_1)
CB_B32_ENTRY_POINTS(q5_0, B32_Q5_0)
CB_B32_ENTRY_POINTS(q5_1, B32_Q5_1)
CB_B32_ENTRY_POINTS(iq4_nl, B32_IQ4_NL)
cb_tokens4_block_fn cb_tokens4_block_avx512(uint32_t dtype) {
    switch (dtype) {
    case CB_Q4_1: return tokens4_q4_1;
    case CB_Q5_0: return tokens4_q5_0;
    case CB_Q5_1: return tokens4_q5_1;
    case CB_IQ4_NL: return tokens4_iq4_nl;
    case CB_MXFP4: return cb_tokens4_block_avx2(dtype); /* its 256-bit kernel (VNNI where there is) */
    }
    return NULL;
}

cb_dot4_block_fn cb_dot4_block_avx512(uint32_t dtype) {
    switch (dtype) {
    case CB_Q4_1: return dot4_q4_1;
    case CB_Q5_0: return dot4_q5_0;
    case CB_Q5_1: return dot4_q5_1;
    case CB_IQ4_NL: return dot4_iq4_nl;
    }
    return NULL;
}

/* ---- the 256-weight types on q8_k: a super-block's weights unpacked to
 * four registers in element order (register z: weights 64z..64z + 63, so x
 * is four plain loads), int32 lanes of four products times the scale of
 * their 16 weights, summed exactly, then cb_kq_step. ---- */

/* Lane l of register z covers weights 64z + 4l..: 16-weight group 4z + l / 4. */
static const int32_t group_of_lane[4][16] __attribute__((aligned(64))) = {
    {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3},
    {4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7},
    {8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11},
    {12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15},
};

/* sum over the 256 weights of scale(group) * w * x; sc: the 16 groups'
 * scales as int32 lanes. */
static inline __attribute__((always_inline)) int32_t scaled_sum(const __m512i u[4], __m512i sc, const int8_t *xqs,
                                                               int is_signed) {
    __m512i acc = _mm512_setzero_si512();
    for (int z = 0; z < 4; z++) {
        const __m512i xq = _mm512_loadu_si512((const void *)(xqs + 64 * z));
        const __m512i p = is_signed ? dot4_signed(u[z], xq) : dot4(u[z], xq);
        const __m512i s = _mm512_permutexvar_epi32(_mm512_load_si512((const void *)group_of_lane[z]), sc);
        acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(p, s));
    }
    return total512(acc);
}

/* The groups' scales are signed bytes (16, one a group), built in
 * registers: stored bytes read back as a vector would stall store
 * forwarding. As int32 lanes (_mm512_cvtepi8_epi32, which SIMDe lacks): */
static inline __m512i lanes16(__m128i c8) {
    return join(_mm256_cvtepi8_epi32(c8), _mm256_cvtepi8_epi32(_mm_srli_si128(c8, 8)));
}
/* sum over the 16 groups of c[g] * bsums[g]. */
static inline int32_t with_bsums(__m128i c8, const int16_t *bsums) {
    return total256(_mm256_madd_epi16(_mm256_cvtepi8_epi16(c8), load32(bsums)));
}
/* Eight per-32 values (byte j of v) as the 16 groups' (entry g / 2 for group g). */
static inline __m128i per32(uint64_t v) {
    const __m128i b = _mm_cvtsi64_si128((long long)v);
    return _mm_unpacklo_epi8(b, b);
}

/* Bytes of v with bit `bit` set, as a mask. */
static inline uint32_t has_bit(__m256i v, int bit) {
    const __m256i m = _mm256_set1_epi8((char)(1 << bit));
    return (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_and_si256(v, m), m));
}

static inline __m256i and3(__m256i v, int shift) {
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(3));
}
static inline __m256i nib_lo(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(0xF)); }
static inline __m256i nib_hi(__m256i v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0xF)); }

/* Q4_K / Q5_K: group c (32 weights) is the low (even c) or high nibbles of
 * qs[32 * (c / 2)..], plus bit c of qh[0..31] for q5; 6-bit scales and mins
 * as kquants.c scale_min_k4. */
static inline __attribute__((always_inline)) float dot_q45_k(const void *w, const cb_block_q8_k *x, int n, int q5) {
    const size_t block = q5 ? sizeof(cb_block_q5_k) : sizeof(cb_block_q4_k);
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, x++) {
        const cb_block_q5_k *k5 = (const void *)((const uint8_t *)w + (size_t)i * block);
        const uint8_t *qs = q5 ? k5->qs : ((const cb_block_q4_k *)k5)->qs;
        uint64_t sc, mn;
        cb_q45_scales_mins(k5->scales, &sc, &mn);
        const __m256i qh = q5 ? load32(k5->qh) : _mm256_setzero_si256();
        __m512i u[4];
        for (int z = 0; z < 4; z++) {
            const __m256i q = load32(qs + 32 * z);
            u[z] = join(nib_lo(q), nib_hi(q));
            if (q5) {
                const __mmask64 bits = (__mmask64)has_bit(qh, 2 * z) | (__mmask64)has_bit(qh, 2 * z + 1) << 32;
                u[z] = _mm512_or_si512(u[z], _mm512_maskz_mov_epi8(bits, _mm512_set1_epi8(0x10)));
            }
        }
        const int32_t sum = scaled_sum(u, lanes16(per32(sc)), x->qs, 0);
        const int32_t mins = with_bsums(per32(mn), x->bsums);
        s = cb_kq_step(s, x->d, _cvtsh_ss(k5->d), sum, _cvtsh_ss(k5->dmin), mins);
    }
    return s;
}
/* q4_k, q5_k: q8_k activations, one step per super-block (kquants.c). */
static float dot_q4_k(const void *w, const cb_block_q8_k *x, int n) { return dot_q45_k(w, x, n, 0); }
static float dot_q5_k(const void *w, const cb_block_q8_k *x, int n) { return dot_q45_k(w, x, n, 1); }

/* Q6_K: weights 64z.. are ql[64 (z / 2)..] (low nibbles for even z, high
 * for odd) with qh[32 (z / 2)..] >> 2k as bits 4..5, k = 2 (z % 2) and
 * k + 1 for the two halves; unsigned 0..63, the 32 off through the sums of x. */
static float dot_q6_k(const void *w, const cb_block_q8_k *x, int n) {
    const cb_block_q6_k *b = w;
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, b++, x++) {
        __m512i u[4];
        for (int z = 0; z < 4; z++) {
            const int h = z / 2, k = 2 * (z % 2);
            const __m256i l0 = load32(b->ql + 64 * h), l1 = load32(b->ql + 64 * h + 32), qh = load32(b->qh + 32 * h);
            const __m256i a = z % 2 ? nib_hi(l0) : nib_lo(l0), c = z % 2 ? nib_hi(l1) : nib_lo(l1);
            u[z] = join(_mm256_or_si256(a, _mm256_slli_epi16(and3(qh, 2 * k), 4)),
                        _mm256_or_si256(c, _mm256_slli_epi16(and3(qh, 2 * k + 2), 4)));
        }
        const __m128i sc = _mm_loadu_si128((const __m128i *)b->scales);
        const int32_t sum = scaled_sum(u, lanes16(sc), x->qs, 0) - 32 * with_bsums(sc, x->bsums);
        s = cb_kq_step(s, x->d, _cvtsh_ss(b->d), sum, 0.0f, 0);
    }
    return s;
}

/* Q2_K / Q3_K: weights 64z.. are (qs[32 (z / 2)..] >> 2k) & 3, k = 2 (z % 2)
 * and k + 1 for the two halves; Q3_K's 3rd bit is bit 2z (2z + 1) of
 * hmask[0..31], q = that | bit << 2, less 4 through the sums of x. */
static float dot_q2_k(const void *w, const cb_block_q8_k *x, int n) {
    const cb_block_q2_k *b = w;
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, b++, x++) {
        __m512i u[4];
        for (int z = 0; z < 4; z++) {
            const __m256i q = load32(b->qs + 32 * (z / 2));
            u[z] = join(and3(q, 4 * (z % 2)), and3(q, 4 * (z % 2) + 2));
        }
        const __m128i s8 = _mm_loadu_si128((const __m128i *)b->scales);
        const __m128i sc = _mm_and_si128(s8, _mm_set1_epi8(0xF)), mn = _mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(0xF));
        s = cb_kq_step(s, x->d, _cvtsh_ss(b->d), scaled_sum(u, lanes16(sc), x->qs, 0), _cvtsh_ss(b->dmin),
                       with_bsums(mn, x->bsums));
    }
    return s;
}

static float dot_q3_k(const void *w, const cb_block_q8_k *x, int n) {
    const cb_block_q3_k *b = w;
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, b++, x++) {
        const __m128i scv = q3_scales(b->scales);
        const __m256i hm = load32(b->hmask);
        __m512i u[4];
        for (int z = 0; z < 4; z++) {
            const __m256i q = load32(b->qs + 32 * (z / 2));
            const __mmask64 bits = (__mmask64)has_bit(hm, 2 * z) | (__mmask64)has_bit(hm, 2 * z + 1) << 32;
            u[z] = _mm512_or_si512(join(and3(q, 4 * (z % 2)), and3(q, 4 * (z % 2) + 2)),
                                   _mm512_maskz_mov_epi8(bits, _mm512_set1_epi8(4)));
        }
        const int32_t sum = scaled_sum(u, lanes16(scv), x->qs, 0) - 4 * with_bsums(scv, x->bsums);
        s = cb_kq_step(s, x->d, _cvtsh_ss(b->d), sum, 0.0f, 0);
    }
    return s;
}

/* x's eight per-32 sums (the per-16 bsums added in pairs), as words. */
static inline __attribute__((always_inline)) __m128i per32_sums(const cb_block_q8_k *x) {
    return _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)x->bsums), _mm_loadu_si128((const __m128i *)x->bsums + 1));
}
/* x's 256 bytes for registers whose 128-bit lane g holds 32-weight group g
 * of qs[64h..] (IQ4_XS): out[2h] the groups' first 16 bytes (4h..4h + 3),
 * out[2h + 1] their last 16. */
static inline __attribute__((always_inline)) void x_by_group(const int8_t *qs, __m512i out[4]) {
    const __m512i xa = _mm512_loadu_si512((const void *)qs), xb = _mm512_loadu_si512((const void *)(qs + 64));
    const __m512i xc = _mm512_loadu_si512((const void *)(qs + 128)), xd = _mm512_loadu_si512((const void *)(qs + 192));
    out[0] = _mm512_shuffle_i32x4(xa, xb, 0x88), out[1] = _mm512_shuffle_i32x4(xa, xb, 0xDD);
    out[2] = _mm512_shuffle_i32x4(xc, xd, 0x88), out[3] = _mm512_shuffle_i32x4(xc, xd, 0xDD);
}

/* The high nibbles of q's bytes (low4: 0x0F bytes in scope). With VNNI and
 * GFNI one gf2p8affineqb (bit 4 + i to bit i, a 0x00..0x0F byte out), a
 * shift and mask less (figures: the commit). */
#if KQ_VNNI && defined(__GFNI__) && !defined(CB_SIMDE)
#define HI_NIB(q) _mm512_gf2p8affine_epi64_epi8(q, _mm512_set1_epi64(0x1020408000000000LL), 0)
#else
#define HI_NIB(q) _mm512_and_si512(_mm512_srli_epi16(q, 4), low4)
#endif
#if KQ_VNNI
/* IQ4_XS with VNNI: group g of qs[64h..] in lane g (low nibbles its first
 * 16 weights, high ones its last 16), x permuted to match; levels + 128
 * (unsigned) into vpdpbusd, times the group's scale less 32 (vpmulld), the
 * 128 off through x's per-32 sums (dot4_iq4_xs_vnni's way, one row). */
static float dot_iq4_xs(const void *w, const cb_block_q8_k *x, int n) {
    static const int32_t pick[2][16] __attribute__((aligned(64))) = {
#define L4(g) g, g, g, g
        {L4(0), L4(1), L4(2), L4(3)}, {L4(4), L4(5), L4(6), L4(7)},
#undef L4
    };
    const cb_block_iq4_xs *b = w;
    const __m512i book = _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)cb_iq4nl_values)),
                                          _mm512_set1_epi8((char)0x80)); /* level + 128 */
    const __m512i low4 = _mm512_set1_epi8(0xF);
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, b++, x++) {
        const __m128i sc8 = _mm_sub_epi8(_mm_cvtsi64_si128((long long)cb_iq4xs_scales8((const uint8_t *)b)), _mm_set1_epi8(32));
        const __m512i sc32 = _mm512_castsi256_si512(_mm256_cvtepi8_epi32(sc8)); /* dwords 0..7 */
        const __m128i bs = per32_sums(x);
        __m128i m = _mm_madd_epi16(_mm_cvtepi8_epi16(sc8), bs);
        m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0x4E));
        m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0xB1));
        __m512i xs[4];
        x_by_group(x->qs, xs);
        __m512i acc = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            const __m512i q = _mm512_loadu_si512((const void *)(b->qs + 64 * h));
            const __m512i ul = _mm512_shuffle_epi8(book, _mm512_and_si512(q, low4));
            const __m512i uh = _mm512_shuffle_epi8(book, HI_NIB(q));
            const __m512i g = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ul, xs[2 * h]), uh, xs[2 * h + 1]);
            acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(g, _mm512_permutexvar_epi32(_mm512_load_si512(pick[h]), sc32)));
        }
        const int32_t sum = total512(acc) - 128 * _mm_cvtsi128_si32(m);
        s = cb_kq_step(s, x->d, _cvtsh_ss(b->d), sum, 0.0f, 0);
    }
    return s;
}
#else
/* IQ4_XS: group g (32 weights) is the codebook at nibbles(qs + 16g), signed;
 * its 6-bit scale less 32. */
static float dot_iq4_xs(const void *w, const cb_block_q8_k *x, int n) {
    const cb_block_iq4_xs *b = w;
    const __m512i book = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)cb_iq4nl_values));
    float s = 0;
    for (int i = 0; i < n / CB_QK_K; i++, b++, x++) {
        __m512i u[4];
        for (int z = 0; z < 4; z++)
            u[z] = _mm512_shuffle_epi8(book, nibbles_pair(b->qs + 32 * z, b->qs + 32 * z + 16));
        const __m128i sc8 = _mm_sub_epi8(_mm_cvtsi64_si128((long long)cb_iq4xs_scales8((const uint8_t *)b)), _mm_set1_epi8(32));
        s = cb_kq_step(s, x->d, _cvtsh_ss(b->d), scaled_sum(u, lanes16(_mm_unpacklo_epi8(sc8, sc8)), x->qs, 1), 0.0f, 0);
    }
    return s;
}
#endif

cb_dot_k_fn cb_dot_k_avx512(uint32_t dtype) {
    CB_DOT_K_DISPATCH(dtype);
}

/* ---- four rows at a time on q8_k (matmul.c's four-row path), the
 * 512-bit forms of kquants4_avx2.c: row i's result bit for bit the one-row
 * kernel's (the integer sums exact, the float step kquants4_avx2.c's
 * four-lane cb_kq_step). ---- */

/* acc + the int16 pairs of p times those of s, as int32 lanes (exact:
 * the products fit; vpdpwssd with VNNI). */
static inline __m512i madd_acc(__m512i acc, __m512i p, __m512i s) {
#if KQ_VNNI
    return _mm512_dpwssd_epi32(acc, p, s);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p, s));
#endif
}

/* cb_kq_step on four lanes: s + dx * (d * sum - dmin * mins), in the
 * scalar step's order (kquants4_avx2.c kq_step4). */
static inline __m128 kq_step4_512(__m128 s, float dx, __m128 d, __m128i sum, __m128 dmin, __m128i mins) {
    const __m128 vdx = _mm_set1_ps(dx);
    return _mm_fnmadd_ps(_mm_mul_ps(vdx, dmin), _mm_cvtepi32_ps(mins),
                         _mm_fmadd_ps(_mm_mul_ps(vdx, d), _mm_cvtepi32_ps(sum), s));
}

/* Four rows' int32 accumulators -> one vector whose 128-bit lane r holds
 * four partial sums of row r (the lanes folded, exact). */
static inline __m512i fold4(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
    const __m512i b01 = _mm512_add_epi32(_mm512_shuffle_i32x4(a0, a1, 0x44), _mm512_shuffle_i32x4(a0, a1, 0xEE));
    const __m512i b23 = _mm512_add_epi32(_mm512_shuffle_i32x4(a2, a3, 0x44), _mm512_shuffle_i32x4(a2, a3, 0xEE));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(b01, b23, 0x88), _mm512_shuffle_i32x4(b01, b23, 0xDD));
}
/* S and M with row r's partials in lane r -> row r's total of S in lane r
 * and of M in lane 4 + r. */
static inline __m256i totals4x2(__m512i s, __m512i m) {
    const __m512i p = _mm512_add_epi32(_mm512_unpacklo_epi64(s, m), _mm512_unpackhi_epi64(s, m));
    const __m512i q = _mm512_add_epi32(p, _mm512_ror_epi64(p, 32)); /* dword pairs swapped */
    return _mm512_castsi512_si256(
        _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0), q));
}

/* The four rows' addresses at p: in general registers (GCC's SLP otherwise
 * builds them in a vector and moves each out, some vector slots an
 * iteration; figures: the commit). */
static inline __attribute__((always_inline)) void rows4(const uint8_t *p, size_t row_bytes, const uint8_t *blk[4]) {
    __asm__("" : "+r"(p));
    blk[0] = p, blk[1] = p + row_bytes, blk[2] = p + 2 * row_bytes, blk[3] = p + 3 * row_bytes;
}
static inline uint32_t u32_of(const uint8_t *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    return u;
}
/* The 16 bytes at p[0..3] in the lanes of one vector. */
static inline __m512i lanes4(const uint8_t *const p[4]) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p[0]));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)p[1]), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)p[2]), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)p[3]), 3);
}
/* The fp16 pairs in dword 0 of each lane of v (d, dmin) as four floats each. */
static inline void halves_of_lanes(__m512i v, int dword, __m128 *lo, __m128 *hi) {
    const __m128i h = _mm512_castsi512_si128(_mm512_permutexvar_epi32(
        _mm512_setr_epi32(dword, dword + 4, dword + 8, dword + 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v));
    const __m256 f = _mm256_cvtph_ps(h);
    const __m128 f0 = _mm256_castps256_ps128(f), f1 = _mm256_extractf128_ps(f, 1);
    *lo = _mm_shuffle_ps(f0, f1, 0x88), *hi = _mm_shuffle_ps(f0, f1, 0xDD);
}

/* The next four rows (one stretch) spread over the super-blocks: four
 * blocks' bytes a super-block, in whole lines. A constant of the type (not
 * 4 * row_bytes / nb, a division a call), so the loop unrolls. With VNNI
 * into L2 (prefetcht1), not L1: one token from memory on an AMD EPYC, q6_k
 * 1.3-1.7x as fast (medians), the other K types as fast or faster; the maddubs forms
 * (no VNNI) up to 10% slower so (q3_k, q4_k; figures: the commit). */
static inline size_t prefetch_share4(size_t block) { return (4 * block + 63) / 64 * 64; }
static inline __attribute__((always_inline)) void prefetch_next4(const void *next, size_t share, int i) {
    if (!next) return;
    const uint8_t *p = (const uint8_t *)next + (size_t)i * share;
#pragma GCC unroll 16
    for (size_t o = 0; o < share; o += 64) {
#if KQ_VNNI
        cb_prefetch_l2(p + o);
#else
        cb_prefetch(p + o);
#endif
    }
}

#if KQ_VNNI
/* Sums p0 (rows 0, 1), p1 (rows 2, 3) whose 128-bit lanes hold (row a,
 * row a, row b, row b) partials, and m whose lanes 0, 1 hold rows 0, 1's
 * that way and lanes 2, 3 rows 2, 3's -> row r's total of the sums in dword
 * r, of m in dword 4 + r (as totals4x2(fold4(..), ..), fewer shuffles). */
static inline __m256i sums_and_mins(__m512i p0, __m512i p1, __m512i m) {
    const __m512i h = _mm512_add_epi32(_mm512_shuffle_i32x4(p0, p1, 0x44), _mm512_shuffle_i32x4(p0, p1, 0xEE));
    const __m512i even = _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(h), _mm512_castsi512_ps(m), 0x88));
    const __m512i odd = _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(h), _mm512_castsi512_ps(m), 0xDD));
    __m512i g = _mm512_add_epi32(even, odd); /* lane: sums of rows a, b, mins of rows a, b */
    g = _mm512_add_epi32(g, _mm512_shuffle_i32x4(g, g, 0xB1));
    return _mm512_castsi512_si256(
        _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 1, 8, 9, 2, 3, 10, 11, 0, 0, 0, 0, 0, 0, 0, 0), g));
}
/* kq_step4_512 with d, dmin in one vector and sum, mins in t (the same
 * operations lane for lane). */
static inline __m128 kq_step4x2(__m128 s, float dx, __m256 dd, __m256i t) {
    const __m256 m = _mm256_mul_ps(_mm256_set1_ps(dx), dd), tf = _mm256_cvtepi32_ps(t);
    return _mm_fnmadd_ps(_mm256_extractf128_ps(m, 1), _mm256_extractf128_ps(tf, 1),
                         _mm_fmadd_ps(_mm256_castps256_ps128(m), _mm256_castps256_ps128(tf), s));
}
/* vpermw controls: the mins of rows 0, 1 (scw[0]: words 8.., 24..) and 2, 3
 * (scw[1]: 40.., 56..), groups 4j.. in lane 2p + j; x's per-32 sums
 * (words 0..7) to match; d, dmin of a block's start (lane r of head). */
#define Q4(a) a, a + 1, a + 2, a + 3
static const int16_t pair_mins[32] __attribute__((aligned(64))) = {Q4(8), Q4(24), Q4(12), Q4(28), Q4(40), Q4(56), Q4(44), Q4(60)};
static const int16_t bs_pairs[32] __attribute__((aligned(64))) = {Q4(0), Q4(0), Q4(4), Q4(4), Q4(0), Q4(0), Q4(4), Q4(4)};
#undef Q4
static const int16_t d_dmin[32] __attribute__((aligned(64))) = {0, 8, 16, 24, 1, 9, 17, 25};
/* vpermw controls for q4_k / q5_k's packed pairs: register z's low half is
 * group gz (z: 0, 1, 4, 5 for z = 0..3), its high half gz + 2; words 0..3 of
 * a lane row 2p's scale (word g of scw[p]), 4..7 row 2p + 1's (word 16 + g). */
#define G4(g) g, g, g, g
#define LANE(g) G4(g), G4(16 + g)
#define PAIR(g) {LANE(g), LANE(g), LANE(g + 2), LANE(g + 2)}
static const int16_t pair_scales[4][32] __attribute__((aligned(64))) = {PAIR(0), PAIR(1), PAIR(4), PAIR(5)};
#undef PAIR
#undef LANE
#undef G4
#endif

/* pshufb controls: scale byte a as the words of the low half, b of the
 * high half (a lane's bytes 0..7: the eight scales). */
#define W2(a) a, -1
#define W8(a) W2(a), W2(a), W2(a), W2(a), W2(a), W2(a), W2(a), W2(a)
#define PICK2(a, b) {W8(a), W8(a), W8(b), W8(b)}

/* Q4_K / Q5_K, four rows: register pair z (0, 1) of a row is
 * qs[64z..64z + 63]: its low nibbles are groups 4z (low half) and 4z + 2
 * (high half), its high nibbles 4z + 1 and 4z + 3 (for q5 plus bit c of
 * qh[0..31], group c's, rotated to bit 4); x's groups permuted to match,
 * once for the four rows. The 16 bytes at a block's start (d, dmin, the 12
 * scale bytes) of the four rows in one vector, unpacked together. */
static inline __attribute__((always_inline)) void dot4_q45_k_512(const void *w, size_t row_bytes,
                                                                 const cb_block_q8_k *x, int n, float out[4],
                                                                 const void *next, int q5) {
    const size_t block = q5 ? sizeof(cb_block_q5_k) : sizeof(cb_block_q4_k);
    /* Rotations (in 64-bit lanes: what wraps lands off bit 4) of qh taking
     * bit c to bit 4, for the four registers' groups (low half, high half). */
    const __m512i rot0 = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2), rot1 = _mm512_setr_epi64(3, 3, 3, 3, 1, 1, 1, 1);
    const __m512i rot2 = _mm512_setr_epi64(0, 0, 0, 0, 62, 62, 62, 62), rot3 = _mm512_setr_epi64(63, 63, 63, 63, 61, 61, 61, 61);
    const __m512i bit4 = _mm512_set1_epi8(0x10);
#if !KQ_VNNI
    static const int8_t pick[4][64] __attribute__((aligned(64))) = {PICK2(0, 2), PICK2(1, 3), PICK2(4, 6), PICK2(5, 7)};
#endif
#if !KQ_VNNI
    static const int8_t pick_mn[64] __attribute__((aligned(64))) = {
#define M8 8, -1, 9, -1, 10, -1, 11, -1, 12, -1, 13, -1, 14, -1, 15, -1
        M8, M8, M8, M8
#undef M8
    };
#endif
    const __m512i low4 = _mm512_set1_epi8(0xF);
#if !KQ_VNNI
    const __m512i p0 = _mm512_load_si512(pick[0]), p1 = _mm512_load_si512(pick[1]), p2 = _mm512_load_si512(pick[2]),
                  p3 = _mm512_load_si512(pick[3]);
#endif
#if !KQ_VNNI
    const __m512i pmn = _mm512_load_si512(pick_mn);
#endif
    /* Per lane (dwords h u0 u1 u2 of a block's start): sc_lo = u0 & 0x3F..,
     * sc_hi = u2 & 0x0F.. | (u0 >> 2) & 0x30.., mn_lo = u1 & 0x3F..,
     * mn_hi = (u2 >> 4) & 0x0F.. | (u1 >> 2) & 0x30.. */
    const __m512i m_lo6 = _mm512_set4_epi32(0, 0x3F3F3F3F, 0, 0x3F3F3F3F);
    const __m512i m_top = _mm512_set4_epi32(0x30303030, 0, 0x30303030, 0);
    const __m512i m_u2 = _mm512_set4_epi32(0x0F0F0F0F, 0, 0x0F0F0F0F, 0);
    const __m512i u2_shift = _mm512_set4_epi32(4, 0, 0, 0);
    /* pshufb controls (SIMDe lacks _mm512_shuffle_epi32): dwords 1 1 2 2, 3 3 3 3 of each lane. */
    const __m512i u0u0u1u1 = _mm512_set4_epi32(0x0B0A0908, 0x0B0A0908, 0x07060504, 0x07060504);
    const __m512i u2u2u2u2 = _mm512_set1_epi32(0x0F0E0D0C);
    const int nb = n / CB_QK_K;
    const size_t share = prefetch_share4(block);
    __m128 s = _mm_setzero_ps();
    for (int i = 0; i < nb; i++, x++) {
        prefetch_next4(next, share, i);
        const uint8_t *blk[4];
        rows4((const uint8_t *)w + (size_t)i * block, row_bytes, blk);
        const __m512i head = lanes4(blk);
        const __m512i v1 = _mm512_shuffle_epi8(head, u0u0u1u1);
        const __m512i v2 = _mm512_srlv_epi32(_mm512_shuffle_epi8(head, u2u2u2u2), u2_shift);
        const __m512i scmn = _mm512_ternarylogic_epi32(
            _mm512_srli_epi32(v1, 2), m_top,
            _mm512_ternarylogic_epi32(v1, m_lo6, _mm512_and_si512(v2, m_u2), 0xEA), 0xEA); /* (a & b) | c */
        /* bsums' per-32 sums (8 words), in every lane. */
        const __m128i bs = per32_sums(x);
#if !KQ_VNNI
        const __m512i mins = _mm512_madd_epi16(_mm512_shuffle_epi8(scmn, pmn), _mm512_broadcast_i32x4(bs));
#endif
        const __m512i xa = _mm512_loadu_si512((const void *)x->qs), xb = _mm512_loadu_si512((const void *)(x->qs + 64));
        const __m512i xc = _mm512_loadu_si512((const void *)(x->qs + 128)), xd = _mm512_loadu_si512((const void *)(x->qs + 192));
        const __m512i x0 = _mm512_shuffle_i32x4(xa, xb, 0x44), x1 = _mm512_shuffle_i32x4(xa, xb, 0xEE);
        const __m512i x2 = _mm512_shuffle_i32x4(xc, xd, 0x44), x3 = _mm512_shuffle_i32x4(xc, xd, 0xEE);
        __m512i u[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const cb_block_q5_k *k5 = (const cb_block_q5_k *)blk[r];
            const uint8_t *qs = q5 ? k5->qs : ((const cb_block_q4_k *)k5)->qs;
            const __m512i q0 = _mm512_loadu_si512((const void *)qs), q1 = _mm512_loadu_si512((const void *)(qs + 64));
            u[r][0] = _mm512_and_si512(q0, low4), u[r][1] = HI_NIB(q0);
            u[r][2] = _mm512_and_si512(q1, low4), u[r][3] = HI_NIB(q1);
            if (q5) { /* u | (rotated qh & 0x10) */
                const __m512i qh = _mm512_broadcast_i64x4(load32(k5->qh));
                u[r][0] = _mm512_ternarylogic_epi32(u[r][0], _mm512_rolv_epi64(qh, rot0), bit4, 0xF8);
                u[r][1] = _mm512_ternarylogic_epi32(u[r][1], _mm512_rolv_epi64(qh, rot1), bit4, 0xF8);
                u[r][2] = _mm512_ternarylogic_epi32(u[r][2], _mm512_rolv_epi64(qh, rot2), bit4, 0xF8);
                u[r][3] = _mm512_ternarylogic_epi32(u[r][3], _mm512_rolv_epi64(qh, rot3), bit4, 0xF8);
            }
        }
#if KQ_VNNI
        /* Rows 2p, 2p + 1 together: vpdpbusd's lanes (four products, at most
         * 4 * 31 * 128: int16) of the two rows packed to words, lane k's
         * words 0..3 row 2p's, 4..7 row 2p + 1's, each pair one group's of
         * one row; vpdpwssd then adds scale * pair straight to int32 lanes
         * (no per-register scale shuffles; figures: the commit). */
        /* 6-bit: sign extension is zero extension (SIMDe lacks cvtepu8_epi16) */
        const __m512i scw[2] = {_mm512_cvtepi8_epi16(_mm512_castsi512_si256(scmn)),
                                _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(scmn, 1))};
        const __m512i xz[4] = {x0, x1, x2, x3};
        __m512i acc2[2];
#pragma GCC unroll 2
        for (int p = 0; p < 2; p++) {
            __m512i a = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int z = 0; z < 4; z++) {
                const __m512i e = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[2 * p][z], xz[z]);
                const __m512i o = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[2 * p + 1][z], xz[z]);
                a = _mm512_dpwssd_epi32(a, _mm512_packs_epi32(e, o),
                                        _mm512_permutexvar_epi16(_mm512_load_si512(pair_scales[z]), scw[p]));
            }
            acc2[p] = a;
        }
        /* The mins' sums with x's per-32 sums in the same pair layout:
         * lane 2p + j, rows 2p (dwords 0, 1) and 2p + 1 (2, 3), groups 4j... */
        const __m512i mnw = _mm512_permutex2var_epi16(scw[0], _mm512_load_si512(pair_mins), scw[1]);
        const __m512i bsw = _mm512_permutexvar_epi16(_mm512_load_si512(bs_pairs), _mm512_castsi128_si512(bs));
        const __m256i t = sums_and_mins(acc2[0], acc2[1], _mm512_madd_epi16(mnw, bsw));
        /* d, dmin of the four rows: words 8r, 8r + 1 of head. */
        const __m256 dd = _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi16(_mm512_load_si512(d_dmin), head)));
        s = kq_step4x2(s, x->d, dd, t);
#else
        __m512i acc[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __m512i sc = _mm512_shuffle_i32x4(scmn, scmn, r * 0x55);
            __m512i a = _mm512_madd_epi16(_mm512_maddubs_epi16(u[r][0], x0), _mm512_shuffle_epi8(sc, p0));
            a = madd_acc(a, _mm512_maddubs_epi16(u[r][1], x1), _mm512_shuffle_epi8(sc, p1));
            a = madd_acc(a, _mm512_maddubs_epi16(u[r][2], x2), _mm512_shuffle_epi8(sc, p2));
            acc[r] = madd_acc(a, _mm512_maddubs_epi16(u[r][3], x3), _mm512_shuffle_epi8(sc, p3));
        }
        const __m256i t = totals4x2(fold4(acc[0], acc[1], acc[2], acc[3]), mins);
        __m128 d, dmin;
        halves_of_lanes(head, 0, &d, &dmin);
        s = kq_step4_512(s, x->d, d, _mm256_castsi256_si128(t), dmin, _mm256_extracti128_si256(t, 1));
#endif
    }
    _mm_storeu_ps(out, s);
}
static void dot4_q4_k_512(const void *w, size_t row_bytes, const cb_block_q8_k *x, int n, float out[4],
                          const void *next) {
    dot4_q45_k_512(w, row_bytes, x, n, out, next, 0);
}
static void dot4_q5_k_512(const void *w, size_t row_bytes, const cb_block_q8_k *x, int n, float out[4],
                          const void *next) {
    dot4_q45_k_512(w, row_bytes, x, n, out, next, 1);
}
#undef PICK2
#undef W8
#undef W2

/* vpermw controls: word 16 (r % 2) + 4z + lane is group 4z + lane of row r's
 * 16 scales (two rows' scales as words in one vector): a product whose
 * 128-bit lanes are register z's four 16-weight groups (Q6_K without VNNI). */
#if !KQ_VNNI
static const int16_t pick16[2][4][32] __attribute__((aligned(64))) = {
#define L8(g) g, g, g, g, g, g, g, g
#define Z(o, z) {L8(o + 4 * z), L8(o + 4 * z + 1), L8(o + 4 * z + 2), L8(o + 4 * z + 3)}
    {Z(0, 0), Z(0, 1), Z(0, 2), Z(0, 3)},
    {Z(16, 0), Z(16, 1), Z(16, 2), Z(16, 3)},
#undef Z
#undef L8
};
#endif

/* vpermw controls for Q2_K / Q3_K's registers u_k = (qs[0..63] >> 2k) & 3
 * (k = 0..3, immediate shifts): bytes 0..31 are weights 32k.., bytes 32..63
 * weights 128 + 32k.., so lane l is 16-weight group 2k + l % 2 + 8 (l / 2);
 * word 16 (r % 2) + that group of two rows' scales as words. (With VNNI
 * the kernels after Q6_K's.) */
#if !KQ_VNNI
static const int16_t pick_k2[2][4][32] __attribute__((aligned(64))) = {
#define L8(g) g, g, g, g, g, g, g, g
#define K(o, k) {L8(o + 2 * k), L8(o + 2 * k + 1), L8(o + 2 * k + 8), L8(o + 2 * k + 9)}
    {K(0, 0), K(0, 1), K(0, 2), K(0, 3)},
    {K(16, 0), K(16, 1), K(16, 2), K(16, 3)},
#undef K
#undef L8
};
#endif

/* The fp16 pair of the dword at each of p[0..3] as four floats each. */
static inline void dword_halves4(const uint8_t *const p[4], __m128 *lo, __m128 *hi) {
    __m128i dw = _mm_cvtsi32_si128((int)u32_of(p[0]));
    dw = _mm_insert_epi32(dw, (int)u32_of(p[1]), 1);
    dw = _mm_insert_epi32(dw, (int)u32_of(p[2]), 2);
    dw = _mm_insert_epi32(dw, (int)u32_of(p[3]), 3);
    const __m256 f = _mm256_cvtph_ps(dw);
    const __m128 f0 = _mm256_castps256_ps128(f), f1 = _mm256_extractf128_ps(f, 1);
    *lo = _mm_shuffle_ps(f0, f1, 0x88), *hi = _mm_shuffle_ps(f0, f1, 0xDD);
}

/* x's 32k.. and 128 + 32k.. as one register (u_k's weights), k = 0..3. */
static inline void x_k2(const int8_t *xqs, __m512i xk[4]) {
    for (int k = 0; k < 4; k++) xk[k] = join(load32(xqs + 32 * k), load32(xqs + 128 + 32 * k));
}

/* Row r's offsets (c . bsums per row, c: two rows' coefficients as words in
 * c01, c23) in lane r's four dwords, the layout of fold4. */
static inline __m512i bsums4(__m512i c01, __m512i c23, const int16_t *bsums) {
    const __m512i bs = _mm512_broadcast_i64x4(load32(bsums));
    const __m512i m01 = _mm512_madd_epi16(c01, bs), m23 = _mm512_madd_epi16(c23, bs);
    return _mm512_add_epi32(_mm512_shuffle_i32x4(m01, m23, 0x88), _mm512_shuffle_i32x4(m01, m23, 0xDD));
}

/* Q3_K's scales of four rows, from the 16 bytes ending each block (lane r
 * row r's: qs' last 2 bytes, the 12 scale bytes, d): the 16 scales (less
 * 32) as bytes, lane r row r's. Of the dwords u0 u1 u2 of scale bytes,
 * [u0 u1 u0 >> 4 u1 >> 4] & 0x0F.. | ([u2 u2 >> 2 u2 >> 4 u2 >> 6] & 0x03..)
 * << 4 (rotations: what wraps is masked off); kquants_x86.h q3_scales. */
static inline __m512i q3_scales4(__m512i tail) {
    /* pshufb controls: the scale dwords (bytes 2..13) u0 u1 u0 u1 and u2 four times. */
    const __m512i u0u1u0u1 = _mm512_set4_epi32(0x09080706, 0x05040302, 0x09080706, 0x05040302);
    const __m512i u2x4 = _mm512_set1_epi32(0x0D0C0B0A);
    const __m512i lo_shift = _mm512_set4_epi32(4, 4, 0, 0), hi_rot = _mm512_set4_epi32(30, 0, 2, 4);
    const __m512i lo = _mm512_srlv_epi32(_mm512_shuffle_epi8(tail, u0u1u0u1), lo_shift);
    const __m512i hi = _mm512_rolv_epi32(_mm512_shuffle_epi8(tail, u2x4), hi_rot);
    return _mm512_sub_epi8(_mm512_ternarylogic_epi32(lo, _mm512_set1_epi8(0xF), _mm512_and_si512(hi, _mm512_set1_epi8(0x30)), 0xEA),
                           _mm512_set1_epi8(32)); /* (a & b) | c */
}

#if !KQ_VNNI
/* Q3_K, four rows: u_k (pick_k2's registers) with the 3rd bit: hmask's bit
 * k for bytes 0..31, bit 4 + k for bytes 32..63 (hmask beside hmask >> 4),
 * moved to bit 2 by an immediate shift; unsigned 0..7, the 4 off through
 * the sums of x; the four rows' scales by q3_scales4. */
static void dot4_q3_k_512(const void *w, size_t row_bytes, const cb_block_q8_k *x, int n, float out[4],
                          const void *next) {
    const __m512i three = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    const int nb = n / CB_QK_K;
    const size_t share = prefetch_share4(sizeof(cb_block_q3_k));
    __m128 s = _mm_setzero_ps();
    for (int i = 0; i < nb; i++, x++) {
        prefetch_next4(next, share, i);
        const uint8_t *rp[4];
        rows4((const uint8_t *)w + (size_t)i * sizeof(cb_block_q3_k), row_bytes, rp);
        const cb_block_q3_k *b[4] = {(const void *)rp[0], (const void *)rp[1], (const void *)rp[2], (const void *)rp[3]};
        const uint8_t *end[4];
        for (int r = 0; r < 4; r++) end[r] = (const uint8_t *)(b[r] + 1) - 16;
        const __m512i tail = lanes4(end); /* qs' last 2 bytes, the 12 scale bytes, d */
        const __m512i sc8 = q3_scales4(tail);
        const __m512i sc01 = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(sc8));
        const __m512i sc23 = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(sc8, 1));
        const __m512i offs = bsums4(sc01, sc23, x->bsums);
        __m512i xk[4];
        x_k2(x->qs, xk);
        __m512i acc[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __m512i sc = r < 2 ? sc01 : sc23;
            const __m256i h = load32(b[r]->hmask);
            const __m512i hm = join(h, _mm256_srli_epi16(h, 4));
            const __m512i q = _mm512_loadu_si512((const void *)b[r]->qs);
            __m512i a = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                /* bit k of hm to bit 2 (16-bit lanes: bit 2 of a byte takes bit k of the same byte) */
                const __m512i hb = k < 2 ? _mm512_slli_epi16(hm, 2 - k) : k == 2 ? hm : _mm512_srli_epi16(hm, 1);
                const __m512i u = _mm512_ternarylogic_epi32(_mm512_and_si512(k ? _mm512_srli_epi16(q, 2 * k) : q, three), hb,
                                                            four, 0xF8); /* a | (b & c) */
                a = madd_acc(a, _mm512_maddubs_epi16(u, xk[k]), _mm512_permutexvar_epi16(_mm512_load_si512(pick_k2[r % 2][k]), sc));
            }
            acc[r] = a;
        }
        const __m256i t = totals4x2(fold4(acc[0], acc[1], acc[2], acc[3]), offs);
        const __m128i sum = _mm_sub_epi32(_mm256_castsi256_si128(t), _mm_slli_epi32(_mm256_extracti128_si256(t, 1), 2));
        __m128 unused, d;
        halves_of_lanes(tail, 3, &unused, &d);
        s = kq_step4_512(s, x->d, d, sum, _mm_setzero_ps(), _mm_setzero_si128());
    }
    _mm_storeu_ps(out, s);
}

/* Q2_K, four rows: u_k (pick_k2's registers), unsigned 0..3; the scales
 * (low nibbles of the 16 bytes starting a block) by vpermw, the mins (high
 * nibbles) against the sums of x; d and dmin per row as cb_kq_step takes. */
static void dot4_q2_k_512(const void *w, size_t row_bytes, const cb_block_q8_k *x, int n, float out[4],
                          const void *next) {
    const __m512i three = _mm512_set1_epi8(3), low4 = _mm512_set1_epi8(0xF);
    const int nb = n / CB_QK_K;
    const size_t share = prefetch_share4(sizeof(cb_block_q2_k));
    __m128 s = _mm_setzero_ps();
    for (int i = 0; i < nb; i++, x++) {
        prefetch_next4(next, share, i);
        const cb_block_q2_k *b[4];
        const uint8_t *head[4], *dd[4];
        for (int r = 0; r < 4; r++) {
            b[r] = (const cb_block_q2_k *)((const uint8_t *)w + (size_t)r * row_bytes + (size_t)i * sizeof(cb_block_q2_k));
            head[r] = b[r]->scales, dd[r] = (const uint8_t *)&b[r]->d;
        }
        const __m512i v = lanes4(head);
        const __m512i sc8 = _mm512_and_si512(v, low4), mn8 = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        /* nibbles: sign extension is zero extension (SIMDe lacks cvtepu8_epi16) */
        const __m512i sc01 = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(sc8));
        const __m512i sc23 = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(sc8, 1));
        const __m512i mins = bsums4(_mm512_cvtepi8_epi16(_mm512_castsi512_si256(mn8)),
                                    _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(mn8, 1)), x->bsums);
        __m512i xk[4];
        x_k2(x->qs, xk);
        __m512i acc[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __m512i sc = r < 2 ? sc01 : sc23;
            const __m512i q = _mm512_loadu_si512((const void *)b[r]->qs);
            __m512i a = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m512i u = _mm512_and_si512(k ? _mm512_srli_epi16(q, 2 * k) : q, three);
                a = madd_acc(a, _mm512_maddubs_epi16(u, xk[k]), _mm512_permutexvar_epi16(_mm512_load_si512(pick_k2[r % 2][k]), sc));
            }
            acc[r] = a;
        }
        const __m256i t = totals4x2(fold4(acc[0], acc[1], acc[2], acc[3]), mins);
        __m128 d, dmin;
        dword_halves4(dd, &d, &dmin);
        s = kq_step4_512(s, x->d, d, _mm256_castsi256_si128(t), dmin, _mm256_extracti128_si256(t, 1));
    }
    _mm_storeu_ps(out, s);
}
#endif

/* The eight 6-bit scales of each lane's IQ4_XS block (lane r: row r's
 * block start; qword 0 holds d, scales_h, scales_l) as bytes 0..7 of the
 * lane, 0..63, 32 not yet subtracted. With VBMI two vpmultishiftqb (scale
 * g's low nibble from bit 32 + 4g, its top bits from bit 16 + 2g, brought
 * to bits 4..5); else byte shuffles and shifts: scales_l byte g / 2 to byte
 * g (odd bytes shifted down 4), scales_h to words j = 0..3 shifted down 4j,
 * its fields 2j and 2j + 1 to bits 4..5 of bytes 2j and 2j + 1. */
static inline __m512i iq4xs_scales_of_lanes(__m512i head) {
#if defined(__AVX512VBMI__) && !defined(CB_SIMDE) /* the SIMDe check takes the other way */
    const __m512i lo = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x3C3834302C282420LL), head);
    const __m512i hi = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x1A18161412100E0CLL), head);
#else
    const __mmask64 odd = 0xAAAAAAAAAAAAAAAAull;
    const __m512i l = _mm512_shuffle_epi8(head, _mm512_set4_epi32(-1, -1, 0x07070606, 0x05050404));
    const __m512i lo = _mm512_mask_blend_epi8(odd, l, _mm512_srli_epi16(l, 4));
    const __m512i h = _mm512_srlv_epi16(_mm512_shuffle_epi8(head, _mm512_set4_epi32(-1, -1, 0x03020302, 0x03020302)),
                                        _mm512_set4_epi32(0, 0, 0x000C0008, 0x00040000));
    const __m512i hi = _mm512_mask_blend_epi8(odd, _mm512_slli_epi16(h, 4), _mm512_slli_epi16(h, 10));
#endif
    return _mm512_ternarylogic_epi32(lo, _mm512_set1_epi8(0x0F), _mm512_and_si512(hi, _mm512_set1_epi8(0x30)), 0xEA);
}

#if !KQ_VNNI /* with VNNI: dot4_iq4_xs_vnni */
/* IQ4_XS, four rows: of qs[0..63] (qs[64..127]) the low nibbles are the
 * first 16 weights of groups 0..3 (4..7), a group a 128-bit lane, the high
 * nibbles their last 16; x permuted to match, once for the four rows. The
 * levels as magnitudes (|codebook|) against x negated where the level is
 * negative (nibble < 8), so maddubs' pairs stay within int16 (2 * 127 *
 * 127); each lane's scale (less 32) by vpermw from the rows' scales as words. */
static void dot4_iq4_xs_512(const void *w, size_t row_bytes, const cb_block_q8_k *x, int n, float out[4],
                            const void *next) {
    static const int8_t mag[16] = {127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113};
    /* Word 8r + l (first half of the groups) or 8r + 4 + l (second) in lane l. */
    static const int16_t pick[4][2][32] __attribute__((aligned(64))) = {
#define L8(g) g, g, g, g, g, g, g, g
#define P(r, o) {L8(8 * r + o), L8(8 * r + o + 1), L8(8 * r + o + 2), L8(8 * r + o + 3)}
        {P(0, 0), P(0, 4)}, {P(1, 0), P(1, 4)}, {P(2, 0), P(2, 4)}, {P(3, 0), P(3, 4)},
#undef P
#undef L8
    };
    const __m512i book = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)mag));
    const __m512i low4 = _mm512_set1_epi8(0xF);
    const int nb = n / CB_QK_K;
    const size_t share = prefetch_share4(sizeof(cb_block_iq4_xs));
    __m128 s = _mm_setzero_ps();
    for (int i = 0; i < nb; i++, x++) {
        prefetch_next4(next, share, i);
        const uint8_t *rp[4];
        rows4((const uint8_t *)w + (size_t)i * sizeof(cb_block_iq4_xs), row_bytes, rp);
        const cb_block_iq4_xs *b[4] = {(const void *)rp[0], (const void *)rp[1], (const void *)rp[2], (const void *)rp[3]};
        /* The four rows' scales (bytes of a lane's low qword) as words, lane r row r's. */
        const __m512i head = lanes4(rp);
        const __m512i sc8 = _mm512_sub_epi8(iq4xs_scales_of_lanes(head), _mm512_set1_epi8(32));
        const __m512i sc = _mm512_srai_epi16(_mm512_unpacklo_epi8(sc8, sc8), 8);
        __m512i xs[4];
        x_by_group(x->qs, xs);
        __m512i nx[4];
        for (int k = 0; k < 4; k++) nx[k] = _mm512_sub_epi8(_mm512_setzero_si512(), xs[k]);
        __m512i acc[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            __m512i a = _mm512_setzero_si512();
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m512i q = _mm512_loadu_si512((const void *)(b[r]->qs + 64 * h));
                const __m512i sch = _mm512_permutexvar_epi16(_mm512_load_si512(pick[r][h]), sc);
                const __m512i lo = _mm512_and_si512(q, low4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
                /* levels >= 0 where the nibble's bit 3 is set: bytes' sign bits */
                const __m512i xl = _mm512_mask_blend_epi8(_mm512_movepi8_mask(_mm512_slli_epi16(q, 4)), nx[2 * h], xs[2 * h]);
                const __m512i xh = _mm512_mask_blend_epi8(_mm512_movepi8_mask(q), nx[2 * h + 1], xs[2 * h + 1]);
                a = madd_acc(a, _mm512_maddubs_epi16(_mm512_shuffle_epi8(book, lo), xl), sch);
                a = madd_acc(a, _mm512_maddubs_epi16(_mm512_shuffle_epi8(book, hi), xh), sch);
            }
            acc[r] = a;
        }
        const __m256i t = totals4x2(fold4(acc[0], acc[1], acc[2], acc[3]), _mm512_setzero_si512());
        __m128 d, unused;
        halves_of_lanes(head, 0, &d, &unused);
        s = kq_step4_512(s, x->d, d, _mm256_castsi256_si128(t), _mm_setzero_ps(), _mm_setzero_si128());
    }
    _mm_storeu_ps(out, s);
}
#endif

#if KQ_VNNI
/* IQ4_XS, four rows, with VNNI: as dot4_iq4_xs_512 (group g of qs[64h..]
 * in lane g, low nibbles against xs[2h], high against xs[2h + 1]) but the
 * levels + 128 (1..241, unsigned) go to vpdpbusd, eight products of one
 * group in an int32 lane, times the group's scale less 32 (vpmulld, the
 * scale in each dword of its lane); the 128 comes off once per block as
 * 128 * sum over g of scale(g) * (x's sum over group g), the four rows in
 * one madd. Every sum exact in int32 (|8 * 241 * 128 * 32| per lane), so
 * the bits are the one-row kernel's. */
static void dot4_iq4_xs_vnni(const void *w, size_t row_bytes, const cb_block_q8_k *x, int n, float out[4],
                             const void *next) {
    /* Dword lane g: scale of group 4h + g of row r % 2 (8 (r % 2) + 4h + g of a pair's dwords). */
    static const int32_t pick[2][2][16] __attribute__((aligned(64))) = {
#define L4(g) g, g, g, g
        {{L4(0), L4(1), L4(2), L4(3)}, {L4(4), L4(5), L4(6), L4(7)}},
        {{L4(8), L4(9), L4(10), L4(11)}, {L4(12), L4(13), L4(14), L4(15)}},
#undef L4
    };
    const __m512i book = _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)cb_iq4nl_values)),
                                          _mm512_set1_epi8((char)0x80)); /* level + 128 */
    const __m512i low4 = _mm512_set1_epi8(0xF);
    const int nb = n / CB_QK_K;
    const size_t share = prefetch_share4(sizeof(cb_block_iq4_xs));
    __m128 s = _mm_setzero_ps();
    for (int i = 0; i < nb; i++, x++) {
        prefetch_next4(next, share, i);
        const uint8_t *rp[4];
        rows4((const uint8_t *)w + (size_t)i * sizeof(cb_block_iq4_xs), row_bytes, rp);
        const cb_block_iq4_xs *b[4] = {(const void *)rp[0], (const void *)rp[1], (const void *)rp[2], (const void *)rp[3]};
        const __m512i head = lanes4(rp);
        /* The rows' scales less 32: 32 bytes, row r's at 8r; as dwords (rows 0, 1 and 2, 3) and as words. */
        const __m256i sc8 = _mm512_castsi512_si256(_mm512_permutexvar_epi64(
            _mm512_setr_epi64(0, 2, 4, 6, 0, 0, 0, 0),
            _mm512_sub_epi8(iq4xs_scales_of_lanes(head), _mm512_set1_epi8(32))));
        const __m512i sc32[2] = {lanes16(_mm256_castsi256_si128(sc8)), lanes16(_mm256_extracti128_si256(sc8, 1))};
        /* x's eight per-32 sums in every lane; lane r of m: row r's scale . sums, four partials */
        const __m128i bs = per32_sums(x);
        const __m512i m = _mm512_madd_epi16(_mm512_cvtepi8_epi16(sc8), _mm512_broadcast_i32x4(bs));
        __m512i xs[4];
        x_by_group(x->qs, xs);
        __m512i acc[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            __m512i a = _mm512_setzero_si512();
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m512i q = _mm512_loadu_si512((const void *)(b[r]->qs + 64 * h));
                const __m512i ul = _mm512_shuffle_epi8(book, _mm512_and_si512(q, low4));
                const __m512i uh = _mm512_shuffle_epi8(book, HI_NIB(q));
                const __m512i g = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ul, xs[2 * h]), uh,
                                                      xs[2 * h + 1]);
                const __m512i sc = _mm512_permutexvar_epi32(_mm512_load_si512(pick[r % 2][h]), sc32[r / 2]);
                a = _mm512_add_epi32(a, _mm512_mullo_epi32(g, sc));
            }
            acc[r] = a;
        }
        const __m256i t = totals4x2(_mm512_sub_epi32(fold4(acc[0], acc[1], acc[2], acc[3]), _mm512_slli_epi32(m, 7)),
                                    _mm512_setzero_si512());
        __m128 d, unused;
        halves_of_lanes(head, 0, &d, &unused);
        s = kq_step4_512(s, x->d, d, _mm256_castsi256_si128(t), _mm_setzero_ps(), _mm_setzero_si128());
    }
    _mm_storeu_ps(out, s);
}
#endif

#if KQ_VNNI
/* vpermw controls for Q6_K's packed pairs: register z's lane k is group
 * 4z + k; words 0..3 row 2p's scale (word 4z + k of the pair's scales), 4..7
 * row 2p + 1's (word 16 + 4z + k). */
#define G4(g) g, g, g, g
#define LANE(g) G4(g), G4(16 + g)
#define Z4(z) {LANE(4 * z), LANE(4 * z + 1), LANE(4 * z + 2), LANE(4 * z + 3)}
static const int16_t pair16[4][32] __attribute__((aligned(64))) = {Z4(0), Z4(1), Z4(2), Z4(3)};
#undef Z4
#undef LANE
#undef G4
/* The offset's operands: lane k's words 0..3 and 4..7 x's sums of groups
 * 4k.. (bs16_pairs, from the 16 sums), rows 2p and 2p + 1's scales of the
 * same groups (sc16_pairs, from a pair's scales as words). */
#define Q4(a) a, a + 1, a + 2, a + 3
static const int16_t bs16_pairs[32] __attribute__((aligned(64))) = {Q4(0), Q4(0), Q4(4), Q4(4), Q4(8), Q4(8), Q4(12), Q4(12)};
static const int16_t sc16_pairs[32] __attribute__((aligned(64))) = {Q4(0), Q4(16), Q4(4), Q4(20), Q4(8), Q4(24), Q4(12), Q4(28)};
#undef Q4
/* Row totals of p0 (rows 0, 1), p1 (rows 2, 3) whose 128-bit lanes hold
 * (row a, row a, row b, row b) partials. */
static inline __m128i pair_totals(__m512i p0, __m512i p1) {
    __m512i h = _mm512_add_epi32(_mm512_shuffle_i32x4(p0, p1, 0x44), _mm512_shuffle_i32x4(p0, p1, 0xEE));
    h = _mm512_add_epi32(h, _mm512_shuffle_i32x4(h, h, 0xB1)); /* lanes 0, 2 whole */
    h = _mm512_add_epi32(h, _mm512_ror_epi64(h, 32));           /* dwords 0, 2, 8, 10: the rows' */
    return _mm512_castsi512_si128(_mm512_permutexvar_epi32(_mm512_setr_epi32(0, 2, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), h));
}
#endif

/* Q6_K, four rows: register pair h (0, 1) of a row is ql[64h..64h + 63]:
 * its low nibbles are weights 128h..128h + 63 in order (qh[32h..] << 4, << 2
 * for bits 4..5 of the two halves), its high nibbles 128h + 64.. (qh, qh >>
 * 2), so x is four plain loads; each 128-bit lane of a product is one
 * 16-weight group, its scale broadcast by vpermw from two rows' scales as
 * words. The 32 off through the sums of x, once for two rows. */
static void dot4_q6_k_512(const void *w, size_t row_bytes, const cb_block_q8_k *x, int n, float out[4],
                          const void *next) {
    const __m512i low4 = _mm512_set1_epi8(0xF), bits45 = _mm512_set1_epi8(0x30);
    /* qh's 2-bit fields to bits 4..5 (shifts in 64-bit lanes: what crosses
     * a byte lands outside bits 4..5, masked off). */
    const __m512i lo_shift = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2), hi_shift = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    const int nb = n / CB_QK_K;
    const size_t share = prefetch_share4(sizeof(cb_block_q6_k));
    __m128 s = _mm_setzero_ps();
    for (int i = 0; i < nb; i++, x++) {
        prefetch_next4(next, share, i);
        const uint8_t *rp[4];
        rows4((const uint8_t *)w + (size_t)i * sizeof(cb_block_q6_k), row_bytes, rp);
        const cb_block_q6_k *b[4] = {(const void *)rp[0], (const void *)rp[1], (const void *)rp[2], (const void *)rp[3]};
        /* Rows 0, 1 and 2, 3's scales as words; their sums with x's per-16 sums. */
        const __m512i sc01 = _mm512_cvtepi8_epi16(_mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)b[0]->scales)), _mm_loadu_si128((const __m128i *)b[1]->scales), 1));
        const __m512i sc23 = _mm512_cvtepi8_epi16(_mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)b[2]->scales)), _mm_loadu_si128((const __m128i *)b[3]->scales), 1));
#if !KQ_VNNI
        const __m512i bsums = _mm512_broadcast_i64x4(load32(x->bsums));
        const __m512i m01 = _mm512_madd_epi16(sc01, bsums), m23 = _mm512_madd_epi16(sc23, bsums);
        const __m512i mins = _mm512_add_epi32(_mm512_shuffle_i32x4(m01, m23, 0x88), _mm512_shuffle_i32x4(m01, m23, 0xDD));
#endif
        __m512i xq[4];
        for (int z = 0; z < 4; z++) xq[z] = _mm512_loadu_si512((const void *)(x->qs + 64 * z));
        __m512i u[4][4]; /* row r's weights 64z.., unsigned 0..63 */
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m512i ql = _mm512_loadu_si512((const void *)(b[r]->ql + 64 * h));
                const __m512i qh = _mm512_broadcast_i64x4(load32(b[r]->qh + 32 * h));
                u[r][2 * h] = _mm512_ternarylogic_epi32(_mm512_and_si512(ql, low4), _mm512_sllv_epi64(qh, lo_shift), bits45, 0xF8);
                u[r][2 * h + 1] = _mm512_ternarylogic_epi32(HI_NIB(ql), _mm512_srlv_epi64(qh, hi_shift), bits45, 0xF8); /* a | (b & c) */
            }
#if KQ_VNNI
        /* As q4_k's: vpdpbusd lanes (at most 4 * 63 * 128 = 32256: int16)
         * of rows 2p, 2p + 1 packed to words, vpdpwssd against the groups'
         * scales (figures: the commit). */
        /* The accumulators start at the 32 off: -32 scale(g) * (x's sum over
         * group g) in the same layout (x's 16 sums, lane k's words 0..3
         * and 4..7 those of groups 4k..; the scales as in pair16[0]). */
        const __m512i bsw = _mm512_permutexvar_epi16(_mm512_load_si512(bs16_pairs), _mm512_castsi256_si512(load32(x->bsums)));
        __m512i acc2[2];
#pragma GCC unroll 2
        for (int p = 0; p < 2; p++) {
            const __m512i sc = p ? sc23 : sc01;
            __m512i a = _mm512_madd_epi16(
                bsw, _mm512_permutexvar_epi16(_mm512_load_si512(sc16_pairs), _mm512_mullo_epi16(sc, _mm512_set1_epi16(-32))));
#pragma GCC unroll 4
            for (int z = 0; z < 4; z++) {
                const __m512i e = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[2 * p][z], xq[z]);
                const __m512i o = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[2 * p + 1][z], xq[z]);
                a = _mm512_dpwssd_epi32(a, _mm512_packs_epi32(e, o),
                                        _mm512_permutexvar_epi16(_mm512_load_si512(pair16[z]), sc));
            }
            acc2[p] = a;
        }
        const __m128i sum = pair_totals(acc2[0], acc2[1]);
        /* d: the last word of the 16 bytes ending at its end, in each lane. */
        const uint8_t *dend[4] = {(const uint8_t *)&b[0]->d - 14, (const uint8_t *)&b[1]->d - 14,
                                  (const uint8_t *)&b[2]->d - 14, (const uint8_t *)&b[3]->d - 14};
        const __m128 d = _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi16(
            _mm512_setr_epi32(0x000F0007, 0x001F0017, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), lanes4(dend))));
        s = kq_step4_512(s, x->d, d, sum, _mm_setzero_ps(), _mm_setzero_si128());
#else
        __m512i acc[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __m512i sc = r < 2 ? sc01 : sc23;
            __m512i a = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int z = 0; z < 4; z++)
                a = madd_acc(a, _mm512_maddubs_epi16(u[r][z], xq[z]),
                             _mm512_permutexvar_epi16(_mm512_load_si512(pick16[r % 2][z]), sc));
            acc[r] = a;
        }
        const __m256i t = totals4x2(fold4(acc[0], acc[1], acc[2], acc[3]), mins);
        const __m128i sum = _mm_sub_epi32(_mm256_castsi256_si128(t), _mm_slli_epi32(_mm256_extracti128_si256(t, 1), 5));
        /* d: the high halves of the dwords ending at its end. */
        __m128i dw = _mm_cvtsi32_si128((int)u32_of((const uint8_t *)&b[0]->d - 2));
        dw = _mm_insert_epi32(dw, (int)u32_of((const uint8_t *)&b[1]->d - 2), 1);
        dw = _mm_insert_epi32(dw, (int)u32_of((const uint8_t *)&b[2]->d - 2), 2);
        dw = _mm_insert_epi32(dw, (int)u32_of((const uint8_t *)&b[3]->d - 2), 3);
        const __m256 f = _mm256_cvtph_ps(dw);
        const __m128 d = _mm_shuffle_ps(_mm256_castps256_ps128(f), _mm256_extractf128_ps(f, 1), 0xDD);
        s = kq_step4_512(s, x->d, d, sum, _mm_setzero_ps(), _mm_setzero_si128());
#endif
    }
    _mm_storeu_ps(out, s);
}

#if KQ_VNNI
/* Q3_K / Q2_K, four rows, VNNI: register k of a row (k = 0..3) holds the
 * 2-bit fields k of qs[0..63] (bytes 0..31 weights 32k.., 32..63 weights
 * 128 + 32k..: x_k2's registers), so each 128-bit lane is one 16-weight
 * group, 2k + l % 2 + 8 (l / 2) in lane l. As q6_k's: vpdpbusd lanes (four
 * products, at most 4 * 7 * 128: int16) of rows 2p, 2p + 1 packed to words,
 * vpdpwssd against the groups' scales placed by one vpermw a register pair
 * (pair_k2: words 0..3 of lane l row 2p's scale, word g of the pair's
 * scales as words, 4..7 row 2p + 1's, word 16 + g). */
#define G4(g) g, g, g, g
#define LANE(g) G4(g), G4(16 + g)
#define K4(k) {LANE(2 * k), LANE(2 * k + 1), LANE(2 * k + 8), LANE(2 * k + 9)}
static const int16_t pair_k2[4][32] __attribute__((aligned(64))) = {K4(0), K4(1), K4(2), K4(3)};
#undef K4
#undef LANE
#undef G4
/* Field k (bits 2k, 2k + 1) of q's bytes as 0..3: with GFNI one
 * gf2p8affineqb (bit 2k + i to bit i; output bit i takes matrix byte 7 - i),
 * else a shift and a mask. */
#if defined(__GFNI__) && !defined(CB_SIMDE)
#define Q2_FIELD(q, k)                                                                                               \
    ((k) == 0 ? _mm512_and_si512(q, _mm512_set1_epi8(3))                                                             \
              : _mm512_gf2p8affine_epi64_epi8(                                                                       \
                    q, _mm512_set1_epi64((long long)((uint64_t)1 << (2 * (k) + 56) | (uint64_t)2 << (2 * (k) + 48))), 0))
#else
#define Q2_FIELD(q, k) _mm512_and_si512((k) ? _mm512_srli_epi16(q, 2 * (k)) : (q), _mm512_set1_epi8(3))
#endif

/* One pair's term for register k: rows a, b's fields ua, ub against xk. */
static inline __m512i pair_term(__m512i acc, __m512i ua, __m512i ub, __m512i xk, __m512i sc, int k) {
    const __m512i e = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ua, xk);
    const __m512i o = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ub, xk);
    return _mm512_dpwssd_epi32(acc, _mm512_packs_epi32(e, o), _mm512_permutexvar_epi16(_mm512_load_si512(pair_k2[k]), sc));
}

/* Q3_K: field k | the 3rd bit << 2 (unsigned 0..7); the 3rd bit is
 * hmask's bit k for bytes 0..31 and 4 + k for bytes 32..63: hmask beside
 * hmask >> 4, moved to bit 2 by an immediate shift (faster here than a
 * gf2p8affineqb of hmask in both halves, or a vprolvq of it; the commit).
 * The accumulators start at the 4 off: -4 scale(g) * (x's
 * sum over group g), in the pair layout (q6_k's bs16_pairs, sc16_pairs). */
static void dot4_q3_k_512(const void *w, size_t row_bytes, const cb_block_q8_k *x, int n, float out[4],
                          const void *next) {
    const int nb = n / CB_QK_K;
    const size_t share = prefetch_share4(sizeof(cb_block_q3_k));
    __m128 s = _mm_setzero_ps();
    for (int i = 0; i < nb; i++, x++) {
        prefetch_next4(next, share, i);
        const uint8_t *rp[4];
        rows4((const uint8_t *)w + (size_t)i * sizeof(cb_block_q3_k), row_bytes, rp);
        const uint8_t *end[4] = {rp[0] + sizeof(cb_block_q3_k) - 16, rp[1] + sizeof(cb_block_q3_k) - 16,
                                 rp[2] + sizeof(cb_block_q3_k) - 16, rp[3] + sizeof(cb_block_q3_k) - 16};
        const __m512i tail = lanes4(end); /* qs' last 2 bytes, the 12 scale bytes, d */
        const __m512i sc8 = q3_scales4(tail);
        const __m512i sc[2] = {_mm512_cvtepi8_epi16(_mm512_castsi512_si256(sc8)),
                               _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(sc8, 1))};
        /* -4 times x's per-16 sums (at most 4 * 16 * 128: int16), lane k's words 0..3 and 4..7 groups 4k.. */
        const __m512i bsw = _mm512_permutexvar_epi16(_mm512_load_si512(bs16_pairs), _mm512_castsi256_si512(load32(x->bsums)));
        const __m512i nbs = _mm512_sub_epi16(_mm512_setzero_si512(), _mm512_slli_epi16(bsw, 2));
        __m512i xk[4];
        x_k2(x->qs, xk);
        __m512i u[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const cb_block_q3_k *b = (const cb_block_q3_k *)rp[r];
            const __m512i q = _mm512_loadu_si512((const void *)b->qs);
            const __m256i h = load32(b->hmask);
            const __m512i hm = join(h, _mm256_srli_epi16(h, 4));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) { /* bit k of hm to bit 2 (a byte's bit 2 takes bit k of the same byte) */
                const __m512i hb = k < 2 ? _mm512_slli_epi16(hm, 2 - k) : k == 2 ? hm : _mm512_srli_epi16(hm, 1);
                u[r][k] = _mm512_ternarylogic_epi32(Q2_FIELD(q, k), hb, _mm512_set1_epi8(4), 0xF8); /* a | (b & c) */
            }
        }
        __m512i acc2[2];
#pragma GCC unroll 2
        for (int p = 0; p < 2; p++) {
            __m512i a = _mm512_madd_epi16(nbs, _mm512_permutexvar_epi16(_mm512_load_si512(sc16_pairs), sc[p]));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) a = pair_term(a, u[2 * p][k], u[2 * p + 1][k], xk[k], sc[p], k);
            acc2[p] = a;
        }
        /* d: word 7 of each lane of tail. */
        const __m128 d = _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi16(
            _mm512_setr_epi32(0x000F0007, 0x001F0017, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), tail)));
        s = kq_step4_512(s, x->d, d, pair_totals(acc2[0], acc2[1]), _mm_setzero_ps(), _mm_setzero_si128());
    }
    _mm_storeu_ps(out, s);
}

/* Q2_K: fields 0..3; the scales (low nibbles of the 16 bytes starting a
 * block) by pair_k2; the mins (high nibbles, bytes) against x's per-16
 * sums split into unsigned low and signed high bytes, two vpdpbusd (sum =
 * lo + 256 hi; fewer ops than vpermw'd words and madds: the commit), laid
 * out as sums_and_mins takes them; d and dmin as kq_step4x2 takes. */
static void dot4_q2_k_512(const void *w, size_t row_bytes, const cb_block_q8_k *x, int n, float out[4],
                          const void *next) {
    const __m512i low4 = _mm512_set1_epi8(0xF);
    const int nb = n / CB_QK_K;
    const size_t share = prefetch_share4(sizeof(cb_block_q2_k));
    __m128 s = _mm_setzero_ps();
    for (int i = 0; i < nb; i++, x++) {
        prefetch_next4(next, share, i);
        const uint8_t *rp[4];
        rows4((const uint8_t *)w + (size_t)i * sizeof(cb_block_q2_k), row_bytes, rp);
        const __m512i v = lanes4(rp); /* the 16 scale bytes, lane r row r's */
        /* nibbles: sign extension is zero extension (SIMDe lacks cvtepu8_epi16) */
        const __m512i sc8 = _mm512_and_si512(v, low4), mn8 = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        const __m512i sc[2] = {_mm512_cvtepi8_epi16(_mm512_castsi512_si256(sc8)),
                               _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(sc8, 1))};
        /* Lane 2p + j: rows 2p, 2p + 1's mins of groups 8j.. (a qword each),
         * against x's sums of the same groups (lane j % 2 of the broadcast
         * bsums), their low and high bytes twice. */
        const __m512i mnp = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 1, 3, 4, 6, 5, 7), mn8);
        const __m512i bsb = _mm512_broadcast_i64x4(load32(x->bsums));
        const __m512i lo = _mm512_shuffle_epi8(bsb, _mm512_set4_epi32(0x0E0C0A08, 0x06040200, 0x0E0C0A08, 0x06040200));
        const __m512i hi = _mm512_shuffle_epi8(bsb, _mm512_set4_epi32(0x0F0D0B09, 0x07050301, 0x0F0D0B09, 0x07050301));
        const __m512i mins = _mm512_add_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, mnp),
                                              _mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), mnp, hi), 8));
        __m512i xk[4];
        x_k2(x->qs, xk);
        __m512i u[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __m512i q = _mm512_loadu_si512((const void *)((const cb_block_q2_k *)rp[r])->qs);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) u[r][k] = Q2_FIELD(q, k);
        }
        __m512i acc2[2];
#pragma GCC unroll 2
        for (int p = 0; p < 2; p++) {
            __m512i a = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) a = pair_term(a, u[2 * p][k], u[2 * p + 1][k], xk[k], sc[p], k);
            acc2[p] = a;
        }
        /* d, dmin: the dwords at 80 (scalar loads: faster than a lanes4), as d0..d3 dmin0..dmin3 */
        __m128i dw = _mm_cvtsi32_si128((int)u32_of(rp[0] + offsetof(cb_block_q2_k, d)));
        dw = _mm_insert_epi32(dw, (int)u32_of(rp[1] + offsetof(cb_block_q2_k, d)), 1);
        dw = _mm_insert_epi32(dw, (int)u32_of(rp[2] + offsetof(cb_block_q2_k, d)), 2);
        dw = _mm_insert_epi32(dw, (int)u32_of(rp[3] + offsetof(cb_block_q2_k, d)), 3);
        const __m256 dd = _mm256_cvtph_ps(_mm_shuffle_epi8(dw, _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15)));
        s = kq_step4x2(s, x->d, dd, sums_and_mins(acc2[0], acc2[1], mins));
    }
    _mm_storeu_ps(out, s);
}
#undef Q2_FIELD
#endif

cb_dot4_k_fn cb_dot4_k_avx512(uint32_t dtype) {
    switch (dtype) {
    case CB_Q4_K: return dot4_q4_k_512;
    case CB_Q5_K: return dot4_q5_k_512;
    case CB_Q6_K: return dot4_q6_k_512;
    case CB_Q3_K: return dot4_q3_k_512;
#if KQ_VNNI
    case CB_IQ4_XS: return dot4_iq4_xs_vnni;
#else
    case CB_IQ4_XS: return dot4_iq4_xs_512;
#endif
    case CB_Q2_K: return dot4_q2_k_512;
    }
    return NULL;
}
