/* Helpers the x86 kernel families of the GGML block types share
 * (kquants_avx2.c, kquants4_avx2.c, kquants_gemm_avx2.c, kquants_avx512.c):
 * one definition for all. */
#ifndef CB_KQUANTS_X86_H
#define CB_KQUANTS_X86_H

/* After immintrin.h (or SIMDe's avx512.h, in the SIMDe check). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* 256-bit vpdpbusd where the compiler targets it: AVX-512 VNNI (with VL)
 * or AVX-VNNI. */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
#define CB_VNNI256 1
static inline __m256i cb_dpbusd256(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
}
#else
#define CB_VNNI256 0
#endif

/* Q3_K's 16 6-bit scales less 32, as bytes: group g's low nibble from byte
 * g % 8 (high nibble for g >= 8), top 2 bits from byte 8 + g % 4 at bit
 * 2 (g / 4); four groups to a word (a vector built from words: stored
 * bytes read back as a vector would stall store forwarding). */
static inline __m128i q3_scales(const uint8_t s[12]) {
    uint32_t a[3];
    memcpy(a, s, 12);
    const uint32_t lo4 = 0x0F0F0F0Fu, hi2 = 0x03030303u;
    const __m128i v = _mm_setr_epi32((int)((a[0] & lo4) | (a[2] & hi2) << 4),
                                     (int)((a[1] & lo4) | ((a[2] >> 2) & hi2) << 4),
                                     (int)(((a[0] >> 4) & lo4) | ((a[2] >> 4) & hi2) << 4),
                                     (int)(((a[1] >> 4) & lo4) | ((a[2] >> 6) & hi2) << 4));
    return _mm_sub_epi8(v, _mm_set1_epi8(32));
}

/* IQ4_XS's eight 6-bit scales of a block (its first 8 bytes: d, scales_h,
 * scales_l) as bytes 0..63, group g's in byte g: scales_l's nibble g and
 * scales_h's 2-bit field g spread a byte apart by shifts and masks (no
 * pdep: microcoded on some AVX2 CPUs). 32 not yet subtracted. */
static inline uint64_t cb_iq4xs_scales8(const uint8_t *blk) {
    uint16_t h;
    uint32_t l;
    memcpy(&h, blk + 2, 2);
    memcpy(&l, blk + 4, 4);
    uint64_t a = l, b = h;
    a = (a | a << 16) & 0x0000FFFF0000FFFFull;
    a = (a | a << 8) & 0x00FF00FF00FF00FFull;
    a = (a | a << 4) & 0x0F0F0F0F0F0F0F0Full;
    b = (b | b << 24) & 0x000000FF000000FFull;
    b = (b | b << 12) & 0x000F000F000F000Full;
    b = (b | b << 6) & 0x0303030303030303ull;
    return a | b << 4;
}

/* Q4_K / Q5_K's 12 packed scale bytes (kquants.c scale_min_k4) as the eight
 * 6-bit scales (bytes of *sc) and the eight mins (of *mn). Bytes 0..3 hold
 * scales 0..3 and, in bits 6..7, bits 4..5 of scales 4..7; bytes 4..7 the
 * same for the mins; bytes 8..11 the low 4 bits of scales 4..7 (low
 * nibbles) and mins 4..7. In 64-bit registers, a move each into a vector:
 * building one 128-bit vector of both slowed the one-row kernels. */
static inline void cb_q45_scales_mins(const uint8_t s[12], uint64_t *sc, uint64_t *mn) {
    uint32_t u[3];
    memcpy(u, s, 12);
    const uint32_t lo6 = 0x3F3F3F3Fu, lo4 = 0x0F0F0F0Fu, top2 = 0x30303030u;
    *sc = (uint64_t)(u[0] & lo6) | (uint64_t)((u[2] & lo4) | ((u[0] >> 2) & top2)) << 32;
    *mn = (uint64_t)(u[1] & lo6) | (uint64_t)(((u[2] >> 4) & lo4) | ((u[1] >> 2) & top2)) << 32;
}

/* The fp16 values at p, p + size, ..., p + 7 size (a field of eight blocks)
 * as floats, inserted one by one: eight 2-byte stores read back as 16 bytes
 * would stall store forwarding. */
static inline __m256 halves8(const uint8_t *p, size_t size) {
    uint16_t h[8];
    for (int j = 0; j < 8; j++) memcpy(&h[j], p + j * size, 2);
    return _mm256_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3], (short)h[4], (short)h[5],
                                          (short)h[6], (short)h[7]));
}

/* Eight int32 vectors -> their eight totals, vector j's in lane j. */
static inline __m256i totals8(const __m256i v[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* A 32-weight four-row kernel's prefetch of the next four rows (one
 * stretch of 4 nb blocks) in step with these: at blocks [i, i + 8) the lines
 * starting in their share of it, at the last eight the rest too (the tail
 * blocks', which b32_rest reads). Into L2, not L1: one token from memory,
 * q5_0 / q5_1 / iq4_nl 11.0-12.2 GB/s against 7.9-10.1 (AVX-512). */
static inline void cb_b32_prefetch_next(const void *next, size_t size, int i, int nb) {
    if (!next) return;
    const size_t lo = (size_t)i * 4 * size;
    const size_t hi = i + 2 * CB_B32_LANES > nb ? (size_t)nb * 4 * size : lo + (size_t)CB_B32_LANES * 4 * size;
    for (size_t o = (lo + 63) & ~(size_t)63; o < hi; o += 64) cb_prefetch_l2((const uint8_t *)next + o);
}

/* A 32-weight type's four-row and prompt entry points (the file's
 * always_inline dot4_b32 and tokens4_b32 with the type a constant):
 * dot4_NAME and tokens4_NAME, for its cb_dot4_block_* and
 * cb_tokens4_block_*. */
#define CB_B32_ENTRY_POINTS(name, type)                                                                                  \
    static void dot4_##name(const void *w, size_t row_bytes, const cb_block_q8_0 *x, int n, float out[4],              \
                            const void *next) {                                                                        \
        dot4_b32(type, w, row_bytes, x, n, out, next);                                                                 \
    }                                                                                                                  \
    static void tokens4_##name(const void *w, size_t row_bytes, const cb_block_q8_0 *const *xs, int n_tok, int n,      \
                               float *out, const void *next) {                                                         \
        tokens4_b32(type, w, row_bytes, xs, n_tok, n, out, next);                                                      \
    }

#endif
